package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
)

// trustMetrics count verified requests, disputes and audits.
type trustMetrics struct {
	verified *prometheus.CounterVec
	disputes *prometheus.CounterVec
	audits   *prometheus.CounterVec
}

func newTrustMetrics() *trustMetrics {
	return &trustMetrics{
		verified: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workmesh_verified_total",
			Help: "Verified requests (sent to several workers and compared), by result: agreed, disputed (results differed and too few agreed) or short (too few results).",
		}, []string{"result"}),
		disputes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workmesh_disputes_total",
			Help: "Results outvoted by other workers or contradicted by an audit, by peer (at most 16 peers named, others under \"other\").",
		}, []string{"peer"}),
		audits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workmesh_audits_total",
			Help: "Audits (a result run again on another worker), by result: match, mismatch, or none (no other worker gave a result).",
		}, []string{"result"}),
	}
}

// verifyProblem says why req may not be verified ("" when it may).
func (d *Dispatcher) verifyProblem(req WorkRequest) string {
	v := req.Verify
	if p := v.Problem(); p != "" {
		return "verify: " + p
	}
	if !d.catalog[req.Type].Deterministic {
		return fmt.Sprintf("verify %s: work type %s is not deterministic, so results of different workers cannot be compared (a custom type declares deterministic: true; the built-in echo and sha256 are); send it without verify", v, req.Type)
	}
	return ""
}

// vote is one replica's result.
type vote struct {
	res    WorkResult
	digest string // of the output, for ok and empty results
}

// verified runs a verified request to its one result.
//
// A verified request (WorkRequest.Verify, or its type's verify default)
// starts Agree replicas at first, at once, and more (up to Replicas in
// all) only while Agree matching results can no longer be had from the
// votes in and the replicas still running: when a replica fails, or when
// results differ. With every worker honest and up, a request 2/3 thus
// costs two runs, not three; a liar among the first two makes them differ,
// and the third replica decides. Each replica is an ordinary dispatch of
// its own (plan, retries, hedges, the admission queue), and their plans
// share one selection.Claims: a peer one replica took is never offered to
// another, so each vote is a distinct peer's. The local worker is one
// distinct node too: it may cast one vote, as the fallback of a replica
// that found no remote peer left. A replica that finds no worker at all is
// a vote without a result; the next one is started while replicas are
// left. The results of the replicas that succeeded are compared byte for
// byte; Agree equal ones are the answer, given at once. Every vote in that
// differs from it counts a dispute against its worker. As no more
// replicas run than the leading result needs to reach Agree, none is
// left running at the answer; should one be, it goes on in the
// background within the request's deadline (lateVotes), where a late vote
// that differs counts a dispute too. No replica is started once the
// request's deadline has passed or its caller gave up. The answer lists
// the votes cast before it.
func (d *Dispatcher) verified(ctx context.Context, req WorkRequest) WorkResult {
	v := req.Verify
	if why := d.verifyProblem(req); why != "" {
		return WorkResult{Status: apiv1.StatusFailed, Error: why, Invalid: true}
	}
	claims := &selection.Claims{}
	// The replicas outlive the answer (see lateVotes): their context has
	// the request's deadline, not its caller's cancellation, which is
	// passed on below until the answer.
	dl, _ := ctx.Deadline()
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), dl)
	votes := make(chan vote, v.Replicas)
	started, running := 0, 0
	start := func(n int) {
		for ; n > 0 && started < v.Replicas; n-- {
			started++
			running++
			go func(i int) { votes <- d.replica(rctx, req, i, claims) }(started)
		}
	}
	// Every replica runs in a goroutine of its own, so that a vote that
	// comes in (a replica that failed at once) starts its replacement at
	// once, whatever the others still take.
	start(v.Agree)
	var all []vote
	counts := map[string]int{}
	best := 0 // the most votes one result has
	// outOfTime: a replica ran out of time; no replica starts after it.
	outOfTime := false
	for running > 0 {
		select {
		case vt := <-votes:
			running--
			all = append(all, vt)
			if vt.digest != "" {
				counts[vt.digest]++
				best = max(best, counts[vt.digest])
				if counts[vt.digest] >= v.Agree {
					if running > 0 {
						d.audits.lateVotes(req, votes, running, vt.digest, cancel)
					} else {
						cancel()
					}
					return d.tally(req, all, vt.digest, counts)
				}
			}
			outOfTime = outOfTime || vt.res.Status == apiv1.StatusTimeout
			if rctx.Err() == nil && !outOfTime {
				// Enough replicas running again for the leading result
				// to reach Agree, should they all side with it. Not
				// after a replica that ran out of time: one started in
				// the milliseconds left could not finish either, and
				// would run the work once more for nothing.
				start(v.Agree - best - running)
			}
		case <-ctx.Done():
			cancel() // the caller gave up: the replicas end, and send their votes
			ctx = context.Background()
		}
	}
	cancel()
	return d.tally(req, all, "", counts)
}

