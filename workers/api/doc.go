// Package api holds the HTTP routes the workers packages put on a node's
// one HTTP server (node/httpapi): the work route (POST /v1/work), the
// JSON-RPC route (/v1/rpc), and the operator routes (/metrics,
// /v1/peers/selection, /v1/plan, /v1/status). Each is mounted with
// Register on (*node.Node).HandleAPI; the bodies are node/apiv1's.
//
// It imports dispatch, jsonrpc, protocol, node/apiv1 and node/httpapi;
// nothing in workers imports it.
package api
