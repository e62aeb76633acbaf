package tests

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/builtin"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// BenchmarkVerifyVsSingle compares, in one run, a request verified 2/3
// (three distinct workers, results compared) with a single attempt, on a
// gateway and three sha256 workers with real libp2p hosts on loopback:
// the CPU of the whole process per request and the p50 latency, one
// request at a time. Blocks of 20 requests of each kind alternate, so that
// both see the same machine. The goals are a CPU ratio of at most
// 3.2 and a p50 ratio of at most 1.5; they are reported, not asserted.
//
// A verified request runs two replicas at once, on two workers. Beside it
// runs a third kind, in blocks of its own: two plain requests sent at once
// (pair-p50: the time until both are answered), what the same two attempts
// cost without verification. pair-ratio (verified over pair) is what the
// verification itself adds.
//
// sha256 takes microseconds, so on one machine the three replicas' CPU
// (gateway and workers share its cores) is what their latency is made of;
// "work-1ms" adds a millisecond of waiting to each run, as work or a
// network hop does, which is what a verified request runs in parallel.
func BenchmarkVerifyVsSingle(b *testing.B) {
	reg, err := builtin.NewRegistry("sha256")
	if err != nil {
		b.Fatal(err)
	}
	h, _ := reg.Get("sha256")
	b.Run("sha256", func(b *testing.B) { benchVerify(b, h) })
	b.Run("work-1ms", func(b *testing.B) {
		benchVerify(b, workers.HandlerFunc(func(ctx context.Context, p []byte) workers.Result {
			t := time.NewTimer(time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			return h.Do(ctx, p)
		}))
	})
}

func benchVerify(b *testing.B, h workers.Handler) {
	hits := newHitCounter()
	quiet := func(c *config.Config) { c.Node.LogLevel = "warn" }
	gw := startMember(b, hits, memberSpec{name: "gw", cfg: quiet}, nil)
	var ws []*member
	for _, name := range []string{"w1", "w2", "w3"} {
		ws = append(ws, startMember(b, hits, memberSpec{name: name, handlers: map[string]workers.Handler{"sha256": h}, cfg: quiet}, gw))
	}
	waitRanked(b, gw, "sha256", 3)
	run := func(i int, v config.Verify) time.Duration {
		start := time.Now()
		res := gw.disp.Dispatch(context.Background(), dispatch.WorkRequest{Type: "sha256", Payload: []byte("payload " + strconv.Itoa(i)), Timeout: 5 * time.Second, Verify: v})
		took := time.Since(start)
		if res.Status != "ok" {
			b.Fatalf("request %d (verify %s): %s", i, v, describe(res, peerName(ws...)))
		}
		return took
	}
	verify := config.Verify{Replicas: 3, Agree: 2}
	for i := range 100 { // warm up: every worker rated, connections open
		run(i, config.Verify{})
		run(i, verify)
	}
	// pair sends two plain requests at once and returns the time until
	// both are answered.
	pair := func(i int) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for k := range 2 {
			wg.Go(func() {
				res := gw.disp.Dispatch(context.Background(), dispatch.WorkRequest{Type: "sha256", Payload: []byte("pair " + strconv.Itoa(2*i+k)), Timeout: 5 * time.Second})
				if res.Status != "ok" {
					b.Errorf("pair %d: %s", i, describe(res, peerName(ws...)))
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	const block = 20
	var single, verified, pairs []time.Duration
	var cpuSingle, cpuVerified time.Duration
	b.ResetTimer()
	for n := 0; n < b.N; n += block {
		c0 := cpuTime(b)
		for i := range block {
			single = append(single, run(n+i, config.Verify{}))
		}
		c1 := cpuTime(b)
		for i := range block {
			verified = append(verified, run(n+i, verify))
		}
		c2 := cpuTime(b)
		cpuSingle += c1 - c0
		cpuVerified += c2 - c1
		for i := range block {
			pairs = append(pairs, pair(n+i))
		}
	}
	b.StopTimer()
	p50s, p50v, p50p := percentile(single, 50), percentile(verified, 50), percentile(pairs, 50)
	b.ReportMetric(float64(p50p.Microseconds()), "pair-p50-µs")
	b.ReportMetric(float64(p50v)/float64(p50p), "pair-ratio")
	b.ReportMetric(float64(p50s.Microseconds()), "single-p50-µs")
	b.ReportMetric(float64(p50v.Microseconds()), "verify-p50-µs")
	b.ReportMetric(float64(p50v)/float64(p50s), "p50-ratio")
	b.ReportMetric(float64(cpuSingle.Microseconds())/float64(len(single)), "single-cpu-µs/req")
	b.ReportMetric(float64(cpuVerified.Microseconds())/float64(len(verified)), "verify-cpu-µs/req")
	b.ReportMetric(float64(cpuVerified)/float64(cpuSingle), "cpu-ratio")
}
