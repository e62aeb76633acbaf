// Package frame is the one framing of workmesh's stream protocols (work,
// health, nodedata): a four-byte big-endian length, then the body, the
// length checked against the reader's limit before anything is allocated
// and large bodies reserved in the stream's resource scope first.
//
// It imports libp2p's network types only; it must not import node or
// workers (both use it).
package frame
