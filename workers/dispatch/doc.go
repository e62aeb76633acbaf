// Package dispatch turns a submitted request into attempts on remote
// workers, chosen by the selection core, and its one terminal result:
// the plan, the dials ahead, the attempt loop (sequential, or hedged for
// work its type declares idempotent), every outcome fed back to rating and
// liveness, and the local worker as the fallback. Run keeps the core in
// step with the node's peer table and polls liveness. Its read models
// (PeerStatuses, Plan, Status) and metrics are built beside it.
//
// It imports node, selection, the workers vocabulary, builtin, pool and
// protocol, and node/apiv1 for the bodies it fills; it must not import api
// (the routes import it).
package dispatch
