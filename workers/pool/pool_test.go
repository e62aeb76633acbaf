package pool_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/workertest"
)

// submitAsync runs Submit on its own goroutine and delivers the result.
func submitAsync(ctx context.Context, p *pool.Pool, workType, payload string) <-chan workers.Result {
	ch := make(chan workers.Result, 1)
	go func() { ch <- p.Submit(ctx, workType, []byte(payload)) }()
	return ch
}

func TestNewPool_RejectsBadConfig(t *testing.T) {
	reg := workers.NewRegistry()
	cfg := config.Defaults().Worker
	bad := []func(*config.WorkerConfig){
		func(c *config.WorkerConfig) { c.LocalConcurrency = 0 },
		func(c *config.WorkerConfig) { c.WorkerBufferSize = -1 },
	}
	for i, mutate := range bad {
		c := cfg
		mutate(&c)
		if p, err := pool.New(reg, c, nil); err == nil {
			_ = p.Close()
			t.Errorf("case %d: NewPool accepted %+v", i, c)
		}
	}
	if _, err := pool.New(nil, cfg, nil); err == nil {
		t.Error("NewPool accepted a nil registry")
	}
}

func TestPool_BusyWhenFullNotAHang(t *testing.T) {
	g := workertest.NewGate(false)
	defer g.Open()
	p := workertest.NewPool(t, 1, 1, map[string]workers.Handler{"gate": g})
	ctx := context.Background()

	running := submitAsync(ctx, p, "gate", "a")
	workertest.Recv(t, g.Started, "the first request to start")
	queued, res, ok := p.Admit(ctx, "gate", []byte("b"))
	if !ok {
		t.Fatalf("second request not queued: %v %q", res.Outcome, res.Error)
	}
	// An admitted request must run (or give up) for Close to return, also
	// when the test fails half-way; this cleanup runs before Close's.
	runQueued := sync.OnceValue(func() workers.Result { return p.RunInline(queued) })
	t.Cleanup(func() { runQueued() })
	if st := p.Stats(); st.InFlight != 1 || st.Queued != 1 || st.MaxConcurrent != 1 || st.QueueSize != 1 {
		t.Errorf("Stats() = %+v, want 1 in flight, 1 queued", st)
	}

	busy := workertest.Recv(t, submitAsync(ctx, p, "gate", "c"), "Submit on a full pool to return")
	if busy.Outcome != workers.Busy || !strings.Contains(busy.Error, "busy") {
		t.Fatalf("full pool: %v %q, want Busy", busy.Outcome, busy.Error)
	}

	g.Open()
	if r := workertest.Recv(t, running, "the first result"); r.Outcome != workers.Success || string(r.Output) != "a" {
		t.Errorf("first: %v %q", r.Outcome, r.Output)
	}
	if r := runQueued(); r.Outcome != workers.Success || string(r.Output) != "b" {
		t.Errorf("queued: %v %q", r.Outcome, r.Output)
	}
	if n := g.Runs.Load(); n != 2 {
		t.Errorf("gate ran %d times, want 2 (the busy one must not run)", n)
	}
}

func TestPool_UnknownTypeAnsweredAtOnce(t *testing.T) {
	g := workertest.NewGate(false)
	defer g.Open()
	p := workertest.NewPool(t, 1, 0, map[string]workers.Handler{"gate": g})
	submitAsync(context.Background(), p, "gate", "a")
	workertest.Recv(t, g.Started, "the pool to be saturated")
	if r := p.Submit(context.Background(), "echo", nil); r.Outcome != workers.Busy {
		t.Fatalf("saturated pool with no queue: %v %q, want Busy", r.Outcome, r.Error)
	}
	res := workertest.Recv(t, submitAsync(context.Background(), p, "resize", ""), "an unknown type to be answered")
	if res.Outcome != workers.Unsupported || !strings.Contains(res.Error, "echo, gate, sha256, sleep") {
		t.Errorf("unknown type: %v %q, want Unsupported listing the types", res.Outcome, res.Error)
	}
}

func TestPool_PanicRecoveredIntoPermanentError(t *testing.T) {
	p := workertest.NewPool(t, 1, 4, map[string]workers.Handler{
		"boom": workers.HandlerFunc(func(context.Context, []byte) workers.Result { panic(fmt.Sprintf("index out of range [%d]", 3)) }),
	})
	for i := range 3 { // the one worker goroutine must survive every panic
		res := workertest.Recv(t, submitAsync(context.Background(), p, "boom", "x"), "the panicking request")
		if res.Outcome != workers.PermanentError || res.Error != "handler boom panicked: index out of range [3]" {
			t.Fatalf("attempt %d: %v %q, want the panic as a permanent error", i, res.Outcome, res.Error)
		}
	}
	if res := p.Submit(context.Background(), "echo", []byte("alive")); res.Outcome != workers.Success {
		t.Fatalf("after panics: %v %q", res.Outcome, res.Error)
	}
}

