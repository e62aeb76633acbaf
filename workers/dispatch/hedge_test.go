package dispatch

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/protocol"
	"github.com/workmesh/workmesh/workers/workertest"
)

// hedgeNodeConfig is the defaults on loopback with quick polls, and waits
// for a worker to accept work long enough that a loaded machine causes no
// retry: every extra attempt in these tests is a hedge.
func hedgeNodeConfig(t *testing.T) config.Config {
	cfg := config.Defaults()
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.Node.API = ""
	cfg.Node.DataDir = t.TempDir()
	cfg.Node.Network = "hedge-test"
	cfg.Liveness.PollInterval = 200 * time.Millisecond
	cfg.Worker.RetryDelay = 0
	cfg.Worker.WorkerTimeout, cfg.Worker.WorkerResponseTimeout = 5*time.Second, 5*time.Second
	return cfg
}

// startHedgeWorker starts a worker node bootstrapped from boot that serves
// "read" and "write" with h, over the work protocol.
func startHedgeWorker(t *testing.T, boot *node.Node, h workers.Handler) *node.Node {
	t.Helper()
	cfg := hedgeNodeConfig(t)
	cfg.Node.WorkTypes = []string{"read", "write"}
	for _, a := range boot.Addrs() {
		cfg.Node.Bootstrap = append(cfg.Node.Bootstrap, a.String())
	}
	workertest.Must(t, cfg.Validate())
	local := workertest.NewPool(t, 8, 16, map[string]workers.Handler{"read": h, "write": h})
	n, err := node.New(context.Background(), cfg.Node, node.WithLogger(workertest.QuietLogger()), node.WithLocalState(pool.NewLocalState(local)))
	workertest.Must(t, err)
	t.Cleanup(func() { _ = n.Close() })
	srv, err := protocol.NewServer(n.Host(), n.Network(), local, protocol.WithLogger(workertest.QuietLogger()))
	workertest.Must(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	return n
}

// hedgeMesh is a running dispatcher with two workers that serve "read"
// (idempotent, in the dispatcher's catalog) and "write" (not): a payload
// "fast" is answered at once, any other waits at gate.
func hedgeMesh(t *testing.T, edit func(*config.Config)) (*Dispatcher, *workertest.Gate) {
	t.Helper()
	cfg := hedgeNodeConfig(t)
	edit(&cfg)
	workertest.Must(t, cfg.Validate())
	n, err := node.New(context.Background(), cfg.Node, node.WithLogger(workertest.QuietLogger()))
	workertest.Must(t, err)
	t.Cleanup(func() { _ = n.Close() })
	d, err := New(cfg, n, nil, WithLogger(workertest.QuietLogger()), WithSelectionOptions(selection.WithSeed(1)),
		WithCatalog(workers.Catalog{"read": {Idempotent: workers.Always}}))
	workertest.Must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = d.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	g := workertest.NewGate(true)
	t.Cleanup(g.Open)
	h := workers.HandlerFunc(func(ctx context.Context, p []byte) workers.Result {
		if string(p) == "fast" {
			return workers.OK(p)
		}
		return g.Do(ctx, p)
	})
	startHedgeWorker(t, n, h)
	startHedgeWorker(t, n, h)
	for _, wt := range []string{"read", "write"} {
		testkit.WaitFor(t, 10*time.Second, "the dispatcher ranks both workers alive for "+wt, func() error {
			alive := 0
			for _, r := range d.Selector().Ranking(wt) {
				if r.State == selection.StateAlive {
					alive++
				}
			}
			if alive < 2 {
				return fmt.Errorf("%d alive", alive)
			}
			return nil
		}, n.Peers().Changed)
	}
	return d, g
}

// dispatchAsync runs req in a goroutine the test waits for, once it
// opened g.
func dispatchAsync(t *testing.T, d *Dispatcher, g *workertest.Gate, req WorkRequest) <-chan WorkResult {
	out := make(chan WorkResult, 1)
	var wg sync.WaitGroup
	wg.Go(func() { out <- d.Dispatch(context.Background(), req) })
	t.Cleanup(func() { g.Open(); wg.Wait() })
	return out
}

func hedgesOf(res WorkResult) (hedges int) {
	for _, a := range res.Attempts {
		if a.Hedge {
			hedges++
		}
	}
	return hedges
}

// TestHedge_FiresAtMeasuredDelayNeverOnWrites: with a fixed hedge-delay of a minute and
// measured successes of a few milliseconds, a request whose first attempt
// hangs is hedged (at the measured delay: the request's 30s would end long
// before the fixed one); the loser is cancelled, not an error. A write
// (not idempotent) hangs beside it unhedged, although the read's hedge
// proves its own measured delay passed.
func TestHedge_FiresAtMeasuredDelayNeverOnWrites(t *testing.T) {
	d, g := hedgeMesh(t, func(c *config.Config) {
		c.Hedge = config.HedgeConfig{Delay: time.Minute, MaxCount: 1, Quantile: 0.95, Factor: 1,
			DelayMin: time.Millisecond, DelayMax: 200 * time.Millisecond, Window: time.Minute, MinSamples: 10}
	})
	for _, wt := range []string{"read", "write"} {
		for i := range 30 {
			if res := d.Dispatch(context.Background(), WorkRequest{Type: wt, Payload: []byte("fast"), Timeout: 5 * time.Second}); res.Status != apiv1.StatusOK {
				t.Fatalf("%s warm-up %d: %+v", wt, i, res)
			}
		}
	}
	if delay, n, measured := d.Selector().HedgeDelay("read"); !measured || delay >= 200*time.Millisecond {
		t.Fatalf("read's hedge delay after 30 quick successes: %s (measured %v, %d samples), want measured, below hedge-delay-max", delay, measured, n)
	}

	if v := d.Plan(apiv1.PlanRequest{Type: "read"}); !v.Limits.HedgeDelayMeasured || v.Limits.HedgeDelayMS >= 200 {
		t.Fatalf("the plan view of read shows hedge delay %vms (measured %v), want the measured one", v.Limits.HedgeDelayMS, v.Limits.HedgeDelayMeasured)
	}
	// The write first: its one attempt hangs at the gate.
	write := dispatchAsync(t, d, g, WorkRequest{Type: "write", Payload: []byte("w"), Timeout: 30 * time.Second})
	workertest.Recv(t, g.Started, "the write's attempt to start")
	read := dispatchAsync(t, d, g, WorkRequest{Type: "read", Payload: []byte("r"), Timeout: 30 * time.Second})
	workertest.Recv(t, g.Started, "the read's first attempt to start")
	if got := workertest.Recv(t, g.Started, "the read's hedge to start (at the measured delay)"); got != "r" {
		t.Fatalf("the second attempt after the read is for %q: the write was hedged", got)
	}
	g.Open()
	rres := workertest.Recv(t, read, "the read's result")
	if rres.Status != apiv1.StatusOK || len(rres.Attempts) != 2 || hedgesOf(rres) != 1 {
		t.Fatalf("read: %+v, want ok from two attempts, one a hedge", rres)
	}
	cancelled := 0
	for _, a := range rres.Attempts {
		if a.Outcome == workers.Cancelled {
			cancelled++
		}
	}
	if cancelled != 1 {
		t.Fatalf("read attempts %+v: want the loser cancelled (kept out of the error statistics)", rres.Attempts)
	}
	wres := workertest.Recv(t, write, "the write's result")
	if wres.Status != apiv1.StatusOK || len(wres.Attempts) != 1 || hedgesOf(wres) != 0 {
		t.Fatalf("write: %+v, want ok from its one attempt, never hedged", wres)
	}
	if n := g.Runs.Load(); n != 3 {
		t.Fatalf("the gate ran %d times, want 3 (the write once, the read and its hedge)", n)
	}
}
