package workers

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
)

// holdingDispatcher is a dispatcher with no peers whose local worker serves
// "hold" with g.
func holdingDispatcher(t *testing.T, g *gate) *Dispatcher {
	t.Helper()
	cfg := config.Defaults()
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.Node.API = ""
	cfg.Node.DataDir = t.TempDir()
	cfg.Node.Network = testNetwork
	cfg.Node.WorkTypes = []string{"hold"}
	must(t, cfg.Validate())
	pool := newTestPool(t, 4, 16, map[string]Handler{"hold": g})
	n, err := node.New(context.Background(), cfg.Node, node.WithLogger(quietLogger()))
	must(t, err)
	t.Cleanup(func() { _ = n.Close() })
	d, err := NewDispatcher(cfg, n, pool, WithDispatchLogger(quietLogger()))
	must(t, err)
	return d
}

// TestDispatcher_DrainRefusesNewWorkAndWaitsForTaken: once draining, a
// dispatcher answers new requests unavailable at once, and Drain returns
// only when the request it had taken has ended, with its result intact.
func TestDispatcher_DrainRefusesNewWorkAndWaitsForTaken(t *testing.T) {
	g := newGate(false)
	defer g.open()
	d := holdingDispatcher(t, g)
	results := make(chan WorkResult, 1)
	go func() {
		results <- d.Dispatch(context.Background(), WorkRequest{Type: "hold", Payload: []byte("taken")})
	}()
	recv(t, g.started, "the taken request to start")
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
	if res.Status != StatusUnavailable || res.Error != ErrShuttingDown || len(res.Attempts) != 0 || res.RequestID == "" {
		t.Errorf("a request while draining: %+v, want unavailable (%q), no attempts, a request ID", res, ErrShuttingDown)
	}
	if g.runs.Load() != 1 {
		t.Errorf("the local worker ran %d requests, want only the taken one", g.runs.Load())
	}

	drained := make(chan error, 1)
	go func() { drained <- d.Drain(context.Background()) }()
	g.open()
	if err := recv(t, drained, "Drain to return"); err != nil {
		t.Errorf("Drain: %v", err)
	}
	if res := recv(t, results, "the taken request's result"); res.Status != StatusOK || string(res.Output) != "taken" {
		t.Errorf("the taken request: %+v, want ok", res)
	}
	if got := d.InFlight(); got != 0 {
		t.Errorf("InFlight %d after Drain, want 0", got)
	}
}

// TestServer_DrainWaitsAndKeepsServing: Drain waits for the requests being
// served, and the server still answers requests that arrive meanwhile.
func TestServer_DrainWaitsAndKeepsServing(t *testing.T) {
	g := newGate(false)
	defer g.open()
	p := newPair(t, map[string]Handler{"hold": g})
	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()
	held := make(chan error, 1)
	go func() {
		resp, err := p.client.Do(ctx, p.serverHost.ID(), Request{ID: "held", Type: "hold", Payload: []byte("x"), Timeout: failAfter})
		if err == nil && resp.Outcome != Success {
			err = errors.New(resp.Error)
		}
		held <- err
	}()
	recv(t, g.started, "the held request to start")
	if got := p.server.Serving(); got != 1 {
		t.Errorf("Serving %d, want 1", got)
	}
	ended, stop := context.WithCancel(context.Background())
	stop()
	if err := p.server.Drain(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain with a request being served: %v, want context.Canceled", err)
	}
	drained := make(chan error, 1)
	go func() { drained <- p.server.Drain(ctx) }()

	// Served while draining.
	resp, err := p.do(t, ctx, Request{ID: "late", Type: "echo", Payload: []byte("late")})
	if err != nil || resp.Outcome != Success || string(resp.Output) != "late" {
		t.Errorf("a request while draining: %+v %v, want it served", resp, err)
	}

	g.open()
	if err := recv(t, held, "the held request"); err != nil {
		t.Errorf("the held request: %v", err)
	}
	if err := recv(t, drained, "Drain to return"); err != nil {
		t.Errorf("Drain: %v", err)
	}
}

// TestDispatcher_SaysWhyARequestEndedEarly: a request cut short by its
// caller says it was cancelled, with the caller's cause; one that ran out
// of its own time says so.
func TestDispatcher_SaysWhyARequestEndedEarly(t *testing.T) {
	g := newGate(true)
	defer g.open()
	d := holdingDispatcher(t, g)

	ctx, cancel := context.WithCancelCause(context.Background())
	results := make(chan WorkResult, 1)
	go func() { results <- d.Dispatch(ctx, WorkRequest{Type: "hold", Payload: []byte("a")}) }()
	recv(t, g.started, "the request to start")
	cancel(errors.New("the caller went away"))
	if res := recv(t, results, "the cancelled request"); res.Status != StatusTimeout || res.Error != "cancelled before a result: the caller went away" {
		t.Errorf("cancelled: %+v", res)
	}

	res := d.Dispatch(context.Background(), WorkRequest{Type: "hold", Payload: []byte("b"), Timeout: 20 * time.Millisecond})
	if res.Status != StatusTimeout || res.Error != "no result within 20ms" {
		t.Errorf("out of time: %+v", res)
	}
}

// startDraining puts s in its draining state without waiting for it.
func startDraining(s *Server) {
	ended, stop := context.WithCancel(context.Background())
	stop()
	_ = s.Drain(ended)
}

