package pool

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
)

// Pool is the local worker: at most LocalConcurrency requests run at once
// and at most WorkerBufferSize more wait for a turn, first come first
// served. Beyond that it answers Busy at once, so a caller never hangs on a
// saturated node, and every Submit ends with exactly one Result.
//
// The pool keeps no idle goroutines: a request runs on a goroutine of its
// own (Submit) or on the caller's (the work protocol server, which has a
// goroutine per stream anyway and so saves two hand-offs per request).
type Pool struct {
	reg         *workers.Registry
	log         logrus.FieldLogger
	concurrency int
	queueSize   int

	// mu guards closed and orders admissions (wg.Add) against Close
	// (wg.Wait).
	mu     sync.RWMutex
	closed bool
	// wg counts admitted requests until their handler has returned.
	wg sync.WaitGroup

	// ctx is the parent of every request's context; Close cancels it with
	// ErrPoolClosed so waiting requests give up and running handlers stop.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// turns holds one token per running request. Requests blocked on a
	// send to it are woken in arrival order, which makes the queue FIFO.
	turns chan struct{}
	// admitted counts requests from admission until their handler returned
	// (or they gave up waiting); it is what Busy is decided on.
	admitted atomic.Int64
	inFlight atomic.Int64
	// queued counts admitted requests that have not had their turn yet.
	queued atomic.Int64
	// runNS is a moving average of how long a handler ran, in nanoseconds
	// (0 until one ran): what lateFor estimates a queued request's end by.
	runNS atomic.Int64

	// The share of peers (AdmitPeer): local-reserve keeps the rest of the
	// running slots and queue places for the node's own clients. peerTurns
	// holds one token per running (or turn-taking) peer request, so peers
	// never hold more than cap(peerTurns) of turns; nil when nothing is
	// reserved. peerAdmitted counts peer requests as admitted does all.
	peerTurns    chan struct{}
	peerPlaces   int
	peerAdmitted atomic.Int64
	// reserveRun and reservePlaces are what local-reserve keeps.
	reserveRun, reservePlaces int
}

// Stats is the local worker's capacity and current load, as advertised
// in NodeData.
type Stats struct {
	// InFlight is the number of requests running now.
	InFlight int
	// Queued is the number of requests waiting for their turn.
	Queued int
	// MaxConcurrent is the number of requests that can run at once.
	MaxConcurrent int
	// QueueSize is the number of requests that can wait.
	QueueSize int
}

// Ticket is one admitted request (Admit): it holds a place in the pool
// until RunInline releases it, exactly once.
type Ticket struct {
	// peer: admitted by AdmitPeer, within the peers' share.
	peer     bool
	ctx      context.Context
	cancel   context.CancelCauseFunc
	owned    bool        // ctx is the caller's (AdmitPeerIn): release leaves it be
	stopPool func() bool // detaches ctx from the pool's context
	workType string
	payload  []byte
}

