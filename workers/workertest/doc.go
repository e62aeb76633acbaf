// Package workertest holds the fixtures the tests of the workers packages
// share: a handler whose runs a test controls (Gate), a local worker of
// the built-in types (NewPool), libp2p hosts on loopback or on the mock
// network, and bounded waits.
//
// It may import the workers packages below the dispatcher (the vocabulary,
// builtin and pool), config and libp2p; it must not import dispatch, api
// or anything that imports workertest's users. Only tests import it.
package workertest
