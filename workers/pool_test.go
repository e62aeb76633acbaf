package workers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
)

// failAfter bounds every wait in these tests: reaching it means the
// behaviour under test is broken (a hang), never that the test is slow.
const failAfter = 10 * time.Second

// gate is a handler whose executions the test controls: each announces
// itself on started, then waits for release (or, when honourCtx is set,
// for its context, reporting the cause on cancelled).
type gate struct {
	started   chan string
	release   chan struct{}
	cancelled chan error
	honourCtx bool
	runs      atomic.Int64
	openOnce  sync.Once
}

// open releases every execution, now and later. Tests defer it so that a
// failing test does not leave handlers blocked (and Close waiting).
func (g *gate) open() { g.openOnce.Do(func() { close(g.release) }) }

func newGate(honourCtx bool) *gate {
	return &gate{
		started:   make(chan string, 100),
		release:   make(chan struct{}),
		cancelled: make(chan error, 100),
		honourCtx: honourCtx,
	}
}

func (g *gate) Do(ctx context.Context, payload []byte) Result {
	g.runs.Add(1)
	g.started <- string(payload)
	if !g.honourCtx {
		<-g.release
		return OK(payload)
	}
	select {
	case <-g.release:
		return OK(payload)
	case <-ctx.Done():
		g.cancelled <- context.Cause(ctx)
		return Fail(RetryableError, "gate cancelled: %v", context.Cause(ctx))
	}
}

func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(failAfter):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// quietLogger discards log output (panics are logged with their stack).
func quietLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

