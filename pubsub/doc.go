// Package pubsub carries signed NodeData announcements over gossipsub: publishing, validating before delivery, and handing verified records to the peer table.
//
// pubsub may import libp2p (go-libp2p-pubsub and the core types) and config.
// It must not import node, workers or selection: node imports it, and it
// knows an announcement only as bytes that a Verifier handed to it by node
// checks, so the record format stays in node.
package pubsub
