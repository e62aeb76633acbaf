package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/protocol"
)

// The attempt loop runs the remote attempts of one request. It makes every
// decision: what the plan's verdict on an attempt means, when a retry is
// due, that a request whose context ended starts nothing more and is cut
// short, the one attempt beyond every head, the explanation when nothing
// decided. A strategy says only how attempts run and how the loop hears of
// the next event: inline runs them one after another in the dispatching
// goroutine, hedged runs each in a goroutine of its own with a hedge timer
// beside them. Another way of running attempts is another strategy; the
// loop does not change.

// event is what a strategy's next reports to the loop.
type event uint8

const (
	// idle: no attempt runs and nothing is due; the loop ends.
	idle event = iota
	// ended: an attempt ended; its result comes with the event.
	ended
	// retryDue: the retry the loop asked for (strategy.retry) is due.
	retryDue
	// hedgeDue: hedge-delay passed since the last attempt started.
	hedgeDue
	// requestEnded: the request's context ended (deadline or caller).
	requestEnded
)

// strategy is how the attempts of one request run. The loop calls start for
// every pick it takes from the plan, retry when the plan asks for a retry,
// next for each event, and stop once, when it has decided.
type strategy interface {
	// start begins an attempt on pk.
	start(pk selection.Pick)
	// retry makes a retryDue event due after delay.
	retry(delay time.Duration)
	// next waits for the next event.
	next() (event, attemptResult)
	// stop ends the attempts still running, hands each to the loop's
	// abandoned, and returns when all of them have ended.
	stop()
	// running counts the attempts started whose result next has not
	// returned yet.
	running() int
}

// attemptLoop is the state of one request's remote attempts that every
// strategy shares.
type attemptLoop struct {
	d     *Dispatcher
	ctx   context.Context
	req   WorkRequest
	plan  *selection.Plan
	res   WorkResult
	dials dials
	// inline is the inline strategy, kept here so that the common path
	// allocates nothing of its own: the loop is one allocation, reused
	// (loops).
	inline inline
	// ahead is room for the peers launch dials ahead; launched says an
	// attempt was launched.
	ahead    [16]string
	launched bool
	// outOfTime is set once an attempt failed having used its whole
	// budget: no attempt starts after it, and the request ends as timed
	// out unless an attempt still running (a hedge on a nearer worker,
	// whose budget ends later) decides it.
	outOfTime bool
}

// attemptResult is what one attempt reports back.
type attemptResult struct {
	pick    selection.Pick
	outcome selection.Outcome
	resp    protocol.Response
	err     error
	// dur is how long the attempt took and end when it ended, on the
	// system clock, read once for both; selAt is end on the selection
	// core's clock, which it is unless the core runs on another
	// (Dispatcher.ended).
	dur   time.Duration
	end   time.Time
	selAt time.Time
	// outOfTime says the attempt failed once the worker's time for the
	// work (its budget, see workBudget) was up: it used the request's
	// deadline, and what is left of it is only the way back.
	outOfTime bool
}

// remote runs the remote attempts of a request. A result with an empty
// Status means no remote attempt decided it and the fallback may run.
func (d *Dispatcher) remote(ctx context.Context, req WorkRequest, plan *selection.Plan) WorkResult {
	l := loops.Get().(*attemptLoop)
	l.d, l.ctx, l.req, l.plan = d, ctx, req, plan
	l.dials.d, l.dials.parent = d, ctx
	l.run(l.strategy())
	res := l.res
	// Nothing of the request runs once run has returned: the loop is
	// emptied (the result's attempts are the caller's now) and reused.
	*l = attemptLoop{}
	loops.Put(l)
	return res
}

// loops holds the attempt loops of requests done with, for the next: a
// loop is most of what a request allocates on this node, and at tens of
// thousands of requests a second the garbage collector's share of the
// work follows the bytes allocated.
var loops = sync.Pool{New: func() any { return new(attemptLoop) }}

// strategy picks how the request's attempts run: hedged when hedging is on
// and the request may be hedged, inline otherwise. Beyond every head there
// is one attempt, so nothing to hedge.
func (l *attemptLoop) strategy() strategy {
	if l.d.cfg.Hedge.MaxCount == 0 || !l.plan.Idempotent() || l.plan.BeyondHead() {
		l.inline.l = l
		return &l.inline
	}
	return newHedged(l)
}

