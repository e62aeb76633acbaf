// Package reqctx is the context workmesh gives one request, on both ends
// of the work protocol: the dispatcher's for the whole request
// (WithDeadline), the work server's for the request a stream carries
// (New, ended by the stream's own timer and hooks).
//
// A Ctx behaves as context.WithDeadline(parent, deadline) would:
//   - Deadline reports the deadline (the parent's when that is earlier);
//     Err is DeadlineExceeded once it has passed, Canceled once the parent
//     ended or the request was done with, whichever came first.
//   - Its values are the parent's, and context.Cause finds the parent's
//     cause (the work server ends its parent at the deadline too, so that
//     the first cause is the one kept; see WithDeadline for the one
//     difference of the dispatcher's).
//   - Contexts derived from it end with it: the context package links
//     them through its AfterFunc method, with no goroutine.
//
// What it saves over WithDeadline is work on every request: it is one
// allocation, and the hook context.AfterFunc sets on a parent that can end
// (WithDeadline's timer and the functions its deadline and its parent's
// end run are reused from context to context, once Stop has made sure
// neither can still run), and a caller that blocks on the request
// (the work protocol's client, resetting its stream when the request
// ends) watches it with Watch, which allocates nothing, instead of
// context.AfterFunc, which makes a context, a channel and a map for it.
//
// It imports only the standard library: the work protocol (both ends) and
// the dispatcher import it.
package reqctx