func TestPool_DeadlineWhileQueued(t *testing.T) {
	g := workertest.NewGate(false)
	defer g.Open()
	p := workertest.NewPool(t, 1, 4, map[string]workers.Handler{"gate": g})
	first := submitAsync(context.Background(), p, "gate", "first")
	workertest.Recv(t, g.Started, "the first request to start")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	res := workertest.Recv(t, submitAsync(ctx, p, "gate", "expired"), "the queued request to give up at its deadline")
	if res.Outcome != workers.RetryableError || !strings.Contains(res.Error, "expired while queued") ||
		!strings.Contains(res.Error, context.DeadlineExceeded.Error()) {
		t.Fatalf("queued past its deadline: %v %q", res.Outcome, res.Error)
	}
	if st := p.Stats(); st.Queued != 0 {
		t.Errorf("Stats().Queued = %d after the queued request gave up, want 0", st.Queued)
	}

	// The expired request must never run: the queue is FIFO, so once a
	// later request ran, the expired one was skipped.
	g.Open()
	workertest.Recv(t, first, "the first result")
	if r := p.Submit(context.Background(), "gate", []byte("later")); r.Outcome != workers.Success {
		t.Fatalf("later: %v %q", r.Outcome, r.Error)
	}
	if got := workertest.Recv(t, g.Started, "a start"); got != "later" || len(g.Started) != 0 {
		t.Fatalf("started %q (and %d more) after the first, want only \"later\": the expired request ran", got, len(g.Started))
	}
}

func TestPool_DeadlineWhileRunning(t *testing.T) {
	t.Run("handler honours ctx", func(t *testing.T) {
		g := workertest.NewGate(true)
		defer g.Open()
		p := workertest.NewPool(t, 1, 1, map[string]workers.Handler{"gate": g})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		res := workertest.Recv(t, submitAsync(ctx, p, "gate", "x"), "the result at the deadline")
		if res.Outcome != workers.RetryableError {
			t.Fatalf("result %v %q, want RetryableError", res.Outcome, res.Error)
		}
		if cause := workertest.Recv(t, g.Cancelled, "the handler's ctx to be cancelled"); !errors.Is(cause, context.DeadlineExceeded) {
			t.Errorf("handler ctx cause = %v, want deadline exceeded", cause)
		}
	})
	t.Run("handler ignores ctx", func(t *testing.T) {
		g := workertest.NewGate(false)
		defer g.Open()
		p := workertest.NewPool(t, 1, 1, map[string]workers.Handler{"gate": g})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		res := workertest.Recv(t, submitAsync(ctx, p, "gate", "x"), "Submit to return at the deadline although the handler hangs")
		if res.Outcome != workers.RetryableError || !strings.Contains(res.Error, "cancelled while running") {
			t.Fatalf("result %v %q", res.Outcome, res.Error)
		}
		if st := p.Stats(); st.InFlight != 1 {
			t.Errorf("Stats().InFlight = %d, want 1: the hung handler still holds its slot", st.InFlight)
		}
	})
}