// run runs the loop with s until it decides, then stops the attempts and
// dials still under way: when it returns, nothing of the request runs and
// l.res holds every attempt.
func (l *attemptLoop) run(s strategy) {
	defer l.dials.close()
	defer s.stop()
	if pk, ok := l.plan.Next(); ok {
		l.launch(s, pk)
	}
	for {
		ev, r := s.next()
		switch ev {
		case ended:
			l.d.attemptEnded(l.req.Type, r.outcome, r.dur, r.end)
			v, t, changed := l.plan.ReportAttemptAt(r.pick, r.outcome, r.dur, r.selAt)
			if changed {
				// Attempts that could not reach a peer count as failed
				// polls: the one that made it unreachable is logged as
				// a poll's would be.
				l.d.logTransition(t, r.err)
			}
			if r.outcome == workers.Busy {
				if det := workers.DetailOf(r.resp.Result); det != nil && det.RetryAfter > 0 {
					l.plan.HoldOff(r.pick, det.RetryAfter) // the worker's service asked to wait
				}
			}
			l.res.Attempts = append(l.res.Attempts, l.d.attemptOf(r, r.outcome))
			if v == selection.Done {
				l.d.decided(r, &l.res)
				return
			}
			if l.cutShort() {
				return
			}
			if r.outOfTime {
				// No other worker, nor the local one, starts the work
				// again in the milliseconds left: work with side effects
				// would run twice, and could not finish anyway.
				l.outOfTime = true
			}
			if l.outOfTime {
				if s.running() == 0 {
					l.timedOut()
					return
				}
				continue
			}
			if v == selection.Retry {
				s.retry(l.d.cfg.Worker.RetryDelay)
			}
		case retryDue:
			if l.cutShort() {
				return
			}
			if l.outOfTime {
				continue
			}
			if pk, ok := l.plan.Next(); ok {
				l.launch(s, pk)
			}
		case hedgeDue:
			if l.cutShort() {
				return
			}
			if l.outOfTime {
				continue
			}
			if pk, ok := l.plan.Hedge(); ok {
				l.launch(s, pk)
			}
		case requestEnded:
			l.cutShort()
			return
		case idle:
			switch {
			case l.cutShort():
			case l.outOfTime:
				l.timedOut()
			default:
				l.undecided()
			}
			return
		}
	}
}

// cutShort reports whether the request's context has ended, and if so
// makes the result say why: no attempt is started or retried after that.
func (l *attemptLoop) cutShort() bool {
	if l.ctx.Err() == nil {
		return false
	}
	l.res.cutShort(l.ctx, l.req)
	return true
}

// launch has s start an attempt on pk, and dials the next candidates now,
// so that dead ones cost one connect timeout in parallel, not one after
// another. A first attempt on a connected peer, while the host is
// connected to every peer it knows, has none to dial: it skips looking
// them up, which on every request took 5-7% of a 50- to 200-node
// network's CPU a request. Any peer known and not connected (a dead
// worker whose connection closed, one the connection manager trimmed),
// a first pick not connected, or a later attempt (a retry or a hedge)
// has it look.
func (l *attemptLoop) launch(s strategy, pk selection.Pick) {
	s.start(pk)
	first := !l.launched
	l.launched = true
	if first && l.d.nUnconnected.Load() == 0 && l.d.connected(pk.Peer) {
		return
	}
	for _, id := range l.plan.AppendUpcoming(l.ahead[:0], l.d.cfg.Worker.MaxRemoteWorkers) {
		l.dials.start(id)
	}
}

// timedOut ends a loop whose attempts ran out of time undecided.
func (l *attemptLoop) timedOut() {
	l.res.Status, l.res.Error = apiv1.StatusTimeout, fmt.Sprintf("no result within %s", requestTimeout(l.req))
}

// undecided ends a loop that ran out of attempts with no decision.
func (l *attemptLoop) undecided() {
	if l.plan.BeyondHead() && len(l.res.Attempts) > 0 {
		// The one attempt beyond every head failed: no sweep, no fallback.
		l.res.Status = apiv1.StatusFailed
		l.res.Error = "the only attempt beyond every head failed: " + lastError(l.res.Attempts)
		return
	}
	l.res.Explanation = l.plan.Explain().String()
}

