package dispatch

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/workertest"
)

// holdingDispatcher is a dispatcher with no peers whose local worker serves
// "hold" with g.
func holdingDispatcher(t *testing.T, g *workertest.Gate) *Dispatcher {
	t.Helper()
	cfg := config.Defaults()
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.Node.API = ""
	cfg.Node.DataDir = t.TempDir()
	cfg.Node.Network = workertest.Network
	cfg.Node.WorkTypes = []string{"hold"}
	workertest.Must(t, cfg.Validate())
	pool := workertest.NewPool(t, 4, 16, map[string]workers.Handler{"hold": g})
	n, err := node.New(context.Background(), cfg.Node, node.WithLogger(workertest.QuietLogger()))
	workertest.Must(t, err)
	t.Cleanup(func() { _ = n.Close() })
	d, err := New(cfg, n, pool, WithLogger(workertest.QuietLogger()))
	workertest.Must(t, err)
	return d
}

// TestDispatcher_DrainRefusesNewWorkAndWaitsForTaken: once draining, a
// dispatcher answers new requests unavailable at once, and Drain returns
// only when the request it had taken has ended, with its result intact.
func TestDispatcher_DrainRefusesNewWorkAndWaitsForTaken(t *testing.T) {
	g := workertest.NewGate(false)
	defer g.Open()
	d := holdingDispatcher(t, g)
	results := make(chan WorkResult, 1)
	go func() {
		results <- d.Dispatch(context.Background(), WorkRequest{Type: "hold", Payload: []byte("taken")})
	}()
	workertest.Recv(t, g.Started, "the taken request to start")
	if got := d.InFlight(); got != 1 {
		t.Errorf("InFlight %d, want 1", got)
	}

	// Drain cannot end while the taken request runs: with a context that
	// has already ended, it reports that.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Drain(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain with the request running: %v, want context.Canceled", err)
	}

	res := d.Dispatch(context.Background(), WorkRequest{Type: "hold", Payload: []byte("new")})
	if res.Status != apiv1.StatusUnavailable || res.Error != workers.ErrShuttingDown || len(res.Attempts) != 0 || res.RequestID == "" {
		t.Errorf("a request while draining: %+v, want unavailable (%q), no attempts, a request ID", res, workers.ErrShuttingDown)
	}
	if g.Runs.Load() != 1 {
		t.Errorf("the local worker ran %d requests, want only the taken one", g.Runs.Load())
	}

	drained := make(chan error, 1)
	go func() { drained <- d.Drain(context.Background()) }()
	g.Open()
	if err := workertest.Recv(t, drained, "Drain to return"); err != nil {
		t.Errorf("Drain: %v", err)
	}
	if res := workertest.Recv(t, results, "the taken request's result"); res.Status != apiv1.StatusOK || string(res.Output) != "taken" {
		t.Errorf("the taken request: %+v, want ok", res)
	}
	if got := d.InFlight(); got != 0 {
		t.Errorf("InFlight %d after Drain, want 0", got)
	}
}

// TestDispatcher_SaysWhyARequestEndedEarly: a request cut short by its
// caller says it was cancelled, with the caller's cause; one that ran out
// of its own time says so.
func TestDispatcher_SaysWhyARequestEndedEarly(t *testing.T) {
	g := workertest.NewGate(true)
	defer g.Open()
	d := holdingDispatcher(t, g)

	ctx, cancel := context.WithCancelCause(context.Background())
	results := make(chan WorkResult, 1)
	go func() { results <- d.Dispatch(ctx, WorkRequest{Type: "hold", Payload: []byte("a")}) }()
	workertest.Recv(t, g.Started, "the request to start")
	cancel(errors.New("the caller went away"))
	if res := workertest.Recv(t, results, "the cancelled request"); res.Status != apiv1.StatusTimeout || res.Error != "cancelled before a result: the caller went away" {
		t.Errorf("cancelled: %+v", res)
	}

	res := d.Dispatch(context.Background(), WorkRequest{Type: "hold", Payload: []byte("b"), Timeout: 20 * time.Millisecond})
	if res.Status != apiv1.StatusTimeout || res.Error != "no result within 20ms" {
		t.Errorf("out of time: %+v", res)
	}
}
