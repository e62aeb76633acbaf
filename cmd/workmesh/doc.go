// Command workmesh runs and talks to a workmesh node: a peer-to-peer
// worker-dispatch node that joins a libp2p network, advertises what work it
// can do and sends submitted work to the best remote worker or its own.
//
// It is wiring only: each command parses its flags, loads config and calls
// into node, workers and selection; the rules of dispatch live in those
// packages, not here. It may import every workmesh package, and none imports
// it. The client commands (submit, peers, plan, status) reach a node only
// through its HTTP API, with the request and answer types that workers
// defines for that API.
package main