// NewPool returns a local worker running the handlers in reg, with
// cfg.LocalConcurrency requests at once and a queue of cfg.WorkerBufferSize
// (0 means a request is only taken when it can run at once). Panics are
// logged to log (nil means logrus's standard logger). Close stops it.
func New(reg *workers.Registry, cfg config.WorkerConfig, log logrus.FieldLogger) (*Pool, error) {
	if reg == nil {
		return nil, errors.New("new local worker: nil registry")
	}
	if cfg.LocalConcurrency < 1 {
		return nil, fmt.Errorf("new local worker: local-concurrency is %d, want at least 1", cfg.LocalConcurrency)
	}
	if cfg.WorkerBufferSize < 0 {
		return nil, fmt.Errorf("new local worker: worker-buffer-size is %d, want 0 or more", cfg.WorkerBufferSize)
	}
	if log == nil {
		log = logrus.StandardLogger()
	}
	if !(cfg.LocalReserve >= 0 && cfg.LocalReserve <= 1) {
		return nil, fmt.Errorf("new local worker: local-reserve is %v, want 0 to 1", cfg.LocalReserve)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	p := &Pool{
		reg:         reg,
		log:         log.WithField("component", "local-worker"),
		concurrency: cfg.LocalConcurrency,
		queueSize:   cfg.WorkerBufferSize,
		cancel:      cancel,
		turns:       make(chan struct{}, cfg.LocalConcurrency),
	}
	p.ctx = context.WithValue(ctx, poolKey{}, p)
	run, places := reserved(cfg.LocalReserve, cfg.LocalConcurrency, cfg.WorkerBufferSize)
	p.reserveRun, p.reservePlaces = run, places
	p.peerPlaces = cfg.LocalConcurrency + cfg.WorkerBufferSize - run - places
	if run > 0 {
		p.peerTurns = make(chan struct{}, cfg.LocalConcurrency-run)
	}
	return p, nil
}

// reserved returns the running slots and queue places local-reserve keeps
// for the node's own clients: share of each, rounded down (a share of one
// slot keeps nothing), and never every running slot (peers keep one at
// least, so a node with one slot still serves its peers).
func reserved(share float64, concurrency, queue int) (run, places int) {
	if share <= 0 {
		return 0, 0
	}
	run = min(concurrency-1, int(math.Floor(share*float64(concurrency))))
	places = min(queue, int(math.Floor(share*float64(queue))))
	return run, places
}

// Reserved returns the running slots and queue places kept for the node's
// own clients (local-reserve).
func (p *Pool) Reserved() (run, places int) { return p.reserveRun, p.reservePlaces }

// Registry returns the handlers the pool runs.
func (p *Pool) Registry() *workers.Registry { return p.reg }

// Stats returns the pool's capacity and current load.
func (p *Pool) Stats() Stats {
	return Stats{
		InFlight:      int(p.inFlight.Load()),
		Queued:        int(p.queued.Load()),
		MaxConcurrent: p.concurrency,
		QueueSize:     p.queueSize,
	}
}

// Submit runs payload through the handler for workType and returns its
// result. It does not wait for room: a full pool gives Busy at once, an
// unknown type Unsupported at once. When ctx is done first, Submit returns
// a RetryableError right away, whether the work was still waiting (it will
// not run) or running (its handler's context is cancelled; the handler
// keeps its turn until it returns). After Close it returns a
// RetryableError.
func (p *Pool) Submit(ctx context.Context, workType string, payload []byte) workers.Result {
	t, res, ok := p.Admit(ctx, workType, payload)
	if !ok {
		return res
	}
	if res, ok := p.takeTurn(t); !ok {
		return res
	}
	// The handler runs on a goroutine of its own so that Submit can return
	// at the deadline even when the handler ignores its context. The pool
	// owns the goroutine: Close waits for it.
	done := make(chan workers.Result, 1)
	go func() { done <- p.execute(t) }()
	// Not t.ctx: execute cancels it when it releases the Ticket, which
	// happens before the result is sent.
	select {
	case res := <-done:
		return res
	case <-ctx.Done():
	case <-p.ctx.Done():
	}
	select { // the result may have arrived at the same moment; prefer it
	case res := <-done:
		return res
	default:
	}
	cause := context.Cause(ctx)
	if cause == nil {
		cause = ErrPoolClosed
	}
	return workers.Fail(workers.RetryableError, "%s: cancelled while running: %v", workType, cause)
}

// RunInline runs an admitted request on the caller's goroutine: it waits
// for its turn (bounded by the Ticket's context), runs the handler and
// releases the Ticket. The work protocol server uses it.
func (p *Pool) RunInline(t *Ticket) workers.Result {
	if res, ok := p.takeTurn(t); !ok {
		return res
	}
	return p.execute(t)
}

// Admit takes a place for a request of the node's own clients, or says
// why there is none (ok false): every slot and place is open to it. An
// admitted Ticket must go through takeTurn, and execute when takeTurn
// succeeds; between them they release it exactly once.
func (p *Pool) Admit(ctx context.Context, workType string, payload []byte) (t *Ticket, res workers.Result, ok bool) {
	return p.admit(ctx, workType, payload, false, nil)
}

// AdmitPeer is Admit for a request from a peer (the work protocol
// server's): it is admitted only within the peers' share, so that the
// slots and places local-reserve keeps stay free for the node's own
// clients however many peers send work.
func (p *Pool) AdmitPeer(ctx context.Context, workType string, payload []byte) (t *Ticket, res workers.Result, ok bool) {
	return p.admit(ctx, workType, payload, true, nil)
}

// AdmitPeerIn is AdmitPeer for a caller that made the request's context
// itself: the Ticket's context is ctx, not a child of it, and its Cancel
// calls cancel, which must cancel ctx with its cause (ctx may be a child
// of what cancel cancels). The caller ends ctx once the request is done;
// releasing the Ticket does not. The work protocol server passes a
// context per request under a cancellable one of its stream's, so that a
// request costs one context, not two.
func (p *Pool) AdmitPeerIn(ctx context.Context, cancel context.CancelCauseFunc, workType string, payload []byte) (t *Ticket, res workers.Result, ok bool) {
	return p.admit(ctx, workType, payload, true, cancel)
}

func (p *Pool) admit(ctx context.Context, workType string, payload []byte, fromPeer bool, own context.CancelCauseFunc) (t *Ticket, res workers.Result, ok bool) {
	if err := ctx.Err(); err != nil {
		return nil, workers.Fail(workers.RetryableError, "%s: not started: %v", workType, context.Cause(ctx)), false
	}
	if _, known := p.reg.Get(workType); !known {
		return nil, p.reg.Unsupported(workType), false
	}
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		return nil, workers.Fail(workers.RetryableError, "%s: %v", workType, ErrPoolClosed), false
	}
	if p.admitted.Add(1) > int64(p.concurrency+p.queueSize) {
		p.admitted.Add(-1)
		p.mu.RUnlock()
		return nil, workers.Fail(workers.Busy, "local worker busy: %d running, %d of %d queued",
			p.inFlight.Load(), p.queued.Load(), p.queueSize), false
	}
	if res, late := p.lateFor(ctx, fromPeer); late {
		p.admitted.Add(-1)
		p.mu.RUnlock()
		return nil, res, false
	}
	if fromPeer && p.peerAdmitted.Add(1) > int64(p.peerPlaces) {
		p.peerAdmitted.Add(-1)
		p.admitted.Add(-1)
		p.mu.RUnlock()
		return nil, p.peersBusy(workType), false
	}
	p.queued.Add(1)
	p.wg.Add(1)
	p.mu.RUnlock()

	jctx, cancel, owned := ctx, own, own != nil
	if !owned {
		jctx, cancel = context.WithCancelCause(ctx)
	}
	t = &Ticket{peer: fromPeer, ctx: jctx, cancel: cancel, owned: owned, workType: workType, payload: payload, stopPool: linkedAlready}
	if owner, _ := ctx.Value(poolKey{}).(*Pool); owner != p {
		// Not a context of the pool's (Context): linked to it here, so
		// that Close cancels it all the same.
		t.stopPool = context.AfterFunc(p.ctx, func() { cancel(context.Cause(p.ctx)) })
	}
	return t, workers.Result{}, true
}

