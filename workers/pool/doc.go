// Package pool is the local worker: bounded concurrency and a bounded
// FIFO queue that answers Busy at once when full, handler panics turned
// into permanent errors, a clean Close. The work server admits a peer's
// request with Admit and runs it with RunInline (a Ticket in between);
// the node's own API calls Submit. LocalState is what the node advertises
// of it (capacity, load, heads, health).
//
// It imports the workers vocabulary, config, node (for the types the node
// advertises) and Prometheus; it must not import the protocol, the
// dispatcher or the routes.
package pool
