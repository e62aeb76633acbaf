// Package faults is fault injection for drills: a share of requests
// failed, delayed or dropped on purpose, in front of the handlers, and
// health pings dropped or failed alike; changed at run time through GET
// and PUT /v1/faults. Faults is the work server's protocol.Interceptor.
//
// It imports config, the workers vocabulary, pool (the ticket it acts
// on), node (the health check's sentinel) and node/httpapi; it must not
// import protocol or dispatch.
package faults