func TestPool_CloseFailsQueuedWorkAndStopsHandlers(t *testing.T) {
	g := workertest.NewGate(true)
	defer g.Open()
	p := workertest.NewPool(t, 1, 4, map[string]workers.Handler{"gate": g})
	ctx := context.Background()
	running := submitAsync(ctx, p, "gate", "running")
	workertest.Recv(t, g.Started, "the first request to start")
	var queued []chan workers.Result
	for i := range 3 {
		tk, res, ok := p.Admit(ctx, "gate", []byte(fmt.Sprint("queued", i)))
		if !ok {
			t.Fatalf("queue %d: %v %q", i, res.Outcome, res.Error)
		}
		ch := make(chan workers.Result, 1)
		go func() { ch <- p.RunInline(tk) }()
		queued = append(queued, ch)
	}

	closed := make(chan struct{})
	go func() { _ = p.Close(); close(closed) }()
	workertest.Recv(t, closed, "Close to return")

	if cause := workertest.Recv(t, g.Cancelled, "the running handler to be cancelled"); !errors.Is(cause, pool.ErrPoolClosed) {
		t.Errorf("running handler's cause = %v, want ErrPoolClosed", cause)
	}
	if r := workertest.Recv(t, running, "the running request's result"); r.Outcome != workers.RetryableError {
		t.Errorf("running: %v %q", r.Outcome, r.Error)
	}
	for i, ch := range queued {
		r := workertest.Recv(t, ch, "a queued request's result")
		if r.Outcome != workers.RetryableError || !strings.Contains(r.Error, "local worker closed before the work ran") {
			t.Errorf("queued %d: %v %q, want a retryable 'closed' error", i, r.Outcome, r.Error)
		}
	}
	if n := g.Runs.Load(); n != 1 {
		t.Errorf("gate ran %d times, want 1: queued work must not start after Close", n)
	}
	if r := p.Submit(ctx, "echo", nil); r.Outcome != workers.RetryableError || !strings.Contains(r.Error, pool.ErrPoolClosed.Error()) {
		t.Errorf("Submit after Close: %v %q", r.Outcome, r.Error)
	}
	if st := p.Stats(); st.InFlight != 0 || st.Queued != 0 {
		t.Errorf("Stats() after Close = %+v", st)
	}
	workertest.Must(t, p.Close()) // twice is fine
}

func TestPool_ExactlyOneResultUnderConcurrency(t *testing.T) {
	for _, closeMidway := range []bool{false, true} {
		t.Run(fmt.Sprintf("close midway %v", closeMidway), func(t *testing.T) {
			var runs atomic.Int64
			p := workertest.NewPool(t, 4, 8, map[string]workers.Handler{
				// A handler slow enough for the queue to fill and for
				// deadlines to hit queued and running work.
				"work": workers.HandlerFunc(func(ctx context.Context, payload []byte) workers.Result {
					runs.Add(1)
					select {
					case <-time.After(time.Duration(rand.IntN(300)) * time.Microsecond):
						return workers.OK(payload)
					case <-ctx.Done():
						return workers.Fail(workers.RetryableError, "cancelled")
					}
				}),
			})
			const goroutines, perGoroutine = 32, 40
			var (
				wg       sync.WaitGroup
				outcomes [256]atomic.Int64 // by outcome, a byte
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
						case workers.Success:
							if string(res.Output) != payload {
								t.Errorf("%s got the result of %q", payload, res.Output)
							}
						case workers.Busy, workers.RetryableError:
						default:
							t.Errorf("%s: unexpected %v %q", payload, res.Outcome, res.Error)
						}
						outcomes[res.Outcome].Add(1)
					}
				})
			}
			if closeMidway {
				workertest.Recv(t, halfway, "half of the submits to return")
				workertest.Must(t, p.Close())
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			workertest.Recv(t, done, "every Submit to return")
			workertest.Must(t, p.Close())

			if n := returned.Load(); n != goroutines*perGoroutine {
				t.Fatalf("%d results for %d submits", n, goroutines*perGoroutine)
			}
			if s, r := outcomes[workers.Success].Load(), runs.Load(); s > r {
				t.Errorf("%d successes from %d handler runs", s, r)
			}
			if st := p.Stats(); st.InFlight != 0 || st.Queued != 0 {
				t.Errorf("Stats() after Close = %+v, want nothing in flight or queued", st)
			}
			t.Logf("success %d, busy %d, retryable %d, handler runs %d",
				outcomes[workers.Success].Load(), outcomes[workers.Busy].Load(), outcomes[workers.RetryableError].Load(), runs.Load())
		})
	}
}

