package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/protocol"
)

// The perf benchmarks (BenchmarkPerf*) each measure one figure of issue 6
// against its baseline in the same run, alternating or interleaving the two
// so that load on a shared machine hits both alike. Each reports the figure
// as workmesh-<unit>, the baseline as baseline-<unit> and their ratio
// (workmesh / baseline, or the median of paired ratios where the samples
// come in pairs) as "ratio"; bench/report turns them into the table. Every
// load loop is bounded in count and in time, and every node listens on
// loopback only. They are scenarios, not per-op loops: run them with
// -benchtime 1x.

// productionSettings puts the dispatch settings of a member back to the
// shipped defaults (the test defaults poll every 200ms and time out
// quickly), keeping its loopback node config.
func productionSettings(c *config.Config) {
	d := config.Defaults()
	c.Worker, c.Liveness, c.Rating, c.Hedge = d.Worker, d.Liveness, d.Rating, d.Hedge
}

// echoHandler answers with its payload.
func echoHandler() workers.Handler {
	return workers.HandlerFunc(func(_ context.Context, p []byte) workers.Result { return workers.OK(p) })
}

// serveBareEcho answers bareEchoProtocol on h: the baseline of a work
// exchange, one stream carrying the payload there and back.
func serveBareEcho(h host.Host) {
	h.SetStreamHandler(bareEchoProtocol, func(s network.Stream) {
		buf, err := io.ReadAll(io.LimitReader(s, 1<<20))
		if err != nil {
			s.Reset()
			return
		}
		if _, err := s.Write(buf); err != nil {
			s.Reset()
			return
		}
		s.Close()
	})
}

// bareEcho sends payload over a new bareEchoProtocol stream and checks the
// answer.
func bareEcho(ctx context.Context, h host.Host, to peer.ID, payload []byte) error {
	s, err := h.NewStream(ctx, to, bareEchoProtocol)
	if err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		s.SetDeadline(dl)
	}
	if _, err := s.Write(payload); err != nil {
		s.Reset()
		return err
	}
	s.CloseWrite()
	got, err := io.ReadAll(io.LimitReader(s, 1<<20))
	if err != nil {
		s.Reset()
		return err
	}
	s.Close()
	if len(got) != len(payload) {
		return fmt.Errorf("bare echo: %d bytes back, sent %d", len(got), len(payload))
	}
	return nil
}

// phaseResult is what one closed-loop load phase achieved.
type phaseResult struct {
	ok, failed int
	elapsed    time.Duration
	lat        []time.Duration // latencies of the successful calls
	firstErr   error
}

func (r phaseResult) rate() float64 { return float64(r.ok) / r.elapsed.Seconds() }

// closedLoop runs call from callers goroutines (numbered from 0) until
// count calls were started or limit passed, whichever comes first.
func closedLoop(callers, count int, limit time.Duration, call func(ctx context.Context, caller int) error) phaseResult {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var (
		next   atomic.Int64
		mu     sync.Mutex
		res    phaseResult
		wg     sync.WaitGroup
		lats   = make([][]time.Duration, callers)
		start  = time.Now()
		failed atomic.Int64
	)
	for c := range callers {
		wg.Go(func() {
			for next.Add(1) <= int64(count) && ctx.Err() == nil {
				t := time.Now()
				if err := call(ctx, c); err != nil {
					if ctx.Err() != nil {
						return // cut off by the phase's time limit
					}
					failed.Add(1)
					mu.Lock()
					if res.firstErr == nil {
						res.firstErr = err
					}
					mu.Unlock()
					continue
				}
				lats[c] = append(lats[c], time.Since(t))
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	for _, l := range lats {
		res.lat = append(res.lat, l...)
	}
	res.ok, res.failed = len(res.lat), int(failed.Load())
	return res
}

// percentile returns the p-th percentile (0 < p <= 100) of d, nearest rank.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// reportFigure reports one figure in the form bench/report reads.
func reportFigure(b *testing.B, workmesh, baseline float64, unit string, ratio float64) {
	b.ReportMetric(workmesh, "workmesh-"+unit)
	b.ReportMetric(baseline, "baseline-"+unit)
	b.ReportMetric(ratio, "ratio")
}

// startWorker starts a worker-only member: node, local worker and work
// protocol server, no dispatcher; settings edits its config (from the test
// defaults) and opts are added to the node's. Scale runs
// use it for the nodes that only serve, so that the process does not run
// (and poll from) hundreds of dispatchers that stand for other machines.
func startWorker(tb testing.TB, name string, handlers map[string]workers.Handler, boot *member, settings func(*config.Config), opts ...node.Option) *member {
	tb.Helper()
	cfg := testDispatchConfig(tb)
	settings(&cfg)
	cfg.SetDefaults()
	reg := workers.NewRegistry()
	for n, h := range handlers {
		if err := reg.Register(n, h); err != nil {
			tb.Fatal(err)
		}
	}
	cfg.Node.WorkTypes = reg.Names()
	if boot != nil {
		cfg.Node.Bootstrap = addrStrings(boot.node)
	}
	local, err := pool.New(reg, cfg.Worker, testLogger())
	if err != nil {
		tb.Fatal(err)
	}
	n := startNode(tb, cfg.Node, append([]node.Option{node.WithLocalState(pool.NewLocalState(local))}, opts...)...)
	server, err := protocol.NewServer(n.Host(), n.Network(), local, protocol.WithLogger(testLogger()))
	if err != nil {
		tb.Fatal(err)
	}
	m := &member{name: name, node: n, pool: local, server: server, cancel: func() {}, done: make(chan struct{})}
	close(m.done) // no dispatcher to wait for
	tb.Cleanup(m.stop)
	return m
}

// errDispatch says a dispatched request did not end as expected.
var errDispatch = errors.New("dispatch")
