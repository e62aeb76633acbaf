package tests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/workers"
)

// cpuTime returns the CPU time the process has used so far.
func cpuTime(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPerfScale is the scaling run: a network of 50, then 100 nodes on
// loopback in this one process, 20 of them dispatching concurrently (one
// caller each, closed loop, echo, shipped settings) to the others, which
// only serve. WORKMESH_SCALE_NODES overrides the sizes ("50,200"). It
// reports requests per second and the p99 latency at each size, the CPU the
// idle network burns just before the load starts (background-cores: every
// node shares this machine's cores, and on two of them 100 nodes saturate
// it before any request is sent), and the share of workers the dispatchers
// ranked alive when the load started (converged-%). The load starts once
// every dispatcher ranks 95% of the workers alive (or after 45s regardless)
// and the idle network burns less than one core (or after 30s more
// regardless). go-libp2p's in-memory mock network cannot carry these nodes:
// node.New builds its own host, with no way to hand it one from mocknet.
func BenchmarkPerfScale(b *testing.B) {
	sizes := []int{50, 100}
	if env := os.Getenv("WORKMESH_SCALE_NODES"); env != "" {
		sizes = nil
		for _, f := range strings.Split(env, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 20 {
				b.Fatalf("WORKMESH_SCALE_NODES=%q: want sizes above 20, comma-separated", env)
			}
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) { benchScale(b, n) })
	}
}

func benchScale(b *testing.B, total int) {
	const (
		dispatchers = 20
		count       = 20000
		limit       = 10 * time.Second
	)
	start := time.Now()
	hits := newHitCounter()
	gws := make([]*member, dispatchers)
	gws[0] = startMember(b, hits, memberSpec{name: "g0", cfg: productionSettings}, nil)
	for i := 1; i < dispatchers; i++ {
		gws[i] = startMember(b, hits, memberSpec{name: fmt.Sprintf("g%d", i), cfg: productionSettings}, gws[0])
	}
	// Workers join through a few different nodes, so that no single node
	// answers every newcomer's first sync.
	ws := make([]*member, total-dispatchers)
	for i := range ws {
		ws[i] = startWorker(b, fmt.Sprintf("w%d", i), map[string]workers.Handler{"echo": echoHandler()}, gws[i%4])
	}
	started := time.Since(start)
	aliveShare := func() float64 { // the lowest share of workers a dispatcher ranks alive
		low := 1.0
		for _, gw := range gws {
			alive := 0
			for _, r := range gw.disp.Selector().Ranking("echo") {
				if r.State == selection.StateAlive {
					alive++
				}
			}
			low = min(low, float64(alive)/float64(len(ws)))
		}
		return low
	}
	deadline := time.Now().Add(45 * time.Second)
	for aliveShare() < 0.95 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	converged, share := time.Since(start), aliveShare()
	// A network that just formed is busy (routing-table refreshes, first
	// syncs and polls): let it settle below one core, for at most 30s, and
	// report what it burns in the last two seconds before the load.
	var background float64
	for settle := time.Now(); ; {
		cpu0, t0 := cpuTime(b), time.Now()
		time.Sleep(2 * time.Second)
		background = float64(cpuTime(b)-cpu0) / float64(time.Since(t0))
		if background < 1 || time.Since(settle) > 30*time.Second {
			break
		}
	}

	req := workers.WorkRequest{Type: "echo", Payload: bytes.Repeat([]byte("x"), 256), Timeout: 5 * time.Second}
	var res phaseResult
	for b.Loop() {
		var (
			mu     sync.Mutex
			failed int
			first  string
		)
		// Caller i dispatches through gateway i.
		res = closedLoop(dispatchers, count, limit, func(ctx context.Context, i int) error {
			gw := gws[i]
			r := gw.disp.Dispatch(ctx, req)
			if r.Status != workers.StatusOK || r.Worker == workers.LocalWorker {
				mu.Lock()
				failed++
				if first == "" {
					first = describe(r, peerName(append(ws, gws...)...))
				}
				mu.Unlock()
				return errDispatch
			}
			return nil
		})
		if failed > 0 {
			b.Logf("%d requests failed; first: %s", failed, first)
		}
	}
	p99 := percentile(res.lat, 99)
	b.ReportMetric(res.rate(), "req/s")
	b.ReportMetric(ms(p99), "p99-ms")
	b.ReportMetric(ms(percentile(res.lat, 50)), "p50-ms")
	b.ReportMetric(float64(res.failed), "failed")
	b.ReportMetric(background, "background-cores")
	b.ReportMetric(100*share, "converged-%")
	b.Logf("%d nodes (%d dispatching, %d serving): started in %s; after %s the dispatchers ranked at least %.0f%% of the workers alive; idle network %.2f cores after %s; %d requests in %s: %.0f req/s, p50 %s, p99 %s, %d failed",
		total, dispatchers, len(ws), started.Round(time.Millisecond), converged.Round(time.Millisecond), 100*share, background, time.Since(start).Round(time.Second),
		res.ok, res.elapsed.Round(time.Millisecond), res.rate(), percentile(res.lat, 50), p99, res.failed)
}
