// Package workers is the vocabulary of work that every other part of a
// node speaks: a Handler runs one work type and returns a Result with an
// Outcome; a Registry maps type names to handlers; Traits say what a type
// promises (idempotent, so it may be hedged; deterministic); a Gate
// counts work in progress for a clean stop; and the sentinel errors.
//
// The parts that act on work live in packages of their own below this
// one, one idea each: builtin (echo, sha256, sleep), pool (the local
// worker), protocol (the work wire: codec, server, client), access (who
// may send work), faults (fault injection), httpwork and jsonrpc (two
// work types), dispatch (a request -> attempts -> one result) and api (the
// HTTP routes). workertest holds the fixtures their tests share.
//
// This package imports only the selection core (whose Outcome type it
// names) and the standard library: no libp2p, no net/http. Everything in
// workers/... may import it; it imports nothing of workers/....
package workers