func newTestPool(t testing.TB, concurrency, buffer int, handlers map[string]Handler) *Pool {
	t.Helper()
	reg, err := NewBuiltinRegistry()
	must(t, err)
	for name, h := range handlers {
		must(t, reg.Register(name, h))
	}
	cfg := config.Defaults().Worker
	cfg.LocalConcurrency, cfg.WorkerBufferSize = concurrency, buffer
	p, err := NewPool(reg, cfg, quietLogger())
	must(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// submitAsync runs Submit on its own goroutine and delivers the result.
func submitAsync(ctx context.Context, p *Pool, workType, payload string) <-chan Result {
	ch := make(chan Result, 1)
	go func() { ch <- p.Submit(ctx, workType, []byte(payload)) }()
	return ch
}

func TestNewPool_RejectsBadConfig(t *testing.T) {
	reg := NewRegistry()
	cfg := config.Defaults().Worker
	bad := []func(*config.WorkerConfig){
		func(c *config.WorkerConfig) { c.LocalConcurrency = 0 },
		func(c *config.WorkerConfig) { c.WorkerBufferSize = -1 },
	}
	for i, mutate := range bad {
		c := cfg
		mutate(&c)
		if p, err := NewPool(reg, c, nil); err == nil {
			_ = p.Close()
			t.Errorf("case %d: NewPool accepted %+v", i, c)
		}
	}
	if _, err := NewPool(nil, cfg, nil); err == nil {
		t.Error("NewPool accepted a nil registry")
	}
}

func TestPool_BusyWhenFullNotAHang(t *testing.T) {
	g := newGate(false)
	defer g.open()
	p := newTestPool(t, 1, 1, map[string]Handler{"gate": g})
	ctx := context.Background()

	running := submitAsync(ctx, p, "gate", "a")
	recv(t, g.started, "the first request to start")
	queued, res, ok := p.admit(ctx, "gate", []byte("b"))
	if !ok {
		t.Fatalf("second request not queued: %v %q", res.Outcome, res.Error)
	}
	// An admitted request must run (or give up) for Close to return, also
	// when the test fails half-way; this cleanup runs before Close's.
	runQueued := sync.OnceValue(func() Result { return p.runInline(queued) })
	t.Cleanup(func() { runQueued() })
	if st := p.Stats(); st.InFlight != 1 || st.Queued != 1 || st.MaxConcurrent != 1 || st.QueueSize != 1 {
		t.Errorf("Stats() = %+v, want 1 in flight, 1 queued", st)
	}

	busy := recv(t, submitAsync(ctx, p, "gate", "c"), "Submit on a full pool to return")
	if busy.Outcome != Busy || !strings.Contains(busy.Error, "busy") {
		t.Fatalf("full pool: %v %q, want Busy", busy.Outcome, busy.Error)
	}

	g.open()
	if r := recv(t, running, "the first result"); r.Outcome != Success || string(r.Output) != "a" {
		t.Errorf("first: %v %q", r.Outcome, r.Output)
	}
	if r := runQueued(); r.Outcome != Success || string(r.Output) != "b" {
		t.Errorf("queued: %v %q", r.Outcome, r.Output)
	}
	if n := g.runs.Load(); n != 2 {
		t.Errorf("gate ran %d times, want 2 (the busy one must not run)", n)
	}
}

func TestPool_UnknownTypeAnsweredAtOnce(t *testing.T) {
	g := newGate(false)
	defer g.open()
	p := newTestPool(t, 1, 0, map[string]Handler{"gate": g})
	submitAsync(context.Background(), p, "gate", "a")
	recv(t, g.started, "the pool to be saturated")
	if r := p.Submit(context.Background(), "echo", nil); r.Outcome != Busy {
		t.Fatalf("saturated pool with no queue: %v %q, want Busy", r.Outcome, r.Error)
	}
	res := recv(t, submitAsync(context.Background(), p, "resize", ""), "an unknown type to be answered")
	if res.Outcome != Unsupported || !strings.Contains(res.Error, "echo, gate, sha256, sleep") {
		t.Errorf("unknown type: %v %q, want Unsupported listing the types", res.Outcome, res.Error)
	}
}

func TestPool_PanicRecoveredIntoPermanentError(t *testing.T) {
	p := newTestPool(t, 1, 4, map[string]Handler{
		"boom": HandlerFunc(func(context.Context, []byte) Result { panic(fmt.Sprintf("index out of range [%d]", 3)) }),
	})
	for i := range 3 { // the one worker goroutine must survive every panic
		res := recv(t, submitAsync(context.Background(), p, "boom", "x"), "the panicking request")
		if res.Outcome != PermanentError || res.Error != "handler boom panicked: index out of range [3]" {
			t.Fatalf("attempt %d: %v %q, want the panic as a permanent error", i, res.Outcome, res.Error)
		}
	}
	if res := p.Submit(context.Background(), "echo", []byte("alive")); res.Outcome != Success {
		t.Fatalf("after panics: %v %q", res.Outcome, res.Error)
	}
}

func TestPool_DeadlineWhileQueued(t *testing.T) {
	g := newGate(false)
	defer g.open()
	p := newTestPool(t, 1, 4, map[string]Handler{"gate": g})
	first := submitAsync(context.Background(), p, "gate", "first")
	recv(t, g.started, "the first request to start")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	res := recv(t, submitAsync(ctx, p, "gate", "expired"), "the queued request to give up at its deadline")
	if res.Outcome != RetryableError || !strings.Contains(res.Error, "expired while queued") ||
		!strings.Contains(res.Error, context.DeadlineExceeded.Error()) {
		t.Fatalf("queued past its deadline: %v %q", res.Outcome, res.Error)
	}
	if st := p.Stats(); st.Queued != 0 {
		t.Errorf("Stats().Queued = %d after the queued request gave up, want 0", st.Queued)
	}

	// The expired request must never run: the queue is FIFO, so once a
	// later request ran, the expired one was skipped.
	g.open()
	recv(t, first, "the first result")
	if r := p.Submit(context.Background(), "gate", []byte("later")); r.Outcome != Success {
		t.Fatalf("later: %v %q", r.Outcome, r.Error)
	}
	if got := recv(t, g.started, "a start"); got != "later" || len(g.started) != 0 {
		t.Fatalf("started %q (and %d more) after the first, want only \"later\": the expired request ran", got, len(g.started))
	}
}

func TestPool_DeadlineWhileRunning(t *testing.T) {
	t.Run("handler honours ctx", func(t *testing.T) {
		g := newGate(true)
		defer g.open()
		p := newTestPool(t, 1, 1, map[string]Handler{"gate": g})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		res := recv(t, submitAsync(ctx, p, "gate", "x"), "the result at the deadline")
		if res.Outcome != RetryableError {
			t.Fatalf("result %v %q, want RetryableError", res.Outcome, res.Error)
		}
		if cause := recv(t, g.cancelled, "the handler's ctx to be cancelled"); !errors.Is(cause, context.DeadlineExceeded) {
			t.Errorf("handler ctx cause = %v, want deadline exceeded", cause)
		}
	})
	t.Run("handler ignores ctx", func(t *testing.T) {
		g := newGate(false)
		defer g.open()
		p := newTestPool(t, 1, 1, map[string]Handler{"gate": g})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		res := recv(t, submitAsync(ctx, p, "gate", "x"), "Submit to return at the deadline although the handler hangs")
		if res.Outcome != RetryableError || !strings.Contains(res.Error, "cancelled while running") {
			t.Fatalf("result %v %q", res.Outcome, res.Error)
		}
		if st := p.Stats(); st.InFlight != 1 {
			t.Errorf("Stats().InFlight = %d, want 1: the hung handler still holds its slot", st.InFlight)
		}
	})
}

func TestPool_CloseFailsQueuedWorkAndStopsHandlers(t *testing.T) {
	g := newGate(true)
	defer g.open()
	p := newTestPool(t, 1, 4, map[string]Handler{"gate": g})
	ctx := context.Background()
	running := submitAsync(ctx, p, "gate", "running")
	recv(t, g.started, "the first request to start")
	var queued []chan Result
	for i := range 3 {
		tk, res, ok := p.admit(ctx, "gate", []byte(fmt.Sprint("queued", i)))
		if !ok {
			t.Fatalf("queue %d: %v %q", i, res.Outcome, res.Error)
		}
		ch := make(chan Result, 1)
		go func() { ch <- p.runInline(tk) }()
		queued = append(queued, ch)
	}

	closed := make(chan struct{})
	go func() { _ = p.Close(); close(closed) }()
	recv(t, closed, "Close to return")

	if cause := recv(t, g.cancelled, "the running handler to be cancelled"); !errors.Is(cause, ErrPoolClosed) {
		t.Errorf("running handler's cause = %v, want ErrPoolClosed", cause)
	}
	if r := recv(t, running, "the running request's result"); r.Outcome != RetryableError {
		t.Errorf("running: %v %q", r.Outcome, r.Error)
	}
	for i, ch := range queued {
		r := recv(t, ch, "a queued request's result")
		if r.Outcome != RetryableError || !strings.Contains(r.Error, "local worker closed before the work ran") {
			t.Errorf("queued %d: %v %q, want a retryable 'closed' error", i, r.Outcome, r.Error)
		}
	}
	if n := g.runs.Load(); n != 1 {
		t.Errorf("gate ran %d times, want 1: queued work must not start after Close", n)
	}
	if r := p.Submit(ctx, "echo", nil); r.Outcome != RetryableError || !strings.Contains(r.Error, ErrPoolClosed.Error()) {
		t.Errorf("Submit after Close: %v %q", r.Outcome, r.Error)
	}
	if st := p.Stats(); st.InFlight != 0 || st.Queued != 0 {
		t.Errorf("Stats() after Close = %+v", st)
	}
	must(t, p.Close()) // twice is fine
}

func TestPool_ExactlyOneResultUnderConcurrency(t *testing.T) {
	for _, closeMidway := range []bool{false, true} {
		t.Run(fmt.Sprintf("close midway %v", closeMidway), func(t *testing.T) {
			var runs atomic.Int64
			p := newTestPool(t, 4, 8, map[string]Handler{
				// A handler slow enough for the queue to fill and for
				// deadlines to hit queued and running work.
				"work": HandlerFunc(func(ctx context.Context, payload []byte) Result {
					runs.Add(1)
					select {
					case <-time.After(time.Duration(rand.IntN(300)) * time.Microsecond):
						return OK(payload)
					case <-ctx.Done():
						return Fail(RetryableError, "cancelled")
					}
				}),
			})
			const goroutines, perGoroutine = 32, 40
			var (
				wg       sync.WaitGroup
				outcomes [numOutcomes]atomic.Int64
				returned atomic.Int64
				halfway  = make(chan struct{})
			)
			for g := range goroutines {
				wg.Go(func() {
					for i := range perGoroutine {
						payload := fmt.Sprintf("g%d-i%d", g, i)
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(2000))*time.Microsecond)
						res := p.Submit(ctx, "work", []byte(payload))
						cancel()
						if returned.Add(1) == goroutines*perGoroutine/2 {
							close(halfway)
						}
						switch res.Outcome {
						case Success:
							if string(res.Output) != payload {
								t.Errorf("%s got the result of %q", payload, res.Output)
							}
						case Busy, RetryableError:
						default:
							t.Errorf("%s: unexpected %v %q", payload, res.Outcome, res.Error)
						}
						outcomes[res.Outcome].Add(1)
					}
				})
			}
			if closeMidway {
				recv(t, halfway, "half of the submits to return")
				must(t, p.Close())
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			recv(t, done, "every Submit to return")
			must(t, p.Close())

			if n := returned.Load(); n != goroutines*perGoroutine {
				t.Fatalf("%d results for %d submits", n, goroutines*perGoroutine)
			}
			if s, r := outcomes[Success].Load(), runs.Load(); s > r {
				t.Errorf("%d successes from %d handler runs", s, r)
			}
			if st := p.Stats(); st.InFlight != 0 || st.Queued != 0 {
				t.Errorf("Stats() after Close = %+v, want nothing in flight or queued", st)
			}
			t.Logf("success %d, busy %d, retryable %d, handler runs %d",
				outcomes[Success].Load(), outcomes[Busy].Load(), outcomes[RetryableError].Load(), runs.Load())
		})
	}
}
