package stack

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// TestLoadChangeAlonePublishesNoRecord: a node whose local worker goes from
// idle to busy and back re-signs no record for it (its load travels in the
// answers to work and to health pings). Two sleeps of 1.5s run on the local
// worker, longer than the second within which the node used to re-announce
// a load change, and the node's record keeps its sequence throughout.
func TestLoadChangeAlonePublishesNoRecord(t *testing.T) {
	cfg := config.Defaults()
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.Node.API = ""
	cfg.Node.DataDir = t.TempDir()
	cfg.Node.Network = "load-test"
	cfg.Node.WorkTypes = []string{"sleep"}
	log := logrus.New()
	log.SetOutput(io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := Start(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	seq := s.Node().NodeData().Data.Sequence

	var wg sync.WaitGroup
	results := make([]dispatch.WorkResult, 2)
	for i := range results {
		wg.Go(func() {
			results[i] = s.Dispatch(ctx, dispatch.WorkRequest{Type: "sleep", Payload: []byte("1500ms"), Timeout: 10 * time.Second})
		})
	}
	wg.Wait()
	for i, r := range results {
		if r.Status != apiv1.StatusOK || r.Worker != dispatch.LocalWorker {
			t.Fatalf("sleep %d: %s on %q (%s), want ok on the local worker", i, r.Status, r.Worker, r.Error)
		}
	}
	if got := s.Node().NodeData().Data.Sequence; got != seq {
		t.Errorf("the record was re-signed (sequence %d, was %d) while only the load changed", got, seq)
	}
}
