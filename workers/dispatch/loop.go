package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/protocol"
)

// attemptResult is what one attempt goroutine reports back.
type attemptResult struct {
	pick    selection.Pick
	outcome selection.Outcome
	resp    protocol.Response
	err     error
	dur     time.Duration
}

// remote runs the remote attempts of a request. A result with an empty
// Status means no remote attempt decided it and the fallback may run.
func (d *Dispatcher) remote(ctx context.Context, req WorkRequest, plan *selection.Plan) (res WorkResult) {
	if d.cfg.Hedge.MaxCount == 0 || !plan.Idempotent() || plan.BeyondHead() {
		return d.sequential(ctx, req, plan)
	}
	actx, cancelAttempts := context.WithCancel(ctx)
	// Every attempt is a distinct peer, so max-remote-workers bounds them:
	// an attempt never blocks on sending its result.
	results := make(chan attemptResult, d.cfg.Worker.MaxRemoteWorkers+1)
	var wg sync.WaitGroup
	dials := &dials{d: d, parent: actx, wg: &wg}
	inflight := 0
	launch := func(pk selection.Pick) {
		inflight++
		wg.Go(func() { results <- d.attempt(actx, req, pk, dials) })
		// Dial the next candidates now, so that dead ones cost one connect
		// timeout in parallel, not one after another.
		for _, id := range plan.Upcoming(d.cfg.Worker.MaxRemoteWorkers) {
			dials.start(id)
		}
	}
	defer func() {
		cancelAttempts()
		wg.Wait()
		close(results)
		for r := range results { // attempts cut short by the decision
			plan.Report(r.pick, workers.Cancelled, r.dur)
			res.Attempts = append(res.Attempts, d.attemptOf(r, workers.Cancelled))
		}
	}()

	if pk, ok := plan.Next(); ok {
		launch(pk)
	}
	var hedgeC, retryC <-chan time.Time
	armHedge := func() {
		if d.cfg.Hedge.MaxCount > 0 {
			hedgeC = time.After(plan.HedgeDelay())
		}
	}
	if inflight > 0 {
		armHedge()
	}
	for inflight > 0 || retryC != nil {
		select {
		case r := <-results:
			inflight--
			v := plan.Report(r.pick, r.outcome, r.dur)
			res.Attempts = append(res.Attempts, d.attemptOf(r, r.outcome))
			switch v {
			case selection.Done:
				return d.decided(r, res)
			case selection.Retry:
				retryC = time.After(d.cfg.Worker.RetryDelay)
			}
		case <-retryC:
			retryC = nil
			if pk, ok := plan.Next(); ok {
				launch(pk)
				armHedge()
			}
		case <-hedgeC:
			hedgeC = nil
			if pk, ok := plan.Hedge(); ok {
				launch(pk)
				armHedge()
			}
		case <-ctx.Done():
			res.Status = apiv1.StatusTimeout
			res.Error = endedEarly(ctx, req)
			return res
		}
	}
	if ctx.Err() != nil {
		// The deadline passed while the last attempt was being cut short.
		res.Status = apiv1.StatusTimeout
		res.Error = endedEarly(ctx, req)
		return res
	}
	if plan.BeyondHead() && len(res.Attempts) > 0 {
		// The one attempt beyond every head failed: no sweep, no fallback.
		res.Status = apiv1.StatusFailed
		res.Error = "the only attempt beyond every head failed: " + lastError(res.Attempts)
		return res
	}
	res.Explanation = plan.Explain().String()
	return res
}