// TestServer_DrainHoldsEachResponseUntilRead: a node closes its
// connections once its drain returns, and QUIC discards a response the
// client has not read yet. So while draining, a request counts as served
// only once the client has read its response: with work done within the
// grace period and with work that outlasted it (its watchdog had a read
// pending, which must not close the read side the acknowledgement comes
// on; the accept frame was sent first). A client that never closes holds
// Drain only until the server closes, and that close leaves an unread
// response on its way; with a real client, closing the server's host the
// moment Drain returns loses nothing.
func TestServer_DrainHoldsEachResponseUntilRead(t *testing.T) {
	for _, tc := range []struct {
		name  string
		grace time.Duration
		req   Request
	}{
		{"within the grace period", time.Hour, Request{ID: "quick", Type: "hold", Payload: []byte("quick")}},
		{"past the grace period", time.Millisecond, Request{ID: "slow", Type: "hold", Payload: []byte("slow"), AcceptTimeout: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGate(false)
			defer g.open()
			p := newPair(t, map[string]Handler{"hold": g}, WithGracePeriod(tc.grace))
			s := rawStream(t, p.clientHost, p.serverHost)
			_, err := s.Write(appendRequest(nil, &tc.req))
			must(t, err)
			recv(t, g.started, "the request to start")
			if tc.req.AcceptTimeout > 0 {
				// The accept frame shows the watchdog is running.
				body, _, err := readFrame(s, frameLimit(DefaultMaxPayload), nil)
				must(t, err)
				if _, accepted, err := decodeServerFrame(body, DefaultMaxPayload); err != nil || !accepted {
					t.Fatalf("first frame: accepted %t, %v; want the accept frame", accepted, err)
				}
			}
			startDraining(p.server)
			g.open()

			// Unread, the response holds Drain.
			short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if err := p.server.Drain(short); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Drain with a response unread: %v, want it to wait", err)
			}
			body, _, err := readFrame(s, frameLimit(DefaultMaxPayload), nil)
			must(t, err)
			resp, accepted, err := decodeServerFrame(body, DefaultMaxPayload)
			if err != nil || accepted || resp.ID != tc.req.ID || resp.Outcome != Success {
				t.Fatalf("response: %+v accepted %t %v", resp, accepted, err)
			}
			must(t, s.Close())
			ctx, cancel := context.WithTimeout(context.Background(), failAfter)
			defer cancel()
			if err := p.server.Drain(ctx); err != nil {
				t.Errorf("Drain after the client read its response: %v", err)
			}
			if sr := recv(t, p.served, "the served request"); sr.Outcome != Success || sr.Err != nil {
				t.Errorf("served: %+v", sr)
			}
		})
	}

	// A raw client's request on a draining server whose acknowledgement
	// wait only Close can end within the test (ackWait is a minute).
	drainingRaw := func(t *testing.T) (*pair, network.Stream) {
		p := newPair(t, nil)
		p.server.ackWait = time.Minute
		s := rawStream(t, p.clientHost, p.serverHost)
		startDraining(p.server)
		_, err := s.Write(appendRequest(nil, &Request{ID: "x", Type: "echo", Payload: []byte("x")}))
		must(t, err)
		return p, s
	}
	readResponse := func(t *testing.T, s network.Stream) error {
		body, _, err := readFrame(s, frameLimit(DefaultMaxPayload), nil)
		if err != nil {
			return err
		}
		resp, _, err := decodeServerFrame(body, DefaultMaxPayload)
		if err == nil && (resp.ID != "x" || resp.Outcome != Success) {
			err = fmt.Errorf("response %+v", resp)
		}
		return err
	}
	closeAndDrain := func(t *testing.T, p *pair) {
		ctx, cancel := context.WithTimeout(context.Background(), failAfter)
		defer cancel()
		drained := make(chan error, 1)
		go func() { drained <- p.server.Drain(ctx) }()
		closed := make(chan error, 1)
		go func() { closed <- p.server.Close() }()
		must(t, recv(t, closed, "Close with an acknowledgement outstanding"))
		must(t, recv(t, drained, "Drain once the server closed"))
	}

	t.Run("a client that reads but never closes", func(t *testing.T) {
		p, s := drainingRaw(t)
		must(t, readResponse(t, s))
		// The server owes nothing more once closed.
		closeAndDrain(t, p)
	})

	t.Run("the server closed before the client read", func(t *testing.T) {
		p, s := drainingRaw(t)
		deadline := time.Now().Add(failAfter)
		for p.server.Stats().ByOutcome[Success] == 0 { // counted once written, before the wait
			if time.Now().After(deadline) {
				t.Fatal("no response written")
			}
			time.Sleep(time.Millisecond) // the count has no event of its own
		}
		closeAndDrain(t, p)
		// Ending the wait left the response on its way.
		if err := readResponse(t, s); err != nil {
			t.Errorf("the response after the server closed: %v", err)
		}
	})

	t.Run("the host closed when Drain returns", func(t *testing.T) {
		g := newGate(false)
		defer g.open()
		p := newPair(t, map[string]Handler{"hold": g})
		ctx, cancel := context.WithTimeout(context.Background(), failAfter)
		defer cancel()
		const n = 4 // the test pool's workers
		results := make(chan error, n)
		for i := range n {
			go func() {
				resp, err := p.client.Do(ctx, p.serverHost.ID(), Request{ID: fmt.Sprint(i), Type: "hold", Payload: []byte("x")})
				if err == nil && resp.Outcome != Success {
					err = errors.New(resp.Error)
				}
				results <- err
			}()
		}
		for range n {
			recv(t, g.started, "the requests to start")
		}
		startDraining(p.server) // before the responses are written
		drained := make(chan error, 1)
		go func() {
			err := p.server.Drain(ctx)
			_ = p.serverHost.Close() // as a stopping node does
			drained <- err
		}()
		g.open()
		must(t, recv(t, drained, "Drain to return"))
		for range n {
			if err := recv(t, results, "a result"); err != nil {
				t.Errorf("a request answered while the server drained: %v", err)
			}
		}
	})
}
