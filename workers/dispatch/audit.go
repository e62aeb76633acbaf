package dispatch

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
)

// auditConcurrency bounds the audits running at once; a result that comes
// while they are all taken is not audited (counted as dropped).
const auditConcurrency = 4

// auditor runs audits: audit-rate of a deterministic type's successful
// remote results are run again, after the request was answered, on one
// other worker (a remote peer the plan offers, or the local worker as the
// fallback). Different bytes count a dispute against the first worker, as
// one audit alone cannot tell which of the two lied; a third worker is
// then asked, and when it sides with the first worker the dispute goes to
// the auditor instead (both are logged). The dispatcher owns the audits:
// Run stops them (cancelled, waited for) when it ends.
type auditor struct {
	d    *Dispatcher
	rate float64
	sem  chan struct{}

	mu      sync.Mutex
	ctx     context.Context
	cancel  context.CancelFunc
	stopped bool
	wg      sync.WaitGroup
}

func newAuditor(d *Dispatcher) *auditor {
	a := &auditor{d: d, rate: d.cfg.Trust.AuditRate, sem: make(chan struct{}, auditConcurrency)}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	return a
}

// maybe audits res, the answer to req, at audit-rate.
func (a *auditor) maybe(req WorkRequest, res WorkResult) {
	if a.rate <= 0 || res.Status != apiv1.StatusOK || res.Worker == "" || res.Worker == LocalWorker ||
		!a.d.catalog[req.Type].Deterministic || rand.Float64() >= a.rate {
		return
	}
	a.start(req, res)
}

// start audits res in a goroutine of its own, when an audit slot is free.
// It is apart from maybe, whose every call would otherwise allocate what
// the goroutine captures.
func (a *auditor) start(req WorkRequest, res WorkResult) {
	pid, err := peer.Decode(res.Worker)
	if err != nil {
		return
	}
	select {
	case a.sem <- struct{}{}:
	default:
		a.d.trust.audits.WithLabelValues("dropped").Inc()
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		<-a.sem
		return
	}
	a.wg.Go(func() {
		defer func() { <-a.sem }()
		a.run(req, string(pid), res.Worker, res.Output)
	})
}

// run audits one result: output, produced by the peer with raw ID first
// (named worker).
func (a *auditor) run(req WorkRequest, first, worker string, output []byte) {
	claims := &selection.Claims{}
	claims.Claim(first)
	second := a.rerun(req, claims, "audit")
	switch {
	case second.Status != apiv1.StatusOK:
		a.d.trust.audits.WithLabelValues("none").Inc()
		return
	case bytes.Equal(second.Output, output):
		a.d.trust.audits.WithLabelValues("match").Inc()
		return
	}
	a.d.trust.audits.WithLabelValues("mismatch").Inc()
	// A third opinion, from a worker neither of the two.
	third := a.rerun(req, claims, "audit2")
	if third.Status == apiv1.StatusOK && bytes.Equal(third.Output, output) && !bytes.Equal(third.Output, second.Output) {
		a.d.dispute(req, second.Worker, "audit: its result differs from the ones of "+worker+" and "+third.Worker)
		return
	}
	a.d.dispute(req, worker, "audit: its result differs from the one "+dash(second.Worker)+" gave running it again")
}

// rerun runs req again on a worker claims does not hold.
func (a *auditor) rerun(req WorkRequest, claims *selection.Claims, suffix string) WorkResult {
	ctx, cancel := context.WithTimeout(a.ctx, requestTimeout(req))
	defer cancel()
	r := req
	r.ID, r.claims = req.ID+"."+suffix, claims
	sreq := selection.Request{WorkType: r.Type, Labels: r.Labels, Claims: claims}
	if r.MinHead != nil {
		sreq.MinHead, sreq.HasMinHead = *r.MinHead, true
	}
	return a.d.place(ctx, r, sreq, a.d.sel.Plan(sreq))
}

// lateVotes collects, in the background, the left votes of a verified
// request answered with the agreed digest: each differing result counts a
// dispute against its worker. cancel ends the replicas' context; it is
// called once every vote is in, or at once when the dispatcher stops (the
// replicas then end, and their votes are still waited for).
func (a *auditor) lateVotes(req WorkRequest, votes <-chan vote, left int, agreed string, cancel context.CancelFunc) {
	collect := func(stop <-chan struct{}) {
		defer cancel()
		for range left {
			select {
			case vt := <-votes:
				if vt.digest != "" && vt.digest != agreed {
					a.d.dispute(req, vt.res.Worker, "outvoted: its result came after the others had agreed, and differs")
				}
			case <-stop:
				cancel()
				stop = nil // the votes of the cancelled replicas follow
			}
		}
	}
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		closed := make(chan struct{})
		close(closed)
		collect(closed)
		return
	}
	a.wg.Go(func() { collect(a.ctx.Done()) })
	a.mu.Unlock()
}

// stop cancels the audits running and waits for them; no audit starts
// after it.
func (a *auditor) stop() {
	a.mu.Lock()
	a.stopped = true
	a.mu.Unlock()
	a.cancel()
	a.wg.Wait()
}
