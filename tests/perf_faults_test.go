package tests

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// faultSettings are the gateways' settings in the fault figures: the
// shipped defaults (connect-timeout 1s, worker-timeout 500ms,
// worker-response-timeout 250ms, poll-interval 2s, poll-failure-threshold
// 5, rating-spread 1, retry-delay 10ms) except that a request may try three
// distinct workers, so that a dead or failing pick is retried elsewhere.
func faultSettings(mode string) func(*config.Config) {
	return func(c *config.Config) {
		productionSettings(c)
		c.Worker.MaxRemoteWorkers = 3
		c.Worker.MaxRetries = 2
		c.Selection.Mode = mode
	}
}

// gatewayPair is one network with two gateways that differ only in their
// selection mode, and the workers both of them dispatch to.
type gatewayPair struct {
	rating, rr *member
	workers    []*member
}

// startGatewayPair starts a rating gateway, a round-robin gateway and n
// workers whose handler for "echo" is made by handler, and waits until
// both gateways rank every worker alive.
func startGatewayPair(b *testing.B, n int, handler func(i int) workers.Handler) gatewayPair {
	b.Helper()
	hits := newHitCounter()
	p := gatewayPair{rating: startMember(b, hits, memberSpec{name: "rating", cfg: faultSettings(config.ModeRating)}, nil)}
	p.rr = startMember(b, hits, memberSpec{name: "round-robin", cfg: faultSettings(config.ModeRoundRobin)}, p.rating)
	for i := range n {
		p.workers = append(p.workers, startMember(b, hits, memberSpec{
			name: fmt.Sprintf("w%d", i), cfg: productionSettings,
			handlers: map[string]workers.Handler{"echo": handler(i)},
		}, p.rating))
	}
	waitRanked(b, p.rating, "echo", n)
	waitRanked(b, p.rr, "echo", n)
	return p
}

// outcome is one request's end as a caller saw it.
type outcome struct {
	took time.Duration
	res  dispatch.WorkResult
}

// openLoop sends a request from each gateway every interval (both at the
// same moments), count times or until limit, whichever ends first, without
// waiting for answers: a slow answer does not slow the arrivals, so the
// latencies include the queueing a stalled worker causes. It returns the
// outcomes per gateway once every request has ended.
func openLoop(gws []*member, count int, interval, limit time.Duration, req dispatch.WorkRequest) [][]outcome {
	out := make([][]outcome, len(gws))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 512) // requests in flight at once, all gateways
	start := time.Now()
	for i := 0; i < count && time.Since(start) < limit; i++ {
		for g, gw := range gws {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				t := time.Now()
				res := gw.disp.Dispatch(context.Background(), req)
				mu.Lock()
				out[g] = append(out[g], outcome{took: time.Since(t), res: res})
				mu.Unlock()
			})
		}
		time.Sleep(time.Until(start.Add(time.Duration(i+1) * interval)))
	}
	wg.Wait()
	return out
}