// poolKey marks the contexts that descend from a pool's own (Context).
type poolKey struct{}

// linkedAlready is the stopPool of a Ticket whose context descends from
// the pool's: nothing links them but the descent.
func linkedAlready() bool { return true }

// Context returns the pool's context: it ends when the pool is closed, with
// ErrPoolClosed as its cause. A request admitted with a context that
// descends from it (the work protocol server's) is cancelled by Close
// through that descent; any other is linked to the pool on admission.
func (p *Pool) Context() context.Context { return p.ctx }

// lateFor says whether a request with ctx's deadline, queued now, would
// likely end after that deadline, and answers it Busy then: the request
// is better placed elsewhere, or waits at the node that took it, than
// expires in this queue. A request that would start at once is always
// taken. The estimate is pessimistic about the queue (the running
// requests may have just started): the queued ones ahead run in waves of
// local-concurrency, then this one, each wave as long as the handlers'
// moving average.
func (p *Pool) lateFor(ctx context.Context, fromPeer bool) (workers.Result, bool) {
	deadline, ok := ctx.Deadline()
	avg := time.Duration(p.runNS.Load())
	queued := p.queued.Load()
	// A peer's request runs within the peers' share of the slots.
	conc := int64(p.concurrency)
	if fromPeer && p.peerTurns != nil {
		conc = int64(cap(p.peerTurns))
	}
	if !ok || avg <= 0 || p.inFlight.Load()+queued < conc {
		return workers.Result{}, false
	}
	waves := queued/conc + 2
	end := time.Duration(waves) * avg
	left := time.Until(deadline)
	if end+end/10 <= left { // a tenth to spare: an estimate ends late as often as early
		return workers.Result{}, false
	}
	return workers.Fail(workers.Busy, "local worker busy: %d running, %d queued: the work would end in about %s, too close to or after the %s left of its deadline",
		p.inFlight.Load(), queued, end.Round(time.Millisecond), max(0, left).Round(time.Millisecond)), true
}

// observeRun adds one handler's run time to the moving average.
func (p *Pool) observeRun(d time.Duration) {
	old := p.runNS.Load()
	if old == 0 {
		p.runNS.Store(int64(d))
		return
	}
	// A race between two updates loses one sample: it is an estimate.
	p.runNS.Store(old + (int64(d)-old)/8)
}

