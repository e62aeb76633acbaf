package tests

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// BenchmarkPerfThroughputVsBareStream measures requests per second with one
// dispatcher and two remote echo workers under 64 concurrent callers
// (Dispatcher.Dispatch, no HTTP), against bare libp2p stream echoes from the
// same gateway host to the same two worker hosts, 64 callers, alternating
// between the two workers. The phases alternate (the order flips every
// round); each phase is bounded by a request count and a time limit.
// ratio is the median of the per-round ratios. Goal: at least 1.5 (it
// was 0.7 while every dispatch opened a stream of its own).
//
// A third phase runs the bare echo on long-lived streams (one per caller
// and worker, bareStreamEchoProtocol): long-req/s and ratio-long. Each
// phase's process CPU (both ends run in this process) per successful
// request is reported too: workmesh-cpu-us/req, baseline-cpu-us/req
// (new-stream echo) and long-cpu-us/req (medians of the rounds).
//
// Settings: the shipped defaults (rating mode, rating-spread 1,
// max-remote-workers 16 behind the retry budget, worker-timeout 500ms,
// poll-interval 2s), 256-byte
// payloads, request timeout 5s.
func BenchmarkPerfThroughputVsBareStream(b *testing.B) {
	const (
		callers  = 64
		rounds   = 6
		perPhase = 10000
		limit    = 4 * time.Second
	)
	hits := newHitCounter()
	gw := startMember(b, hits, memberSpec{name: "gateway", cfg: productionSettings}, nil)
	ws := []*member{
		startMember(b, hits, memberSpec{name: "w1", cfg: productionSettings, handlers: map[string]workers.Handler{"echo": echoHandler()}}, gw),
		startMember(b, hits, memberSpec{name: "w2", cfg: productionSettings, handlers: map[string]workers.Handler{"echo": echoHandler()}}, gw),
	}
	waitRanked(b, gw, "echo", len(ws))
	ids := make([]peer.ID, len(ws))
	for i, w := range ws {
		serveBareEcho(w.node.Host())
		serveBareStreamEcho(w.node.Host())
		ids[i] = w.node.ID()
	}
	streams := newBareStreams(gw.node.Host())
	defer streams.closeAll()
	payload := bytes.Repeat([]byte("x"), 256)
	var turn atomic.Uint64
	bare := func(ctx context.Context, _ int) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return bareEcho(ctx, gw.node.Host(), ids[turn.Add(1)%uint64(len(ids))], payload)
	}
	long := func(ctx context.Context, caller int) error {
		i := int(turn.Add(1) % uint64(len(ids)))
		s, err := streams.get(ctx, caller, i, ids[i])
		if err != nil {
			return err
		}
		if err := s.echo(payload); err != nil {
			streams.drop(caller, i)
			return err
		}
		return nil
	}
	dispatch := func(ctx context.Context, _ int) error {
		res := gw.disp.Dispatch(ctx, dispatch.WorkRequest{Type: "echo", Payload: payload, Timeout: 5 * time.Second})
		if res.Status != apiv1.StatusOK || res.Worker == dispatch.LocalWorker || len(res.Output) != len(payload) {
			return fmt.Errorf("%w: %s", errDispatch, describe(res, peerName(append(ws, gw)...)))
		}
		return nil
	}
	// Warm up connections, stream handlers and the rating.
	closedLoop(callers, 2000, limit, bare)
	closedLoop(callers, 2000, limit, dispatch)
	closedLoop(callers, 2000, limit, long)

	// phase runs one closed loop and measures the process CPU it took
	// per successful request, in microseconds.
	phase := func(call func(ctx context.Context, caller int) error) (phaseResult, float64) {
		c0 := cpuTime(b)
		res := closedLoop(callers, perPhase, limit, call)
		return res, float64((cpuTime(b) - c0).Microseconds()) / float64(max(res.ok, 1))
	}
	var dRates, bRates, lRates, ratios, longRatios, dCPU, bCPU, lCPU []float64
	var dFailed, bFailed, lFailed int
	for b.Loop() {
		dRates, bRates, lRates, ratios, longRatios, dCPU, bCPU, lCPU = nil, nil, nil, nil, nil, nil, nil, nil
		for r := range rounds {
			var d, s, l phaseResult
			var dc, sc, lc float64
			if r%2 == 0 {
				d, dc = phase(dispatch)
				s, sc = phase(bare)
				l, lc = phase(long)
			} else {
				l, lc = phase(long)
				s, sc = phase(bare)
				d, dc = phase(dispatch)
			}
			if d.firstErr != nil || s.firstErr != nil || l.firstErr != nil {
				b.Logf("round %d: dispatch %d failed (%v), bare %d failed (%v), long-lived %d failed (%v)", r, d.failed, d.firstErr, s.failed, s.firstErr, l.failed, l.firstErr)
			}
			dFailed += d.failed
			bFailed += s.failed
			lFailed += l.failed
			dRates = append(dRates, d.rate())
			bRates = append(bRates, s.rate())
			lRates = append(lRates, l.rate())
			ratios = append(ratios, d.rate()/s.rate())
			longRatios = append(longRatios, d.rate()/l.rate())
			dCPU, bCPU, lCPU = append(dCPU, dc), append(bCPU, sc), append(lCPU, lc)
		}
	}
	dm, bm, lm, ratio := median(dRates), median(bRates), median(lRates), median(ratios)
	reportFigure(b, dm, bm, "req/s", ratio)
	b.ReportMetric(lm, "long-req/s")
	b.ReportMetric(median(longRatios), "ratio-long")
	b.ReportMetric(float64(dFailed), "workmesh-failed")
	b.ReportMetric(float64(bFailed), "baseline-failed")
	b.ReportMetric(float64(lFailed), "long-failed")
	dc, bc, lc := median(dCPU), median(bCPU), median(lCPU)
	b.ReportMetric(dc, "workmesh-cpu-us/req")
	b.ReportMetric(bc, "baseline-cpu-us/req")
	b.ReportMetric(lc, "long-cpu-us/req")
	b.ReportMetric(dc/bc, "cpu-ratio")
	b.ReportMetric(dc/lc, "cpu-ratio-long")
	b.Logf("%d callers, %d rounds: dispatch %.0f req/s, bare %.0f req/s, bare long-lived %.0f req/s (medians), ratio %.2f; CPU per request: dispatch %.1fus, bare %.1fus, long-lived %.1fus; failed: dispatch %d, bare %d, long-lived %d; served w1 %d w2 %d",
		callers, rounds, dm, bm, lm, ratio, dc, bc, lc, dFailed, bFailed, lFailed,
		ws[0].server.Stats().ByOutcome[workers.Success], ws[1].server.Stats().ByOutcome[workers.Success])
}
