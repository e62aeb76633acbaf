package dispatch

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/builtin"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/workertest"
)

// holds is nil when ok holds.
func holds(ok bool) error {
	if ok {
		return nil
	}
	return errors.New("not yet")
}

// gateDispatcher is a dispatcher with no peers whose local worker runs one
// gate request at a time with one more queued, and whose admission queue
// holds one request.
func gateDispatcher(t *testing.T, g *workertest.Gate) *Dispatcher {
	t.Helper()
	cfg := config.Defaults()
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.Node.API = ""
	cfg.Node.DataDir = t.TempDir()
	cfg.Node.Network = "admission-test"
	cfg.Worker.LocalConcurrency, cfg.Worker.WorkerBufferSize, cfg.Worker.AdmissionQueueSize = 1, 1, 1
	cfg.SetDefaults()
	workertest.Must(t, cfg.Validate())
	reg, err := builtin.NewRegistry("echo")
	workertest.Must(t, err)
	workertest.Must(t, reg.Register("gate", g))
	p, err := pool.New(reg, cfg.Worker, workertest.QuietLogger())
	workertest.Must(t, err)
	t.Cleanup(func() { _ = p.Close() })
	n, err := node.New(context.Background(), cfg.Node, node.WithLogger(workertest.QuietLogger()))
	workertest.Must(t, err)
	t.Cleanup(func() { _ = n.Close() })
	d, err := New(cfg, n, p, WithLogger(workertest.QuietLogger()), WithSelectionOptions(selection.WithSeed(1)))
	workertest.Must(t, err)
	return d
}

// TestDispatch_WaitsForRoomThenAnswersBusy: a request that finds every
// worker busy waits in the admission queue and runs once an attempt ends
// (no failure while its deadline has time); one that finds the queue full
// is answered unavailable at once; one whose deadline runs out while it
// waits is answered unavailable, busy, before its deadline (never failed,
// never timed out).
func TestDispatch_WaitsForRoomThenAnswersBusy(t *testing.T) {
	g := workertest.NewGate(false)
	defer g.Open()
	d := gateDispatcher(t, g)
	do := func(payload string, timeout time.Duration) <-chan WorkResult {
		ch := make(chan WorkResult, 1)
		go func() {
			ch <- d.Dispatch(context.Background(), WorkRequest{Type: "gate", Payload: []byte(payload), Timeout: timeout})
		}()
		return ch
	}
	running := do("running", 10*time.Second)
	workertest.Recv(t, g.Started, "the first request to run")
	queued := do("queued", 10*time.Second)
	testkit.WaitFor(t, 10*time.Second, "the second request to queue", func() error { return holds(d.pool.Stats().Queued == 1) })
	waiting := do("waiting", 10*time.Second)
	testkit.WaitFor(t, 10*time.Second, "the third request to wait in the admission queue", func() error { return holds(d.admission.Waiting() == 1) })
	if v, ok := testkit.MetricValue(testkit.Gather(t, d.Collector()), "workmesh_dispatch_admission_waiting", nil); !ok || v != 1 {
		t.Fatalf("workmesh_dispatch_admission_waiting %v (found %v), want 1", v, ok)
	}

	// The admission queue (1) is full: unavailable at once, saying so.
	full := d.Dispatch(context.Background(), WorkRequest{Type: "gate", Payload: []byte("full"), Timeout: 10 * time.Second})
	if full.Status != apiv1.StatusUnavailable || !full.Busy || !strings.Contains(full.Error, "admission queue is full") {
		t.Fatalf("with the admission queue full: %s busy %v %q; want unavailable, busy, the queue full", full.Status, full.Busy, full.Error)
	}
	if full.Duration > 5*time.Second {
		t.Fatalf("a full admission queue answered after %s, want at once", full.Duration)
	}

	g.Open()
	for name, ch := range map[string]<-chan WorkResult{"running": running, "queued": queued, "waiting": waiting} {
		res := workertest.Recv(t, ch, "the "+name+" request's result")
		if res.Status != apiv1.StatusOK || string(res.Output) != name {
			t.Fatalf("%s: %s %q (%s), want ok", name, res.Status, res.Output, res.Error)
		}
		if name == "waiting" && (res.Queued <= 0 || res.BusyRefusals == 0 && !busyAmong(res.Attempts)) {
			t.Fatalf("waiting: queued %s, %d busy refusals, attempts %+v; want a wait after a busy answer", res.Queued, res.BusyRefusals, res.Attempts)
		}
	}
	if d.admission.Waiting() != 0 {
		t.Fatalf("%d still waiting after every request ended", d.admission.Waiting())
	}
}

// TestDispatch_LeavesTheAdmissionQueueWhenItsDeadlineCannotBeMet: with the
// local worker full and the work seen to take 200ms, a request with 500ms
// waits while its deadline leaves room for the work, then is answered
// unavailable, busy, with time still left: not a failure, not a timeout.
func TestDispatch_LeavesTheAdmissionQueueWhenItsDeadlineCannotBeMet(t *testing.T) {
	g := workertest.NewGate(false)
	defer g.Open()
	d := gateDispatcher(t, g)
	d.observeNeed("gate", 200*time.Millisecond, time.Now())
	go d.Dispatch(context.Background(), WorkRequest{Type: "gate", Timeout: 10 * time.Second})
	workertest.Recv(t, g.Started, "the first request to run")
	go d.Dispatch(context.Background(), WorkRequest{Type: "gate", Timeout: 10 * time.Second})
	testkit.WaitFor(t, 10*time.Second, "the second request to queue", func() error { return holds(d.pool.Stats().Queued == 1) })

	res := d.Dispatch(context.Background(), WorkRequest{Type: "gate", Timeout: 500 * time.Millisecond})
	if res.Status != apiv1.StatusUnavailable || !res.Busy || !strings.Contains(res.Error, "too little for its work, which takes 200ms") {
		t.Fatalf("got %s busy %v %q; want unavailable, busy, its deadline too short for the work", res.Status, res.Busy, res.Error)
	}
	// It waited while 200ms of work could still end in time, and left
	// before its deadline.
	if res.Duration < 200*time.Millisecond || res.Duration >= 500*time.Millisecond {
		t.Fatalf("answered after %s; want after 200ms (it waits while the work fits) and before its 500ms deadline", res.Duration)
	}
	if res.Queued <= 0 {
		t.Fatal("no time in the admission queue recorded")
	}
	for _, a := range res.Attempts {
		if a.Outcome != workers.Busy {
			t.Fatalf("attempt %+v: want only busy answers", a)
		}
	}
}