// peersBusy is the answer to a peer when the peers' share is taken.
func (p *Pool) peersBusy(workType string) workers.Result {
	run, places := p.Reserved()
	return workers.Fail(workers.Busy, "local worker busy: %d running, %d of %d queued; %d slots and %d places are kept for this node's own clients",
		p.inFlight.Load(), p.queued.Load(), p.queueSize, run, places)
}

// takeTurn waits until the request may run. When the Ticket's context ends
// first, or the pool is closed, it releases the Ticket and returns why. A
// peer's request takes a turn of the peers' share first.
func (p *Pool) takeTurn(t *Ticket) (workers.Result, bool) {
	if t.peer && p.peerTurns != nil && !tryTurn(p.peerTurns) {
		select {
		case p.peerTurns <- struct{}{}:
		case <-t.ctx.Done():
			p.queued.Add(-1)
			return p.release(t, false, p.notRun(t)), false
		}
	}
	if !tryTurn(p.turns) {
		select {
		case p.turns <- struct{}{}:
		case <-t.ctx.Done():
			p.queued.Add(-1)
			p.releasePeerTurn(t)
			return p.release(t, false, p.notRun(t)), false
		}
	}
	p.queued.Add(-1)
	// Checked after the turn was taken as well: select picks at random
	// among ready cases, and the pool's own context is seen before the
	// Ticket's learns of Close through its AfterFunc.
	if p.ctx.Err() != nil || t.ctx.Err() != nil {
		return p.release(t, true, p.notRun(t)), false
	}
	return workers.Result{}, true
}

// tryTurn takes a turn of turns if one is free now. A request that need
// not wait never asks for its context's Done channel, which the context
// makes only when asked.
func tryTurn(turns chan struct{}) bool {
	select {
	case turns <- struct{}{}:
		return true
	default:
		return false
	}
}

// notRun says why a request that waited did not run.
func (p *Pool) notRun(t *Ticket) workers.Result {
	if p.ctx.Err() != nil {
		return workers.Fail(workers.RetryableError, "%s: %v before the work ran", t.workType, ErrPoolClosed)
	}
	return workers.Fail(workers.RetryableError, "%s: expired while queued: %v", t.workType, context.Cause(t.ctx))
}

// execute runs the handler of a request that has its turn, then releases
// the Ticket.
func (p *Pool) execute(t *Ticket) workers.Result {
	p.inFlight.Add(1)
	start := time.Now()
	res := workers.Run(t.ctx, t.workType, p.handler(t.workType), t.payload, func(v any, stack []byte) {
		p.log.WithFields(logrus.Fields{"work_type": t.workType, "panic": v}).
			Errorf("handler panicked; answered with a permanent error\n%s", stack)
	})
	p.observeRun(time.Since(start))
	p.inFlight.Add(-1)
	return p.release(t, true, res)
}

// handler returns the handler for an admitted type. The registry cannot
// drop a type, but a handler answering Unsupported is safer than a nil one.
func (p *Pool) handler(workType string) workers.Handler {
	if h, ok := p.reg.Get(workType); ok {
		return h
	}
	return workers.HandlerFunc(func(context.Context, []byte) workers.Result { return p.reg.Unsupported(workType) })
}

// release gives back the Ticket's turn (when it had one) and its place,
// and passes res through. The place is freed before the caller sees res,
// so a caller that submits again at once finds room.
func (p *Pool) release(t *Ticket, hadTurn bool, res workers.Result) workers.Result {
	if hadTurn {
		<-p.turns
		p.releasePeerTurn(t)
	}
	if t.peer {
		p.peerAdmitted.Add(-1)
	}
	t.stopPool()
	if !t.owned {
		t.cancel(context.Canceled)
	}
	p.admitted.Add(-1)
	p.wg.Done()
	return res
}

// releasePeerTurn gives back the turn of the peers' share a peer's
// request took.
func (p *Pool) releasePeerTurn(t *Ticket) {
	if t.peer && p.peerTurns != nil {
		<-p.peerTurns
	}
}

// Context is the admitted request's context: it ends at the request's
// own end, when the pool closes, or when Cancel is called.
func (t *Ticket) Context() context.Context { return t.ctx }

// Cancel cancels the request's context with cause; the first cause is
// kept (context.Cause).
func (t *Ticket) Cancel(cause error) { t.cancel(cause) }

// Close stops taking work, fails the waiting requests with ErrPoolClosed,
// cancels the context of running handlers and waits until every handler
// has returned (a handler that ignores its context delays Close until it
// does). Close is safe to call more than once.
func (p *Pool) Close() error {
	// Cancel first, so that a request taking its turn from here on sees
	// the pool closed and does not start.
	p.cancel(ErrPoolClosed)
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}
