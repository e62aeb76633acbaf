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
// ratio is the median of the per-round ratios. Goal: at least 0.7.
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
		ids[i] = w.node.ID()
	}
	payload := bytes.Repeat([]byte("x"), 256)
	var turn atomic.Uint64
	bare := func(ctx context.Context, _ int) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return bareEcho(ctx, gw.node.Host(), ids[turn.Add(1)%uint64(len(ids))], payload)
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

	var dRates, bRates, ratios []float64
	var dFailed, bFailed int
	for b.Loop() {
		dRates, bRates, ratios = nil, nil, nil
		for r := range rounds {
			var d, s phaseResult
			if r%2 == 0 {
				d = closedLoop(callers, perPhase, limit, dispatch)
				s = closedLoop(callers, perPhase, limit, bare)
			} else {
				s = closedLoop(callers, perPhase, limit, bare)
				d = closedLoop(callers, perPhase, limit, dispatch)
			}
			if d.firstErr != nil || s.firstErr != nil {
				b.Logf("round %d: dispatch %d failed (%v), bare %d failed (%v)", r, d.failed, d.firstErr, s.failed, s.firstErr)
			}
			dFailed += d.failed
			bFailed += s.failed
			dRates = append(dRates, d.rate())
			bRates = append(bRates, s.rate())
			ratios = append(ratios, d.rate()/s.rate())
		}
	}
	dm, bm, ratio := median(dRates), median(bRates), median(ratios)
	reportFigure(b, dm, bm, "req/s", ratio)
	b.ReportMetric(float64(dFailed), "workmesh-failed")
	b.ReportMetric(float64(bFailed), "baseline-failed")
	b.Logf("%d callers, %d rounds: dispatch %.0f req/s, bare %.0f req/s (medians), ratio %.2f; failed: dispatch %d, bare %d; served w1 %d w2 %d",
		callers, rounds, dm, bm, ratio, dFailed, bFailed,
		ws[0].server.Stats().ByOutcome[workers.Success], ws[1].server.Stats().ByOutcome[workers.Success])
}
