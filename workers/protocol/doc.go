// Package protocol is the work wire, /workmesh/<network>/work/1.0.0: one
// request and its response at a time on a stream, and a stream reused for
// the next (protocol.go), length-prefixed and size-bounded before any
// allocation (codec.go, which also keeps the outcomes' wire bytes), served
// by Server from a pool.Pool and called by Client, which keeps a pool of
// streams per peer. The
// server's admission hooks are interfaces (PeerLimiter, Interceptor) that
// access limits and fault injection implement.
//
// It imports libp2p, the workers vocabulary and pool; it must not import
// access, faults, dispatch or api (they plug in through the hooks).
package protocol
