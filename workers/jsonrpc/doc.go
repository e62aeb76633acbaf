// Package jsonrpc is the jsonrpc work type: a relay of JSON-RPC 2.0
// requests to one upstream endpoint, with the upstream's head polled and
// advertised, and the JSON-RPC vocabulary the /v1/rpc route shares (calls,
// responses, errors, which methods only read and which block they name).
//
// It imports config, the workers vocabulary and httpwork's fetch helpers;
// no libp2p.
package jsonrpc
