package tests

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
	"github.com/workmesh/workmesh/workers/protocol"
)

const bareEchoProtocol = "/workmesh-bench/echo/1.0.0"

// BenchmarkDispatchEchoVsBareStream compares, on the same two hosts and in
// the same run, a remote echo through the full dispatch path (dispatcher,
// selection plan, work protocol; no HTTP) with a bare libp2p stream echo of
// the same payload. The two alternate so that load on a shared machine hits
// both alike. Goal: dispatch median at most 1.25x the bare median.
//
// A third echo, bare too, runs on one long-lived stream of its own
// (bareStreamEchoProtocol), the cost a request pays when it neither opens
// a stream nor negotiates a protocol: long-median-us, and ratio-long
// (dispatch over it). Goal: ratio-long at most 1.3. A fourth, the work
// protocol's client called directly on the same hosts (no dispatcher),
// shows how the difference divides: protocol-median-us.
func BenchmarkDispatchEchoVsBareStream(b *testing.B) {
	hits := newHitCounter()
	gw := startMember(b, hits, memberSpec{name: "gateway"}, nil)
	w := startMember(b, hits, memberSpec{name: "worker", handlers: map[string]workers.Handler{"echo": echoHandler()}}, gw)
	waitRanked(b, gw, "echo", 1)
	serveBareEcho(w.node.Host())
	serveBareStreamEcho(w.node.Host())
	payload := bytes.Repeat([]byte("x"), 256)
	ctx := context.Background()
	bs, err := openBareStream(ctx, gw.node.Host(), w.node.ID())
	if err != nil {
		b.Fatal(err)
	}
	defer bs.close()
	pc, err := protocol.NewClient(gw.node.Host(), gw.node.Network())
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()
	direct := func() time.Duration {
		start := time.Now()
		resp, err := pc.Do(ctx, w.node.ID(), protocol.Request{ID: "direct", Type: "echo", Payload: payload, Timeout: 5 * time.Second, AcceptTimeout: 500 * time.Millisecond})
		took := time.Since(start)
		if err != nil || resp.Outcome != workers.Success || len(resp.Output) != len(payload) {
			b.Fatalf("protocol echo: %v %v", resp.Outcome, err)
		}
		return took
	}
	long := func() time.Duration {
		start := time.Now()
		if err := bs.echo(payload); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	bare := func() time.Duration {
		start := time.Now()
		if err := bareEcho(ctx, gw.node.Host(), w.node.ID(), payload); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	worker := w.node.ID().String()
	dispatch := func() time.Duration {
		start := time.Now()
		res := gw.disp.Dispatch(ctx, dispatch.WorkRequest{Type: "echo", Payload: payload, Timeout: 5 * time.Second})
		took := time.Since(start) // the check below is the benchmark's, not dispatch's
		if res.Status != apiv1.StatusOK || res.Worker != worker || len(res.Output) != len(payload) {
			b.Fatalf("dispatch: %s", describe(res, peerName(gw, w)))
		}
		return took
	}
	for range 50 { // warm up connections, streams and the rating
		bare()
		dispatch()
		long()
		direct()
	}
	var bareTimes, dispatchTimes, longTimes, directTimes []time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		bareTimes = append(bareTimes, bare())
		dispatchTimes = append(dispatchTimes, dispatch())
		longTimes = append(longTimes, long())
		directTimes = append(directTimes, direct())
	}
	b.StopTimer()
	mb, md := median(bareTimes), median(dispatchTimes)
	b.ReportMetric(float64(md.Microseconds()), "dispatch-median-us")
	b.ReportMetric(float64(mb.Microseconds()), "bare-median-us")
	b.ReportMetric(float64(md)/float64(mb), "ratio")
	ml := median(longTimes)
	b.ReportMetric(float64(ml.Microseconds()), "long-median-us")
	b.ReportMetric(float64(md)/float64(ml), "ratio-long")
	b.ReportMetric(float64(median(directTimes).Microseconds()), "protocol-median-us")
}
