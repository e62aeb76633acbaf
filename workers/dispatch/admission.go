package dispatch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/workers"
)

// A burst the network can finish in time is finished, not refused. A busy
// answer (a worker's queue is full, or its work would end after the
// request's deadline) moves the request to the next candidate at once,
// without spending the retry budget: nothing ran, so it does not amplify
// load as a retry after an error does (selection.Plan.Next). When every
// worker that could run it is busy, remote ones and the local one, the
// request waits at this node in the admission queue (admission-queue-size)
// and is placed again when an attempt of this node ends (capacity freed)
// or its jittered backoff has passed (10ms, doubling to 250ms), whichever
// comes first; the longest waiting is woken first. It leaves when less is
// left of its deadline than its work is seen to take at the least (need):
// then it is answered unavailable (HTTP 503), saying so. A full admission
// queue answers unavailable at once.

// place runs the request's remote attempts and its local fallback, and
// while every worker that could run it is busy, waits in the admission
// queue and places it again with a fresh plan.
func (d *Dispatcher) place(ctx context.Context, req WorkRequest, sreq selection.Request, plan *selection.Plan) WorkResult {
	var w *selection.Waiter
	var queuedSince time.Time
	var kept []apiv1.Attempt // earlier rounds' attempts that were not busy
	refusals := 0
	for {
		res := d.remote(ctx, req, plan)
		if res.Status == "" {
			res = d.fallback(ctx, req, plan, res)
		}
		if w != nil {
			res.Queued = time.Since(queuedSince)
		}
		res.BusyRefusals = refusals
		if len(kept) > 0 {
			res.Attempts = append(kept, res.Attempts...)
		}
		if !res.blocked {
			return res
		}
		if w == nil {
			var ok bool
			if w, ok = d.admission.Enter(); !ok {
				if d.admission.Limit() == 0 {
					return overloaded(res, "no request waits at this node (admission-queue-size 0)")
				}
				return overloaded(res, fmt.Sprintf("the admission queue is full (%d waiting; admission-queue-size)", d.admission.Limit()))
			}
			defer w.Leave()
			queuedSince = time.Now()
		}
		deadline, _ := ctx.Deadline()
		need := d.need(req.Type)
		wait, leave := w.Wait(deadline, need, rand.Uint64())
		if leave {
			return overloaded(res, d.tooLate(req, deadline, queuedSince, need))
		}
		t := time.NewTimer(wait)
		select {
		case <-w.Wake():
		case <-t.C:
			w.Try()
		case <-ctx.Done():
		}
		t.Stop()
		if ctx.Err() != nil {
			res.blocked = false
			res.cutShort(ctx, req)
			res.Queued = time.Since(queuedSince)
			return res
		}
		if selection.Spare(time.Until(deadline), need) <= 0 {
			// Woken when it was about to leave anyway.
			return overloaded(res, d.tooLate(req, deadline, queuedSince, need))
		}
		// The next round's result lists this round's attempts but the busy
		// answers, which it counts. A remote worker that did not refuse
		// it ran the work, or may have: the next rounds do not give it
		// the work again, and the retries spent stay spent.
		kept = kept[:0:0]
		for _, a := range res.Attempts {
			if a.Outcome == workers.Busy {
				refusals++
				d.metrics.attempt(a.Outcome, a.Peer).Inc() // the result will not list it
				if req.claims != nil {
					// A verified request's replica: the worker cast no
					// vote, so the next round may ask it again.
					if id, err := peer.Decode(a.Peer); err == nil {
						req.claims.Release(string(id))
					} else if a.Peer == LocalWorker {
						req.claims.Release(LocalWorker)
					}
				}
				continue
			}
			kept = append(kept, a)
			if id, err := peer.Decode(a.Peer); err == nil && !slices.Contains(sreq.Ran, string(id)) {
				sreq.Ran = append(sreq.Ran, string(id))
			}
		}
		sreq.Again, sreq.Retries = true, plan.Retries()
		plan = d.sel.Plan(sreq)
	}
}

// tooLate says why a waiting request leaves the admission queue.
func (d *Dispatcher) tooLate(req WorkRequest, deadline, since time.Time, need time.Duration) string {
	return fmt.Sprintf("waited %s in the admission queue; the %s left of its %s deadline is too little for its work, which takes %s",
		time.Since(since).Round(time.Millisecond), max(0, time.Until(deadline)).Round(time.Millisecond),
		requestTimeout(req), need.Round(time.Millisecond))
}

// overloaded makes res the answer of a request that found every worker
// busy and cannot wait (longer): unavailable, saying why and what the
// last busy worker said.
func overloaded(res WorkResult, why string) WorkResult {
	res.blocked = false
	res.Busy = true
	res.Status = apiv1.StatusUnavailable
	res.Error = "every worker that could run it is busy: " + why + " (last: " + lastError(res.Attempts) + ")"
	return res
}

// busyAmong reports whether any of as was refused as busy.
func busyAmong(as []apiv1.Attempt) bool {
	for _, a := range as {
		if a.Outcome == workers.Busy {
			return true
		}
	}
	return false
}

// attemptEnded is told of every attempt's end, remote or local: one that
// held a place at a worker (anything but a busy refusal) freed it, which
// may let a waiting request in; a success tells how long the work takes.
func (d *Dispatcher) attemptEnded(workType string, o workers.Outcome, took time.Duration, at time.Time) {
	if o == workers.Busy {
		return
	}
	d.admission.Freed()
	if o == workers.Success {
		d.observeNeed(workType, took, at)
	}
}

// needWindow is how long a success counts in its work type's need: the
// need is the fastest success of the last one to two windows.
const needWindow = 10 * time.Second

// need returns the least time work of workType is seen to take (0 until
// one succeeded): what a waiting request must have left of its deadline.
func (d *Dispatcher) need(workType string) time.Duration {
	if v, ok := d.needs.Load(workType); ok {
		return v.(*needTracker).get(time.Now())
	}
	return 0
}

// observeNeed adds the duration of one success, which ended at at, to its
// work type's need.
func (d *Dispatcher) observeNeed(workType string, took time.Duration, at time.Time) {
	v, ok := d.needs.Load(workType)
	if !ok {
		v, _ = d.needs.LoadOrStore(workType, &needTracker{})
	}
	v.(*needTracker).observe(at, took)
}

// needTracker follows the fastest successes of one work type over a
// sliding window: the time the work takes at the least, since an attempt
// that waited in a worker's queue took longer than the work needs (a burst
// makes most of them wait), while a past faster than the present is
// forgotten after a window or two.
type needTracker struct {
	mu        sync.Mutex
	cur, prev time.Duration // the fastest of the current and the last window
	curStart  time.Time
}

func (n *needTracker) roll(now time.Time) {
	switch age := now.Sub(n.curStart); {
	case age >= 2*needWindow:
		n.prev, n.cur, n.curStart = 0, 0, now
	case age >= needWindow:
		n.prev, n.cur, n.curStart = n.cur, 0, n.curStart.Add(needWindow)
	}
}

func (n *needTracker) observe(now time.Time, took time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.roll(now)
	if n.cur == 0 || took < n.cur {
		n.cur = took
	}
}

func (n *needTracker) get(now time.Time) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.roll(now)
	switch {
	case n.prev == 0:
		return n.cur
	case n.cur == 0:
		return n.prev
	}
	return min(n.cur, n.prev)
}
