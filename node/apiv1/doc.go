// Package apiv1 holds the JSON bodies of a node's local HTTP API, version
// 1 (/v1/...): what a client sends and reads, from the node's own routes
// (info, peers) and from the work, plan, status and operator routes the
// workers packages mount on the same server; the paths, and the one error
// shape (Error) of every refusal.
//
// It is what the CLI's client commands import, so it imports no libp2p
// and no net/http server code: the standard library's encoding and the
// selection core's vocabulary at most. It must not import node, workers
// or anything that does.
package apiv1
