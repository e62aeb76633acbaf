package tests

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// hedgeWork is a "sleep" handler (the built-in type's name, so that every
// gateway knows it is idempotent) that takes base, or 50 times base for one
// request in ten when slow is set: a worker with a slow tail. It stops when
// its request is cancelled, as the built-in sleep does.
func hedgeWork(base time.Duration, slow bool) workers.Handler {
	var n atomic.Uint64
	return workers.HandlerFunc(func(ctx context.Context, p []byte) workers.Result {
		d := base
		if slow && n.Add(1)%10 == 0 {
			d = 50 * base
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return workers.OK(p)
		case <-ctx.Done():
			return workers.Fail(workers.RetryableError, "cancelled: %v", context.Cause(ctx))
		}
	})
}

// hedgeRun is one gateway setting's requests.
type hedgeRun struct {
	name   string
	hedge  func(*config.HedgeConfig)
	gw     *member
	out    []outcome
	hedges int
}

// BenchmarkPerfHedgeMeasured compares five gateways of one network, one
// after another on the same three workers, one of which answers one request
// in ten 50 times slower than its median: no hedging, hedging after the
// fixed hedge-delay (100ms, the default), hedging after the measured delay
// (the shipped defaults: twice the p95 of the recent successes of the work
// type, within 2ms..1s), the same with hedge-quantile 0.99, and with
// hedge-delay-factor 1 (the bare p95), to show what quantile and factor
// trade. Each gateway is round-robin, so that every worker takes
// a third of the first attempts whatever the setting (rating would learn to
// avoid the slow worker without hedging and not with it, which is another
// comparison), may try the three workers, and sends at most one hedge. Two
// work types: work=10ms (then 500ms), where the fixed 100ms lies between the
// normal answers and the slow ones, its best case; and work=120ms (then
// 6s), work slower than the fixed delay. Goals: p99 with measured hedging
// at most a fifth of p99 without hedging, and at most 1.1x the hedges fired
// of the fixed delay.
func BenchmarkPerfHedgeMeasured(b *testing.B) {
	b.Run("work=10ms", func(b *testing.B) { benchHedge(b, 10*time.Millisecond, 8, 200, 1500) })
	b.Run("work=120ms", func(b *testing.B) { benchHedge(b, 120*time.Millisecond, 32, 100, 600) })
}

// benchHedge runs callers callers per gateway, warm requests, then count
// counted, on work of base (50 times base for one in ten of the slow
// worker's requests).
func benchHedge(b *testing.B, base time.Duration, callers, warm, count int) {
	hits := newHitCounter()
	runs := []*hedgeRun{
		{name: "none", hedge: func(h *config.HedgeConfig) { h.MaxCount = 0 }},
		{name: "fixed", hedge: func(h *config.HedgeConfig) { h.MaxCount, h.Quantile = 1, 0 }},
		{name: "measured", hedge: func(h *config.HedgeConfig) { h.MaxCount = 1 }},
		{name: "measured-q99", hedge: func(h *config.HedgeConfig) { h.MaxCount, h.Quantile = 1, 0.99 }},
		{name: "measured-x1", hedge: func(h *config.HedgeConfig) { h.MaxCount, h.Factor = 1, 1 }},
	}
	var boot *member
	for _, r := range runs {
		r.gw = startMember(b, hits, memberSpec{name: "gw-" + r.name, cfg: func(c *config.Config) {
			faultSettings(config.ModeRoundRobin)(c)
			r.hedge(&c.Hedge)
		}}, boot)
		if boot == nil {
			boot = r.gw
		}
	}
	var ws []*member
	for i := range 3 {
		ws = append(ws, startMember(b, hits, memberSpec{
			name: fmt.Sprintf("w%d", i),
			cfg: func(c *config.Config) {
				productionSettings(c)
				// Sleeping takes no CPU: room for every caller and its
				// hedge, so that no request waits in a worker's queue.
				c.Worker.LocalConcurrency = 2 * callers
			},
			handlers: map[string]workers.Handler{"sleep": hedgeWork(base, i == 0)},
		}, boot))
	}
	for _, r := range runs {
		waitRanked(b, r.gw, "sleep", len(ws))
	}
	req := dispatch.WorkRequest{Type: "sleep", Payload: []byte("x"), Timeout: max(5*time.Second, 100*base)}
	for b.Loop() {
		for _, r := range runs {
			closedLoopGateways([]*member{r.gw}, callers, warm, 60*time.Second, req)
			r.out = closedLoopGateways([]*member{r.gw}, callers, count, 60*time.Second, req)[0]
		}
	}
	name := peerName(ws...)
	p99 := map[string]time.Duration{}
	hedges := map[string]int{}
	for _, r := range runs {
		won := 0
		for _, o := range r.out {
			if o.res.Status != apiv1.StatusOK {
				b.Errorf("%s: a request failed: %s", r.name, describe(o.res, name))
				break
			}
			for _, a := range o.res.Attempts {
				if a.Hedge {
					r.hedges++
					if a.Peer == o.res.Worker {
						won++
					}
				}
			}
		}
		lat := latencies(r.out)
		p99[r.name], hedges[r.name] = percentile(lat, 99), r.hedges
		d, n, measured := r.gw.disp.Selector().HedgeDelay("sleep")
		b.Logf("%s: %d requests, p50 %s p99 %s max %s; %d hedges fired, %d won; hedge delay now %s (measured %v, %d samples)",
			r.name, len(r.out), percentile(lat, 50), p99[r.name], percentile(lat, 100), r.hedges, won, d, measured, n)
	}
	for _, r := range runs {
		b.ReportMetric(ms(p99[r.name]), r.name+"-p99-ms")
		if r.name != "none" {
			b.ReportMetric(float64(hedges[r.name]), r.name+"-hedges")
		}
	}
	b.ReportMetric(float64(p99["measured"])/float64(p99["none"]), "p99-ratio")
	b.ReportMetric(float64(p99["measured-q99"])/float64(p99["none"]), "p99-ratio-q99")
	if hedges["fixed"] > 0 {
		b.ReportMetric(float64(hedges["measured"])/float64(hedges["fixed"]), "hedge-ratio")
		b.ReportMetric(float64(hedges["measured-q99"])/float64(hedges["fixed"]), "hedge-ratio-q99")
	}
}
