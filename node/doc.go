// Package node runs a workmesh node's libp2p side: the host (QUIC first),
// its identity, the Kademlia DHT, signed NodeData records and their gossip,
// the peer table, the health and nodedata protocols, and the views of the
// local HTTP API. A Node is made of parts with a file each (host, records,
// membership, gossip, dht), started in that order and closed in reverse.
//
// node may import config, pubsub (the NodeData topic), selection (its
// Clock; selection is pure) and node/httpapi (the one HTTP server, on
// which node mounts /v1/info and /v1/peers and other packages mount theirs
// through HandleAPI). It must not import workers or cmd: what it needs of
// the dispatcher (LocalState, health checks, extra /v1/info fields) it
// takes through options defined here.
package node