// replica runs replica i (from 1) of the verified request req, its
// plan's peers those claims does not hold yet, to its vote.
func (d *Dispatcher) replica(ctx context.Context, req WorkRequest, i int, claims *selection.Claims) vote {
	r := req
	r.ID = req.ID + "." + strconv.Itoa(i)
	r.claims = claims
	sreq := selection.Request{WorkType: r.Type, Labels: r.Labels, Claims: claims,
		Idempotent: d.cfg.Hedge.MaxCount > 0 && d.catalog.Idempotent(r.Type, r.Payload)}
	if r.MinHead != nil {
		sreq.MinHead, sreq.HasMinHead = *r.MinHead, true
	}
	plan := d.sel.Plan(sreq)
	res := d.place(ctx, r, sreq, plan)
	for d.awaitFirstPolls(ctx, r, plan, res) {
		// Its candidates were all still waiting for their first poll, as
		// a plain request's may be: it waits for them too.
		plan = d.sel.Plan(sreq)
		res = d.place(ctx, r, sreq, plan)
	}
	vt := vote{res: res}
	switch res.Status {
	case apiv1.StatusOK:
		sum := sha256.Sum256(res.Output)
		vt.digest = hex.EncodeToString(sum[:])
	case apiv1.StatusEmpty:
		vt.digest = "empty"
	}
	return vt
}

// tally makes the votes the request's result, and counts a dispute
// against every worker outvoted by the agreed result.
func (d *Dispatcher) tally(req WorkRequest, all []vote, agreed string, counts map[string]int) WorkResult {
	v := req.Verify
	view := &apiv1.VerifyView{Replicas: v.Replicas, Agree: v.Agree, Agreed: []string{}, Votes: make([]apiv1.Vote, 0, len(all))}
	res := WorkResult{Verify: view}
	for _, vt := range all {
		res.Attempts = append(res.Attempts, vt.res.Attempts...)
		res.BusyRefusals += vt.res.BusyRefusals
		res.Queued = max(res.Queued, vt.res.Queued)
		view.Votes = append(view.Votes, apiv1.Vote{Worker: vt.res.Worker, Status: vt.res.Status, Digest: vt.digest, Error: vt.res.Error})
	}
	if agreed != "" {
		for _, vt := range all {
			switch {
			case vt.digest == agreed:
				if len(view.Agreed) == 0 {
					res.Status, res.Output, res.Worker = vt.res.Status, vt.res.Output, vt.res.Worker
				}
				view.Agreed = append(view.Agreed, vt.res.Worker)
			case vt.digest != "":
				d.dispute(req, vt.res.Worker, "outvoted: its result differs from the one "+strconv.Itoa(counts[agreed])+" other workers agreed on")
			}
		}
		d.trust.verified.WithLabelValues("agreed").Inc()
		return res
	}
	var got []string
	results := 0
	for _, vt := range all {
		if vt.digest != "" {
			results++
			got = append(got, dash(vt.res.Worker)+" gave "+vt.digest)
		}
	}
	if len(counts) >= 2 {
		res.Status = apiv1.StatusDisputed
		res.Error = fmt.Sprintf("verify %s: disputed: no %d workers gave the same result (%s)", v, v.Agree, strings.Join(got, "; "))
		d.trust.verified.WithLabelValues("disputed").Inc()
		return res
	}
	var why []string
	for _, vt := range all {
		if vt.digest == "" {
			why = append(why, vt.res.Error)
		}
	}
	res.Status = apiv1.StatusFailed
	switch {
	case results == 0 && allOf(all, apiv1.StatusUnavailable):
		res.Status = apiv1.StatusUnavailable
	case results == 0 && allOf(all, apiv1.StatusTimeout):
		res.Status = apiv1.StatusTimeout
	}
	res.Error = fmt.Sprintf("verify %s: %d of the %d agreeing results needed could be had (%d distinct workers tried); the others: %s", v, results, v.Agree, len(all), strings.Join(why, "; "))
	d.trust.verified.WithLabelValues("short").Inc()
	return res
}

// allOf reports whether every vote ended with status st.
func allOf(all []vote, st apiv1.Status) bool {
	for _, vt := range all {
		if vt.res.Status != st {
			return false
		}
	}
	return true
}

// dispute counts a dispute against worker (as a result names it): in
// the peers view and metrics, and toward its dispute cordon.
func (d *Dispatcher) dispute(req WorkRequest, worker, why string) {
	if worker == "" || worker == LocalWorker {
		return
	}
	pid, err := peer.Decode(worker)
	if err != nil {
		return
	}
	d.trust.disputes.WithLabelValues(d.metrics.attemptLabel(worker)).Inc()
	f := d.log.WithFields(logrus.Fields{"peer": worker, "request_id": req.ID, "work_type": req.Type})
	f.Warn("result disputed: " + why)
	if t, changed := d.sel.Liveness().ReportDispute(string(pid)); changed {
		f.WithFields(logrus.Fields{"from": t.From.String(), "to": t.To.String(), "reason": d.sel.Liveness().Reason(string(pid))}).
			Warn("peer cordoned: its results are outvoted by other workers")
	}
}

// verifyFor is the check req asks for: its own, else its type's default.
func (d *Dispatcher) verifyFor(req WorkRequest) config.Verify {
	if req.Verify.On() || req.Verify.Agree != 0 || len(d.verifyDefaults) == 0 {
		return req.Verify
	}
	return d.verifyDefaults[req.Type]
}

// verifyDefaults returns the verify default of every work type that has
// one in cfg.
func verifyDefaults(cfg config.Config) map[string]config.Verify {
	m := map[string]config.Verify{}
	for name := range cfg.CustomTypes {
		if v := cfg.VerifyFor(name); v.On() {
			m[name] = v
		}
	}
	for name := range cfg.WorkTypeDefaults {
		if v := cfg.VerifyFor(name); v.On() {
			m[name] = v
		}
	}
	return m
}
