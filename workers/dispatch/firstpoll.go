package dispatch

import (
	"context"
	"time"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
)

// A peer that has just been learned (a record gossiped a moment after the
// node started, or before its relay slot made it reachable) is not
// selected until its first poll answers, nor is one that answers again
// (back from a partition, a connection swapped) until its good polls in a
// row, a quarter of poll-interval apart, make it alive. A request that
// finds no other candidate waits for those polls, within its deadline,
// instead of being refused at once: work submitted the moment a worker is
// listed succeeds once the worker is reached, directly or through a relay.

// probeWaitTick is how often a request waiting for probing candidates
// looks at their state again.
const probeWaitTick = 50 * time.Millisecond

// awaitFirstPolls reports whether res, the answer of a request whose plan
// was plan, is a refusal that a first poll may undo: no attempt was made,
// no worker was busy, and a candidate is probing. It then waits
// until the ranking changes (a poll answered or failed, a peer synced) and
// returns true for the request to be placed again, or false when the
// request's deadline leaves too little for its work, or ctx ends.
func (d *Dispatcher) awaitFirstPolls(ctx context.Context, req WorkRequest, plan *selection.Plan, res WorkResult) bool {
	if res.Status != apiv1.StatusUnavailable || len(res.Attempts) > 0 || res.Busy || ctx.Err() != nil {
		return false
	}
	waiting := false
	for _, c := range plan.Candidates() {
		if c.Reason == selection.ReasonProbing {
			waiting = true
			break
		}
	}
	if !waiting {
		return false
	}
	deadline, _ := ctx.Deadline()
	left := selection.Spare(time.Until(deadline), d.need(req.Type))
	if left <= 0 {
		return false
	}
	// A poll's answer changes the peer's state without a new ranking: the
	// request looks again every probeWaitTick, or at the ranking's change
	// (a peer synced), within the room its work needs.
	t := time.NewTimer(min(left, probeWaitTick))
	defer t.Stop()
	select {
	case <-d.sel.Changed():
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return ctx.Err() == nil
}