// sequential runs the remote attempts of a request one after another, in
// the dispatching goroutine: without hedges nothing runs concurrently but
// the dials ahead, so the common path costs no goroutine hand-offs.
func (d *Dispatcher) sequential(ctx context.Context, req WorkRequest, plan *selection.Plan) (res WorkResult) {
	var wg sync.WaitGroup
	dials := &dials{d: d, parent: ctx, wg: &wg}
	defer func() {
		dials.cancel()
		wg.Wait()
	}()
	for {
		pk, ok := plan.Next()
		if !ok {
			break
		}
		for _, id := range plan.Upcoming(d.cfg.Worker.MaxRemoteWorkers) {
			dials.start(id)
		}
		r := d.attempt(ctx, req, pk, dials)
		v := plan.Report(pk, r.outcome, r.dur)
		res.Attempts = append(res.Attempts, d.attemptOf(r, r.outcome))
		if ctx.Err() != nil && v != selection.Done {
			res.Status = apiv1.StatusTimeout
			res.Error = endedEarly(ctx, req)
			return res
		}
		if v == selection.Done {
			return d.decided(r, res)
		}
		if v != selection.Retry {
			break
		}
		if d.cfg.Worker.RetryDelay > 0 {
			t := time.NewTimer(d.cfg.Worker.RetryDelay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
	}
	if plan.BeyondHead() && len(res.Attempts) > 0 {
		// The one attempt beyond every head failed: no sweep, no fallback.
		res.Status = apiv1.StatusFailed
		res.Error = "the only attempt beyond every head failed: " + lastError(res.Attempts)
		return res
	}
	res.Explanation = plan.Explain().String()
	return res
}

// decided turns the deciding attempt into the request's result.
func (d *Dispatcher) decided(r attemptResult, res WorkResult) WorkResult {
	res.Worker = d.idString(r.pick.Peer)
	switch r.outcome {
	case workers.Success:
		res.Status, res.Output = apiv1.StatusOK, r.resp.Output
	case workers.Empty:
		res.Status = apiv1.StatusEmpty
	default:
		res.Status, res.Error = apiv1.StatusFailed, r.resp.Error
	}
	return res
}

// attempt runs one remote attempt: connect within connect-timeout, then the
// work protocol within the attempt's deadline.
func (d *Dispatcher) attempt(ctx context.Context, req WorkRequest, pk selection.Pick, dials *dials) attemptResult {
	start := time.Now()
	r := attemptResult{pick: pk}
	id := peer.ID(pk.Peer)
	if err := dials.wait(ctx, pk.Peer); err != nil {
		r.outcome, r.err, r.dur = workers.Unreachable, err, time.Since(start)
		if ctx.Err() != nil {
			r.outcome = workers.Cancelled
		}
		return r
	}
	actx := ctx
	per := max(d.cfg.Worker.WorkerTimeout, req.Timeout)
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > per {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, per)
		defer cancel()
	}
	resp, err := d.client.Do(actx, id, protocol.Request{
		ID: req.ID, Type: req.Type, Payload: req.Payload,
		AcceptTimeout: d.cfg.Worker.WorkerResponseTimeout,
	})
	r.dur = time.Since(start)
	r.resp, r.err = resp, err
	switch {
	case err != nil && ctx.Err() != nil:
		r.outcome = workers.Cancelled // the request ended, or was decided elsewhere
	case errors.Is(err, protocol.ErrAcceptTimeout):
		r.outcome = workers.Unreachable
	case err != nil:
		r.outcome = workers.RetryableError
	default:
		r.outcome = resp.Outcome // Unsupported and Denied are final for this worker only: the plan goes on
	}
	return r
}

func (d *Dispatcher) attemptOf(r attemptResult, o selection.Outcome) apiv1.Attempt {
	a := apiv1.Attempt{Peer: d.idString(r.pick.Peer), Outcome: o, DurationMS: apiv1.Millis(r.dur), Group: r.pick.Group, Hedge: r.pick.Hedge}
	switch {
	case r.err != nil:
		a.Error = r.err.Error()
	case r.resp.Error != "":
		a.Error = r.resp.Error
	}
	return a
}

func lastError(as []apiv1.Attempt) string {
	for i := len(as) - 1; i >= 0; i-- {
		if as[i].Error != "" {
			return as[i].Peer + ": " + as[i].Error
		}
	}
	return "no error recorded"
}