// abandoned records an attempt that the decision cut short: reported
// cancelled, so it stays out of the error statistics.
func (l *attemptLoop) abandoned(r attemptResult) {
	l.d.attemptEnded(l.req.Type, workers.Cancelled, r.dur, r.end)
	l.plan.ReportAttemptAt(r.pick, workers.Cancelled, r.dur, r.selAt)
	l.res.Attempts = append(l.res.Attempts, l.d.attemptOf(r, workers.Cancelled))
}

// inline runs each attempt in the dispatching goroutine, one after another:
// without hedges nothing runs concurrently but the dials ahead, so the
// common path costs no goroutine hand-off and no channel.
type inline struct {
	l        *attemptLoop
	pick     selection.Pick
	started  bool // pick runs at the next call of next
	retrying bool // a retry is due after delay
	delay    time.Duration
}

func (s *inline) start(pk selection.Pick) { s.pick, s.started = pk, true }

func (s *inline) retry(delay time.Duration) { s.retrying, s.delay = true, delay }

func (s *inline) next() (event, attemptResult) {
	l := s.l
	switch {
	case s.started:
		s.started = false
		return ended, l.d.attempt(l.ctx, l.req, s.pick, &l.dials)
	case s.retrying:
		s.retrying = false
		if s.delay > 0 {
			t := time.NewTimer(s.delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-l.ctx.Done():
				return requestEnded, attemptResult{}
			}
		}
		return retryDue, attemptResult{}
	}
	return idle, attemptResult{}
}

// stop has nothing to do: an inline attempt has ended when next returns.
func (s *inline) stop() {}

func (s *inline) running() int { return 0 }

// hedged runs each attempt in a goroutine of its own, so that a hedge can
// run beside the attempt it hedges: hedge-delay after an attempt starts the
// loop may ask another peer too, and the first result the plan accepts
// decides.
type hedged struct {
	l       *attemptLoop
	ctx     context.Context // the attempts'; cancelled by stop
	cancel  context.CancelFunc
	results chan attemptResult
	wg      sync.WaitGroup // the attempt goroutines
	// runningN counts the attempts whose result is not yet taken.
	runningN       int
	hedgeC, retryC <-chan time.Time
}

func newHedged(l *attemptLoop) *hedged {
	// Every attempt is a distinct peer, so max-remote-workers bounds them:
	// an attempt never blocks on sending its result.
	h := &hedged{l: l, results: make(chan attemptResult, l.d.cfg.Worker.MaxRemoteWorkers+1)}
	h.ctx, h.cancel = context.WithCancel(l.ctx)
	return h
}

func (h *hedged) start(pk selection.Pick) {
	h.runningN++
	h.wg.Go(func() { h.results <- h.l.d.attempt(h.ctx, h.l.req, pk, &h.l.dials) })
	h.hedgeC = time.After(h.l.plan.HedgeDelay())
}

func (h *hedged) retry(delay time.Duration) { h.retryC = time.After(delay) }

func (h *hedged) next() (event, attemptResult) {
	if h.runningN == 0 && h.retryC == nil {
		return idle, attemptResult{}
	}
	select {
	case r := <-h.results:
		h.runningN--
		return ended, r
	case <-h.retryC:
		h.retryC = nil
		return retryDue, attemptResult{}
	case <-h.hedgeC:
		h.hedgeC = nil
		return hedgeDue, attemptResult{}
	case <-h.l.ctx.Done():
		return requestEnded, attemptResult{}
	}
}

func (h *hedged) running() int { return h.runningN }

func (h *hedged) stop() {
	h.cancel()
	h.wg.Wait()
	close(h.results)
	for r := range h.results {
		h.l.abandoned(r)
	}
}

// ended notes the end of attempt r, which started at start: now, since
// start, and now on the selection core's clock.
func (d *Dispatcher) ended(r *attemptResult, start time.Time) {
	r.end = time.Now()
	r.dur = r.end.Sub(start)
	r.selAt = r.end
	if d.selClock != nil {
		r.selAt = d.selClock.Now()
	}
}

