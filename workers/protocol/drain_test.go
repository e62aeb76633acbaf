package protocol

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/workmesh/workmesh/node/frame"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/workertest"
)

// TestServer_DrainWaitsAndKeepsServing: Drain waits for the requests being
// served, and the server still answers requests that arrive meanwhile.
func TestServer_DrainWaitsAndKeepsServing(t *testing.T) {
	g := workertest.NewGate(false)
	defer g.Open()
	p := newPair(t, map[string]workers.Handler{"hold": g})
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()
	held := make(chan error, 1)
	go func() {
		resp, err := p.client.Do(ctx, p.serverHost.ID(), Request{ID: "held", Type: "hold", Payload: []byte("x"), Timeout: workertest.FailAfter})
		if err == nil && resp.Outcome != workers.Success {
			err = errors.New(resp.Error)
		}
		held <- err
	}()
	workertest.Recv(t, g.Started, "the held request to start")
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
	if err != nil || resp.Outcome != workers.Success || string(resp.Output) != "late" {
		t.Errorf("a request while draining: %+v %v, want it served", resp, err)
	}

	g.Open()
	if err := workertest.Recv(t, held, "the held request"); err != nil {
		t.Errorf("the held request: %v", err)
	}
	if err := workertest.Recv(t, drained, "Drain to return"); err != nil {
		t.Errorf("Drain: %v", err)
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
			g := workertest.NewGate(false)
			defer g.Open()
			p := newPair(t, map[string]workers.Handler{"hold": g}, WithGracePeriod(tc.grace))
			s := rawStream(t, p.clientHost, p.serverHost)
			_, err := s.Write(appendRequest(nil, &tc.req))
			workertest.Must(t, err)
			workertest.Recv(t, g.Started, "the request to start")
			if tc.req.AcceptTimeout > 0 {
				// The accept frame shows the watchdog is running.
				body, _, err := frame.Read(s, frameLimit(workers.DefaultMaxPayload), nil)
				workertest.Must(t, err)
				if _, accepted, err := decodeServerFrame(body, workers.DefaultMaxPayload); err != nil || !accepted {
					t.Fatalf("first frame: accepted %t, %v; want the accept frame", accepted, err)
				}
			}
			startDraining(p.server)
			g.Open()

			// Unread, the response holds Drain.
			short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if err := p.server.Drain(short); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Drain with a response unread: %v, want it to wait", err)
			}
			body, _, err := frame.Read(s, frameLimit(workers.DefaultMaxPayload), nil)
			workertest.Must(t, err)
			resp, accepted, err := decodeServerFrame(body, workers.DefaultMaxPayload)
			if err != nil || accepted || resp.ID != tc.req.ID || resp.Outcome != workers.Success {
				t.Fatalf("response: %+v accepted %t %v", resp, accepted, err)
			}
			workertest.Must(t, s.Close())
			ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
			defer cancel()
			if err := p.server.Drain(ctx); err != nil {
				t.Errorf("Drain after the client read its response: %v", err)
			}
			if sr := workertest.Recv(t, p.served, "the served request"); sr.Outcome != workers.Success || sr.Err != nil {
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
		workertest.Must(t, err)
		return p, s
	}
	readResponse := func(t *testing.T, s network.Stream) error {
		body, _, err := frame.Read(s, frameLimit(workers.DefaultMaxPayload), nil)
		if err != nil {
			return err
		}
		resp, _, err := decodeServerFrame(body, workers.DefaultMaxPayload)
		if err == nil && (resp.ID != "x" || resp.Outcome != workers.Success) {
			err = fmt.Errorf("response %+v", resp)
		}
		return err
	}
	closeAndDrain := func(t *testing.T, p *pair) {
		ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
		defer cancel()
		drained := make(chan error, 1)
		go func() { drained <- p.server.Drain(ctx) }()
		closed := make(chan error, 1)
		go func() { closed <- p.server.Close() }()
		workertest.Must(t, workertest.Recv(t, closed, "Close with an acknowledgement outstanding"))
		workertest.Must(t, workertest.Recv(t, drained, "Drain once the server closed"))
	}

	t.Run("a client that reads but never closes", func(t *testing.T) {
		p, s := drainingRaw(t)
		workertest.Must(t, readResponse(t, s))
		// The server owes nothing more once closed.
		closeAndDrain(t, p)
	})

	t.Run("the server closed before the client read", func(t *testing.T) {
		p, s := drainingRaw(t)
		// The count has no event of its own: WaitFor polls it.
		testkit.WaitFor(t, workertest.FailAfter, "a response written", func() error {
			if p.server.Stats().ByOutcome[workers.Success] == 0 { // counted once written, before the wait
				return errors.New("no response written")
			}
			return nil
		})
		closeAndDrain(t, p)
		// Ending the wait left the response on its way.
		if err := readResponse(t, s); err != nil {
			t.Errorf("the response after the server closed: %v", err)
		}
	})

	t.Run("the host closed when Drain returns", func(t *testing.T) {
		g := workertest.NewGate(false)
		defer g.Open()
		p := newPair(t, map[string]workers.Handler{"hold": g})
		ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
		defer cancel()
		const n = 4 // the test pool's workers
		results := make(chan error, n)
		for i := range n {
			go func() {
				resp, err := p.client.Do(ctx, p.serverHost.ID(), Request{ID: fmt.Sprint(i), Type: "hold", Payload: []byte("x")})
				if err == nil && resp.Outcome != workers.Success {
					err = errors.New(resp.Error)
				}
				results <- err
			}()
		}
		for range n {
			workertest.Recv(t, g.Started, "the requests to start")
		}
		startDraining(p.server) // before the responses are written
		drained := make(chan error, 1)
		go func() {
			err := p.server.Drain(ctx)
			_ = p.serverHost.Close() // as a stopping node does
			drained <- err
		}()
		g.Open()
		workertest.Must(t, workertest.Recv(t, drained, "Drain to return"))
		for range n {
			if err := workertest.Recv(t, results, "a result"); err != nil {
				t.Errorf("a request answered while the server drained: %v", err)
			}
		}
	})
}
