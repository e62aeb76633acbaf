// Package access decides who may send this node work and how much: the
// allow list (accept-work-from, allow-peer) and the per-peer stream and
// rate limits. Access is the work server's protocol.PeerLimiter.
//
// It imports config, the workers vocabulary and libp2p's peer IDs; it
// must not import protocol (the server calls it through an interface).
package access
