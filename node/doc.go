// Package node runs a workmesh node's libp2p side: the host (QUIC first), its identity, the Kademlia DHT, signed NodeData records, the peer table, the health protocol and the local HTTP API.
package node