// closedLoopGateways runs callers concurrent callers per gateway, every
// gateway at once, until each gateway sent count requests or limit passed.
func closedLoopGateways(gws []*member, callers, count int, limit time.Duration, req dispatch.WorkRequest) [][]outcome {
	out := make([][]outcome, len(gws))
	var wg sync.WaitGroup
	deadline := time.Now().Add(limit)
	for g, gw := range gws {
		var next atomic.Int64
		var mu sync.Mutex
		for range callers {
			wg.Go(func() {
				for next.Add(1) <= int64(count) && time.Now().Before(deadline) {
					t := time.Now()
					res := gw.disp.Dispatch(context.Background(), req)
					mu.Lock()
					out[g] = append(out[g], outcome{took: time.Since(t), res: res})
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return out
}

func latencies(outs []outcome) []time.Duration {
	d := make([]time.Duration, len(outs))
	for i, o := range outs {
		d[i] = o.took
	}
	return d
}

func failures(outs []outcome) int {
	n := 0
	for _, o := range outs {
		if o.res.Status != apiv1.StatusOK {
			n++
		}
	}
	return n
}

// BenchmarkPerfDeadWorkersP99 measures the p99 latency of requests while 3
// of 10 eligible workers are dead, through a rating gateway and a
// round-robin gateway of the same network at the same moments: the three
// workers are stopped (two of their UDP ports become black holes that
// swallow every packet, the third stays closed) and from that instant both
// gateways receive one request every 20ms each, 500 requests, open loop.
// The p99 covers the whole window, including the time the dead workers
// take to be found out, because that is when the two modes differ; after
// it both skip them. Goal: the rating p99 at most a fifth of the
// round-robin p99 (ratio <= 0.2).
//
// Which workers die matters to rating mode, which sends every request to
// its best-ranked worker (rating-spread 1): dead=top3 kills the rating
// gateway's three best-ranked workers (its worst case), dead=others kills
// three it ranks below its favourite.
func BenchmarkPerfDeadWorkersP99(b *testing.B) {
	for _, c := range []struct {
		name string
		pick func(ranked []int) []int
	}{
		{"dead=top3", func(r []int) []int { return r[:3] }},
		{"dead=others", func(r []int) []int { return []int{r[3], r[6], r[9]} }},
	} {
		b.Run(c.name, func(b *testing.B) { benchDeadWorkers(b, c.pick) })
	}
}

func benchDeadWorkers(b *testing.B, pick func(ranked []int) []int) {
	const (
		workersN = 10
		count    = 500
		interval = 20 * time.Millisecond
	)
	p := startGatewayPair(b, workersN, func(int) workers.Handler { return echoHandler() })
	gws := []*member{p.rating, p.rr}
	req := dispatch.WorkRequest{Type: "echo", Payload: bytes.Repeat([]byte("x"), 256), Timeout: 5 * time.Second}
	// Warm-up: every worker rated by the rating gateway, every worker
	// visited by the round-robin one.
	closedLoopGateways(gws, 4, 300, 20*time.Second, req)
	p.rating.disp.Selector().Refresh()

	// The rating gateway's order of the workers, best first.
	index := map[string]int{}
	for i, w := range p.workers {
		index[string(w.node.ID())] = i
	}
	var ranked []int
	for _, r := range p.rating.disp.Selector().Ranking("echo") {
		if i, ok := index[r.Peer]; ok && !slices.Contains(ranked, i) {
			ranked = append(ranked, i)
		}
	}
	if len(ranked) != workersN {
		b.Fatalf("rating gateway ranks %d workers, want %d", len(ranked), workersN)
	}
	var out [][]outcome
	for b.Loop() {
		for k, i := range pick(ranked) {
			w := p.workers[i]
			w.stop()
			if k < 2 {
				blackHole(b, w)
			}
		}
		out = openLoop(gws, count, interval, 30*time.Second, req)
	}
	rp99, bp99 := percentile(latencies(out[0]), 99), percentile(latencies(out[1]), 99)
	reportFigure(b, ms(rp99), ms(bp99), "ms", float64(rp99)/float64(bp99))
	b.ReportMetric(float64(failures(out[0])), "workmesh-failed")
	b.ReportMetric(float64(failures(out[1])), "baseline-failed")
	b.Logf("rating: %d requests, p50 %s p99 %s max %s, %d failed; round-robin: %d requests, p50 %s p99 %s max %s, %d failed",
		len(out[0]), percentile(latencies(out[0]), 50), rp99, percentile(latencies(out[0]), 100), failures(out[0]),
		len(out[1]), percentile(latencies(out[1]), 50), bp99, percentile(latencies(out[1]), 100), failures(out[1]))
	name := peerName(append(p.workers, p.rating, p.rr)...)
	for g, outs := range out {
		slow := 0
		for _, o := range outs {
			if o.took > 100*time.Millisecond {
				slow++
			}
		}
		worst := slices.MaxFunc(outs, func(a, b outcome) int { return cmp.Compare(a.took, b.took) })
		b.Logf("%s: %d requests over 100ms; slowest (%s): %s", gws[g].name, slow, worst.took, describe(worst.res, name))
		att := map[string]int{}
		for _, o := range outs {
			for _, a := range o.res.Attempts {
				att[name(a.Peer)+" "+a.Outcome.String()]++
			}
		}
		b.Logf("%s: attempts by worker and outcome: %v", gws[g].name, att)
	}
}

// BenchmarkPerfFlakyWorkerShare measures the share of requests that reach a
// worker failing every other request it gets (a retryable error), after a
// warm-up, through a rating gateway and a round-robin gateway of the same
// network with five workers, at the same time: 4 callers per gateway, 300
// warm-up requests, then 600 counted. A request counts when any of its
// attempts went to the flaky worker. Goal: the rating share at most a
// fifth of the round-robin share (ratio <= 0.2).
func BenchmarkPerfFlakyWorkerShare(b *testing.B) {
	const workersN = 5
	var calls atomic.Uint64
	flaky := workers.HandlerFunc(func(_ context.Context, p []byte) workers.Result {
		if calls.Add(1)%2 == 0 {
			return workers.Fail(workers.RetryableError, "flaky: every other request fails")
		}
		return workers.OK(p)
	})
	p := startGatewayPair(b, workersN, func(i int) workers.Handler {
		if i == 0 {
			return flaky
		}
		return echoHandler()
	})
	flakyID := p.workers[0].node.ID().String()
	gws := []*member{p.rating, p.rr}
	req := dispatch.WorkRequest{Type: "echo", Payload: bytes.Repeat([]byte("x"), 256), Timeout: 5 * time.Second}
	closedLoopGateways(gws, 4, 300, 30*time.Second, req)
	var out [][]outcome
	for b.Loop() {
		out = closedLoopGateways(gws, 4, 600, 30*time.Second, req)
	}
	share := make([]float64, len(out))
	for g, outs := range out {
		reached := 0
		for _, o := range outs {
			if slices.ContainsFunc(o.res.Attempts, func(a apiv1.Attempt) bool { return a.Peer == flakyID }) {
				reached++
			}
		}
		share[g] = float64(reached) / float64(len(outs))
	}
	ratio := 0.0
	if share[1] > 0 {
		ratio = share[0] / share[1]
	}
	reportFigure(b, 100*share[0], 100*share[1], "%", ratio)
	b.ReportMetric(float64(failures(out[0])), "workmesh-failed")
	b.ReportMetric(float64(failures(out[1])), "baseline-failed")
	b.Logf("share reaching the flaky worker: rating %.1f%% of %d (%d failed), round-robin %.1f%% of %d (%d failed)",
		100*share[0], len(out[0]), failures(out[0]), 100*share[1], len(out[1]), failures(out[1]))
}
