package selection

import (
	"slices"
	"time"
)

// What a plan hears back: each pick's outcome, which feeds rating,
// liveness and the hedge delay, and the verdict on what the request does
// next.

// Report records the outcome of an attempt on a picked peer and says what
// to do next. Every outcome feeds rating; an unreachable one feeds liveness.
func (p *Plan) Report(pk Pick, o Outcome, latency time.Duration) Verdict {
	v, _, _ := p.ReportAttempt(pk, o, latency)
	return v
}

// ReportAttempt is Report that also returns the liveness transition the
// outcome caused, if any: the attempt that made the peer unreachable, told
// to exactly one of the attempts that report at the same time.
func (p *Plan) ReportAttempt(pk Pick, o Outcome, latency time.Duration) (Verdict, Transition, bool) {
	return p.ReportAttemptAt(pk, o, latency, p.s.clock.Now())
}

// ReportAttemptAt is ReportAttempt for an attempt that ended at at, read
// from the selector's clock (Selector.Clock) by a caller that has read it
// at the attempt's end already: it is not read again.
func (p *Plan) ReportAttemptAt(pk Pick, o Outcome, latency time.Duration, at time.Time) (Verdict, Transition, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.IndexFunc(p.tried, func(t tried) bool { return t.e.id == pk.Peer })
	if i < 0 || p.tried[i].reported {
		return Ignored, Transition{}, false
	}
	t := &p.tried[i]
	t.reported = true
	t.e.stats.inflight.Add(-1)
	miss := o == Empty && !p.beyondHead
	tr, changed := p.s.record(t.e, o, latency, miss, at)
	if miss {
		t.missed = true
		if p.succeeded {
			p.s.contradicted(t.e)
		}
	}
	return p.verdictLocked(t, o, latency, at), tr, changed
}

// verdictLocked says what to do after attempt t's outcome o, which came
// in at at.
func (p *Plan) verdictLocked(t *tried, o Outcome, latency time.Duration, at time.Time) Verdict {
	if p.req.Idempotent {
		p.s.observeHedge(p.req.WorkType, o, latency, at)
	}
	if p.decided || o == Cancelled {
		return Ignored
	}
	switch o {
	case Success:
		p.decided, p.succeeded = true, true
		for i := range p.tried {
			if p.tried[i].missed {
				p.s.contradicted(p.tried[i].e)
			}
		}
		return Done
	case PermanentError:
		p.decided = true
		return Done
	case Empty:
		if p.beyondHead {
			p.decided = true
			return Done
		}
		// At or below the head an empty answer is a miss: go on.
	}
	// An actual error (or a miss) from this attempt: under pass-on-error the
	// request moves past the group the attempt came from. Only a reported
	// failure moves the cursor, and only relative to its own group, so a
	// hedge or a late failure from an earlier group never skips a group.
	if p.lb != nil && p.lb.PassOnError && p.cursor < t.group+1 && o != Busy {
		p.cursor = t.group + 1
	}
	if o == Busy {
		// The worker refused at once: the next pick is a busy move (Next).
		p.afterBusy = true
		if !p.budgetLocked() {
			return Exhausted
		}
		return Retry
	}
	p.afterBusy = false
	if p.retriesSpentLocked() || !p.budgetLocked() || !p.retryBudgetLocked() {
		return Exhausted // the limit noted says why, as when Next finds it
	}
	return Retry
}

// InFlight returns the number of picks not yet reported.
func (p *Plan) InFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, t := range p.tried {
		if !t.reported {
			n++
		}
	}
	return n
}

// Tried returns the peers handed out so far, in order.
func (p *Plan) Tried() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, len(p.tried))
	for i, t := range p.tried {
		out[i] = t.e.id
	}
	return out
}
