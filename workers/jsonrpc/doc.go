// Package jsonrpc is the jsonrpc work type: a relay of JSON-RPC 2.0
// requests to one upstream endpoint, with the upstream's head polled and
// advertised, and the JSON-RPC vocabulary the /v1/rpc route shares (calls,
// responses, errors, which methods only read and which block they name).
// Every request passes through it on the hot path, so it decodes, checks
// and encodes JSON-RPC without encoding/json's reflection where the input
// is plain (decode.go, encode.go, valid.go: each tested and fuzzed against
// encoding/json's answer). The upstream is called with Go's HTTP client.
//
// It imports config, the workers vocabulary and httpwork's fetch helpers;
// no libp2p.
package jsonrpc