// TestPool_BusyForWorkThatWouldEndPastItsDeadline: once the pool knows how
// long its work runs, a request that would wait in the queue until after
// its deadline is answered Busy at once, saying so, rather than queued to
// expire; one with time enough, or no deadline, is still queued.
func TestPool_BusyForWorkThatWouldEndPastItsDeadline(t *testing.T) {
	g := workertest.NewGate(true)
	defer g.Open()
	p := workertest.NewPool(t, 1, 50, map[string]workers.Handler{"gate": g})
	// One run of 100ms teaches the pool how long work runs.
	if r := p.Submit(context.Background(), "sleep", []byte("100ms")); r.Outcome != workers.Success {
		t.Fatalf("sleep: %v %q", r.Outcome, r.Error)
	}
	running := submitAsync(context.Background(), p, "gate", "a")
	workertest.Recv(t, g.Started, "the slot to be taken")

	qctx, cancelQueued := context.WithCancel(context.Background())
	var queued []*pool.Ticket
	t.Cleanup(func() {
		cancelQueued()
		for _, tk := range queued {
			p.RunInline(tk)
		}
	})
	admit := func(timeout time.Duration) (workers.Result, bool) {
		ctx := qctx
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(qctx, timeout)
			t.Cleanup(cancel)
		}
		tk, res, ok := p.Admit(ctx, "gate", nil)
		if ok {
			queued = append(queued, tk)
		}
		return res, ok
	}
	// A second's deadline: at 100ms a run, one at a time, the queue takes
	// a few (about 7) and refuses the rest.
	var refused workers.Result
	admitted := 0
	for range 20 {
		res, ok := admit(time.Second)
		if !ok {
			refused = res
			break
		}
		admitted++
	}
	if admitted < 3 || admitted >= 10 {
		t.Fatalf("%d of 20 requests with a 1s deadline queued behind 100ms runs one at a time; want about 7", admitted)
	}
	if refused.Outcome != workers.Busy || !strings.Contains(refused.Error, "after the") || !strings.Contains(refused.Error, "left of its deadline") {
		t.Fatalf("refusal %v %q, want Busy saying the work would end after its deadline", refused.Outcome, refused.Error)
	}
	// Time enough, or no deadline: queued.
	if res, ok := admit(time.Minute); !ok {
		t.Fatalf("a request with a minute's deadline refused: %q", res.Error)
	}
	if res, ok := admit(0); !ok {
		t.Fatalf("a request without a deadline refused: %q", res.Error)
	}
	g.Open()
	workertest.Recv(t, running, "the running request to end")
}

// Peers cannot take the share local-reserve keeps for the node's own
// clients: with 4 slots, 4 places and a quarter kept, peers get 3 running
// and 3 queued, the 7th is busy, and the node's own request still runs at
// once, beside them.
func TestPool_PeersCannotTakeTheReserve(t *testing.T) {
	g := workertest.NewGate(false)
	defer g.Open()
	reg := workers.NewRegistry()
	workertest.Must(t, reg.Register("gate", g))
	workertest.Must(t, reg.Register("echo", workers.HandlerFunc(func(_ context.Context, b []byte) workers.Result { return workers.OK(b) })))
	cfg := config.Defaults().Worker
	cfg.LocalConcurrency, cfg.WorkerBufferSize, cfg.LocalReserve = 4, 4, 0.25
	p, err := pool.New(reg, cfg, workertest.QuietLogger())
	workertest.Must(t, err)
	t.Cleanup(func() { _ = p.Close() })
	if run, places := p.Reserved(); run != 1 || places != 1 {
		t.Fatalf("Reserved() = %d, %d; want 1 slot and 1 place", run, places)
	}
	ctx := context.Background()
	var peers []<-chan workers.Result
	for i := range 6 {
		tk, res, ok := p.AdmitPeer(ctx, "gate", []byte(fmt.Sprint(i)))
		if !ok {
			t.Fatalf("peer request %d refused within the peers' share: %v %q", i, res.Outcome, res.Error)
		}
		ch := make(chan workers.Result, 1)
		go func() { ch <- p.RunInline(tk) }()
		peers = append(peers, ch)
	}
	for range 3 {
		workertest.Recv(t, g.Started, "the peers' requests to start")
	}
	if _, res, ok := p.AdmitPeer(ctx, "gate", nil); ok || res.Outcome != workers.Busy || !strings.Contains(res.Error, "kept for this node's own clients") {
		t.Fatalf("7th peer request: admitted %v, %v %q; want busy, the rest is kept", ok, res.Outcome, res.Error)
	}
	if st := p.Stats(); st.InFlight != 3 || st.Queued != 3 {
		t.Fatalf("Stats() = %+v, want 3 running and 3 queued (peers hold no reserved slot)", st)
	}
	own := workertest.Recv(t, submitAsync(ctx, p, "echo", "mine"), "the node's own request")
	if own.Outcome != workers.Success || string(own.Output) != "mine" {
		t.Fatalf("own request while peers fill their share: %v %q", own.Outcome, own.Error)
	}
	g.Open()
	for _, ch := range peers {
		if r := workertest.Recv(t, ch, "a peer's result"); r.Outcome != workers.Success {
			t.Errorf("peer request: %v %q", r.Outcome, r.Error)
		}
	}
	if st := p.Stats(); st.InFlight != 0 || st.Queued != 0 {
		t.Fatalf("after: %+v, want empty", st)
	}
}
