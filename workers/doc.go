// Package workers holds work types and their handlers, the local worker pool, the work protocol (client and server) and the dispatcher that turns a submitted request into attempts on remote workers or the local one.
//
// The pieces, bottom up:
//
//   - Outcome and Result: how one execution ended (success, empty,
//     retryable or permanent error, busy, unsupported, denied).
//   - Handler, Registry and the built-in types echo, sha256 and sleep. A
//     handler of a type with positions may also implement HeadReporter.
//   - Pool, the local worker: bounded concurrency and a bounded FIFO queue
//     that answers Busy at once when full; handler panics become permanent
//     errors.
//   - The work protocol /workmesh/<network>/work/1.0.0: one request and one
//     response per stream, length-prefixed and size-bounded before any
//     allocation (codec.go), served by Server from a Pool and called by
//     Client (protocol.go, where the exchange is described).
package workers