// decided makes the deciding attempt the request's result.
func (d *Dispatcher) decided(r attemptResult, res *WorkResult) {
	res.Worker = d.idString(r.pick.Peer)
	switch r.outcome {
	case workers.Success:
		res.Status, res.Output = apiv1.StatusOK, r.resp.Output
	case workers.Empty:
		res.Status = apiv1.StatusEmpty
	default:
		res.Status, res.Error, res.Detail = apiv1.StatusFailed, r.resp.Error, workers.DetailOf(r.resp.Result)
	}
}

// attempt runs one remote attempt: connect within connect-timeout, then the
// work protocol within the request's deadline.
func (d *Dispatcher) attempt(ctx context.Context, req WorkRequest, pk selection.Pick, dials *dials) attemptResult {
	start := time.Now()
	r := attemptResult{pick: pk}
	id := peer.ID(pk.Peer)
	waited, err := dials.wait(ctx, pk.Peer)
	if err != nil {
		r.outcome, r.err = workers.Unreachable, err
		d.ended(&r, start)
		if ctx.Err() != nil {
			r.outcome = workers.Cancelled
		}
		return r
	}
	ctx, err = d.node.OverRelay(ctx, id, len(req.Payload))
	if err != nil {
		r.outcome, r.err = workers.Unsupported, err
		d.ended(&r, start)
		return r
	}
	// The request's deadline (ctx's) bounds the attempt: work that runs
	// may take all of it. What bounds a worker that has gone silent is the
	// accept timeout: a worker that has not taken the work within it is
	// given up, and the request goes on to the next candidate.
	budget := d.workBudget(ctx, pk.Peer)
	// The call starts when the attempt does, unless the attempt waited
	// for a dial (the clock is read once when it did not).
	called := start
	if waited {
		called = time.Now()
	}
	resp, err := d.client.Do(ctx, id, protocol.Request{
		ID: req.ID, Type: req.Type, Payload: req.Payload,
		Timeout:       budget,
		AcceptTimeout: d.acceptWait(pk.Peer),
	})
	d.ended(&r, start)
	took := r.dur
	if waited {
		took = time.Since(called)
	}
	r.resp, r.err = resp, err
	switch {
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		// The worker was given the work and did not answer within the
		// request's deadline: a stall, which liveness holds against it
		// (its pings may be fine) and rating counts as an error.
		r.outcome = workers.RetryableError
		d.stalled(pk.Peer)
	case err != nil && ctx.Err() != nil:
		r.outcome = workers.Cancelled // the request ended, or was decided elsewhere
	case errors.Is(err, protocol.ErrAcceptTimeout):
		r.outcome = workers.Unreachable
	case err != nil:
		r.outcome = workers.RetryableError
	default:
		r.outcome = resp.Outcome // Unsupported and Denied are final for this worker only: the plan goes on
		if refused := r.outcome == workers.Busy || r.outcome == workers.Denied || r.outcome == workers.Unsupported; !refused {
			// An answer to work forgives a stall; a refusal, which shows
			// that nothing ran, does not: a worker could otherwise stall
			// every other request and refuse the rest.
			d.sel.Liveness().ReportAnswer(pk.Peer)
		}
		d.answerLoad(pk.Peer, resp.Load, r.selAt)
	}
	r.outOfTime = budget > 0 && took >= budget && r.outcome != workers.Success && r.outcome != workers.Empty
	return r
}

// stalled reports to liveness a worker that left an attempt unanswered
// until the request's deadline, and logs the cordon it may cause.
func (d *Dispatcher) stalled(id string) {
	if t, changed := d.sel.Liveness().ReportStall(id); changed {
		d.log.WithFields(logrus.Fields{"peer": d.idString(id), "from": t.From.String(), "to": t.To.String(),
			"reason": d.sel.Liveness().Reason(id)}).Warn("peer cordoned: it accepts work and does not answer")
	}
}

func (d *Dispatcher) attemptOf(r attemptResult, o selection.Outcome) apiv1.Attempt {
	a := apiv1.Attempt{Peer: d.idString(r.pick.Peer), Outcome: o, DurationMS: apiv1.Millis(r.dur), Group: r.pick.Group, Hedge: r.pick.Hedge}
	switch {
	case r.err != nil:
		a.Error = attemptCause(r.err)
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
