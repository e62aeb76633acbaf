package stack

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// BenchmarkRecordPublishRate measures how often a whole node publishes its
// own record on gossip (each publication reaches every node of the
// network), per second: over a window of the node idle (publish/s-idle) and
// one with its local worker under load, four callers running sleeps of 5
// to 95ms back to back (publish/s-load). Load changes publish nothing: what is left
// is the announce-interval refresh (every 5m by default), which a window of
// seconds rarely sees. Each window is 3s.
func BenchmarkRecordPublishRate(b *testing.B) {
	window := 3 * time.Second
	cfg := config.Defaults()
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.Node.API = ""
	cfg.Node.DataDir = b.TempDir()
	cfg.Node.Network = "publish-bench"
	cfg.Node.WorkTypes = []string{"sleep"}
	log := logrus.New()
	log.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := Start(ctx, cfg, log)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	measure := func(load bool) float64 {
		wctx, stop := context.WithTimeout(ctx, window)
		defer stop()
		var wg sync.WaitGroup
		if load {
			for c := range 4 {
				wg.Go(func() {
					// Sleeps of 5 to 95ms, so that the load seen at any
					// moment varies.
					for i := c; wctx.Err() == nil; i++ {
						d := fmt.Sprintf("%dms", 5+(i*37)%91)
						s.Dispatch(wctx, dispatch.WorkRequest{Type: "sleep", Payload: []byte(d), Timeout: time.Second})
					}
				})
			}
		}
		before, t0 := s.Node().RecordsPublished(), time.Now()
		<-wctx.Done() // the measurement window itself
		wg.Wait()
		return float64(s.Node().RecordsPublished()-before) / time.Since(t0).Seconds()
	}
	var idle, loaded float64
	for b.Loop() {
		idle = measure(false)
		loaded = measure(true)
	}
	b.ReportMetric(idle, "publish/s-idle")
	b.ReportMetric(loaded, "publish/s-load")
}
