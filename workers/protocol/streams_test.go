package protocol

// Reused streams: a client's pool of work streams and a server's loop over
// the requests of one stream, through real hosts.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"

	"github.com/workmesh/workmesh/node/frame"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/workertest"
)

// workStreams counts the open work-protocol streams h has with peer p.
func workStreams(h host.Host, p peer.ID) int {
	n := 0
	for _, c := range h.Network().ConnsToPeer(p) {
		for _, s := range c.GetStreams() {
			if s.Protocol() == ProtocolID(workertest.Network) {
				n++
			}
		}
	}
	return n
}

// idleStreams returns how many streams c keeps idle for p.
func (c *Client) idleStreams(p peer.ID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.idle[p])
}

func mustEcho(t testing.TB, c *Client, to peer.ID, payload string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()
	resp, err := c.Do(ctx, to, Request{ID: payload, Type: "echo", Payload: []byte(payload)})
	if err != nil {
		t.Fatalf("echo %q: %v", payload, err)
	}
	if resp.Outcome != workers.Success || string(resp.Output) != payload || resp.ID != payload {
		t.Fatalf("echo %q: %v %q %q", payload, resp.Outcome, resp.Output, resp.Error)
	}
}

// transports are the two ways a pair of hosts is connected in these tests:
// QUIC on loopback, whose streams have deadlines and flow control, and
// go-libp2p's mock network, whose streams have neither.
var transports = []struct {
	name  string
	hosts func(t *testing.T) (host.Host, host.Host)
}{
	{"quic", func(t *testing.T) (host.Host, host.Host) {
		a, b := workertest.NewHost(t), workertest.NewHost(t)
		workertest.Connect(t, a, b)
		return a, b
	}},
	{"mocknet", func(t *testing.T) (host.Host, host.Host) { return workertest.MockPair(t) }},
}

func TestStreams_ReusedAcrossSequentialCalls(t *testing.T) {
	for _, tc := range transports {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.hosts(t)
			p := newPairOn(t, a, b, nil, WithGracePeriod(time.Millisecond))
			for i := range 5 {
				mustEcho(t, p.client, p.serverHost.ID(), fmt.Sprint("call-", i))
			}
			// Work that outlasts the grace period has the watchdog's read
			// pending on the stream: it becomes the wait for the next
			// request, and the stream stays whole.
			ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
			defer cancel()
			resp, err := p.client.Do(ctx, p.serverHost.ID(), Request{Type: "sleep", Payload: []byte("50ms"), AcceptTimeout: time.Second})
			workertest.Must(t, err)
			if resp.Outcome != workers.Success {
				t.Fatalf("slow work: %v %q", resp.Outcome, resp.Error)
			}
			mustEcho(t, p.client, p.serverHost.ID(), "after-slow")
			if n := p.client.opened.Load(); n != 1 {
				t.Errorf("%d streams opened for 7 sequential calls, want 1", n)
			}
			for range 7 {
				if sr := workertest.Recv(t, p.served, "a served request"); sr.Err != nil || sr.Outcome != workers.Success {
					t.Errorf("served: %+v", sr)
				}
			}
			if n := workStreams(p.serverHost, p.clientHost.ID()); n != 1 {
				t.Errorf("the server has %d work streams open, want the 1 reused", n)
			}
		})
	}
}

func TestStreams_ConcurrentCallsOpenMoreUpToTheBound(t *testing.T) {
	g := workertest.NewGate(false)
	defer g.Open()
	p := newPair(t, map[string]workers.Handler{"gate": g})
	const bound = 3
	c, err := NewClient(p.clientHost, workertest.Network, WithStreamPool(bound, time.Minute))
	workertest.Must(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()

	const n = 4 // the test pool's workers: all run at once
	errs := make(chan error, n)
	for i := range n {
		go func() {
			resp, err := c.Do(ctx, p.serverHost.ID(), Request{Type: "gate", Payload: []byte(fmt.Sprint(i))})
			if err == nil && resp.Outcome != workers.Success {
				err = errors.New(resp.Error)
			}
			errs <- err
		}()
	}
	for range n {
		workertest.Recv(t, g.Started, "the calls to start")
	}
	if got := c.opened.Load(); got != n {
		t.Errorf("%d streams opened for %d concurrent calls, want one each", got, n)
	}
	g.Open()
	for range n {
		workertest.Must(t, workertest.Recv(t, errs, "a call to end"))
	}
	// The pool keeps the bound; the stream beyond it was closed.
	if got := c.idleStreams(p.serverHost.ID()); got != bound {
		t.Errorf("%d idle streams kept, want the bound %d", got, bound)
	}
	testkit.WaitFor(t, workertest.FailAfter, "the server to see the stream beyond the bound closed", func() error {
		if got := workStreams(p.serverHost, p.clientHost.ID()); got != bound {
			return fmt.Errorf("%d work streams open at the server", got)
		}
		return nil
	})
	// Calls one after the other use the idle streams.
	for i := range 2 * bound {
		mustEcho(t, c, p.serverHost.ID(), fmt.Sprint("seq-", i))
	}
	if got := c.opened.Load(); got != n {
		t.Errorf("%d streams opened after sequential calls, want still %d", got, n)
	}
}

func TestStreams_CancelledCallIsNotReusedAndItsWorkIsCancelled(t *testing.T) {
	g := workertest.NewGate(true)
	defer g.Open()
	p := newPair(t, map[string]workers.Handler{"gate": g})
	mustEcho(t, p.client, p.serverHost.ID(), "first") // a stream to reuse
	workertest.Recv(t, p.served, "the first request")

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := p.client.Do(ctx, p.serverHost.ID(), Request{Type: "gate", Timeout: time.Minute})
		errc <- err
	}()
	workertest.Recv(t, g.Started, "the gate request to start on the reused stream")
	if got := p.client.opened.Load(); got != 1 {
		t.Fatalf("%d streams opened, want the gate request on the first stream", got)
	}
	cancel()
	if err := workertest.Recv(t, errc, "the cancelled call"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: %v, want context.Canceled", err)
	}
	if cause := workertest.Recv(t, g.Cancelled, "the server to cancel the work"); !errors.Is(cause, ErrClientGone) {
		t.Errorf("work cancelled with %v, want ErrClientGone", cause)
	}
	if sr := workertest.Recv(t, p.served, "the cancelled request to end"); !errors.Is(sr.Err, ErrClientGone) {
		t.Errorf("served: %+v, want ErrClientGone", sr)
	}
	if got := p.client.idleStreams(p.serverHost.ID()); got != 0 {
		t.Errorf("%d idle streams after the cancelled call, want none", got)
	}
	mustEcho(t, p.client, p.serverHost.ID(), "after")
	if got := p.client.opened.Load(); got != 2 {
		t.Errorf("%d streams opened, want a fresh one after the cancelled call", got)
	}
}

func TestStreams_TimedOutAndMalformedStreamsAreNotReused(t *testing.T) {
	t.Run("timed out", func(t *testing.T) {
		g := workertest.NewGate(true)
		defer g.Open()
		p := newPair(t, map[string]workers.Handler{"gate": g})
		mustEcho(t, p.client, p.serverHost.ID(), "first")
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := p.do(t, ctx, Request{Type: "gate"}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("held call: %v, want context.DeadlineExceeded", err)
		}
		mustEcho(t, p.client, p.serverHost.ID(), "after")
		if got := p.client.opened.Load(); got != 2 {
			t.Errorf("%d streams opened, want a fresh one after the timeout", got)
		}
	})
	t.Run("malformed", func(t *testing.T) {
		clientHost, serverHost := workertest.NewHost(t), workertest.NewHost(t)
		// A worker whose every second response on a stream is not a
		// valid frame.
		serverHost.SetStreamHandler(ProtocolID(workertest.Network), func(s network.Stream) {
			defer func() { _ = s.Close() }()
			for i := 0; ; i++ {
				body, _, err := frame.Read(s, frameLimit(workers.DefaultMaxPayload), nil)
				if err != nil {
					return
				}
				req, err := decodeRequest(body, workers.DefaultMaxPayload)
				if err != nil {
					return
				}
				out := appendResponse(nil, &Response{ID: req.ID, Result: workers.OK(req.Payload)})
				if i%2 == 1 {
					out[frame.HeaderLen] = 0x7f // an unknown kind
				}
				if _, err := s.Write(out); err != nil {
					return
				}
			}
		})
		workertest.Connect(t, clientHost, serverHost)
		c, err := NewClient(clientHost, workertest.Network)
		workertest.Must(t, err)
		mustEcho(t, c, serverHost.ID(), "first")
		ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
		defer cancel()
		if _, err := c.Do(ctx, serverHost.ID(), Request{Type: "echo", Payload: []byte("x")}); !errors.Is(err, ErrMalformed) {
			t.Fatalf("second call: %v, want ErrMalformed", err)
		}
		mustEcho(t, c, serverHost.ID(), "after")
		if got := c.opened.Load(); got != 2 {
			t.Errorf("%d streams opened, want a fresh one after the malformed response", got)
		}
	})
}

// newKeyedHost starts a QUIC host with key priv listening on addr.
func newKeyedHost(t *testing.T, priv crypto.PrivKey, addr string) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.Identity(priv), libp2p.ListenAddrStrings(addr), libp2p.DisableRelay())
	workertest.Must(t, err)
	t.Cleanup(func() { _ = h.Close() })
	return h
}

func TestStreams_WorkerRestartGetsAFreshStream(t *testing.T) {
	priv, _, err := crypto.GenerateEd25519Key(rand.Reader)
	workertest.Must(t, err)
	clientHost := workertest.NewHost(t)
	serverHost := newKeyedHost(t, priv, "/ip4/127.0.0.1/udp/0/quic-v1")
	addr := serverHost.Addrs()[0].String()
	p := newPairOn(t, clientHost, serverHost, nil)
	workertest.Connect(t, clientHost, serverHost)
	mustEcho(t, p.client, serverHost.ID(), "before")
	if got := p.client.idleStreams(serverHost.ID()); got != 1 {
		t.Fatalf("%d idle streams, want 1", got)
	}

	// The worker restarts: same key, same address, new process state.
	_ = p.server.Close()
	workertest.Must(t, serverHost.Close())
	restarted := newKeyedHost(t, priv, addr)
	p2 := newPairOn(t, clientHost, restarted, nil)
	// The old host closed its connection; until the client's host has
	// taken that in, a new stream would go on the dead connection and meet
	// the restarted worker's stateless reset (a connection lost, which the
	// dispatcher retries elsewhere; a worker killed without closing its
	// connections costs that one attempt).
	testkit.WaitFor(t, workertest.FailAfter, "the client to see the old connection gone", func() error {
		if n := p.client.idleStreams(restarted.ID()); n != 0 {
			return fmt.Errorf("%d idle streams", n)
		}
		if n := len(clientHost.Network().ConnsToPeer(restarted.ID())); n != 0 {
			return fmt.Errorf("%d connections to the old worker", n)
		}
		return nil
	})
	mustEcho(t, p.client, restarted.ID(), "after restart")
	if got := p.client.opened.Load(); got != 2 {
		t.Errorf("%d streams opened, want a fresh one after the restart", got)
	}
	workertest.Recv(t, p2.served, "the restarted worker to serve the call")

	// Its connection killed: the next call dials again, on a new stream.
	workertest.Must(t, restarted.Network().ClosePeer(clientHost.ID()))
	testkit.WaitFor(t, workertest.FailAfter, "the client to see the connection gone", func() error {
		if n := p.client.idleStreams(restarted.ID()); n != 0 {
			return fmt.Errorf("%d idle streams", n)
		}
		return nil
	})
	mustEcho(t, p.client, restarted.ID(), "after the connection was closed")
	if got := p.client.opened.Load(); got != 3 {
		t.Errorf("%d streams opened, want a fresh one after the connection closed", got)
	}
}

// closingWorker serves the work protocol on h by hand: it answers the
// first request of each stream, and on each stream's second request it
// reads the request and then ends the stream without running it, with a
// FIN (as a server closing between requests does) or a reset (as a crash
// does). seen gets every request ID read.
func closingWorker(t *testing.T, h host.Host, reset bool) <-chan string {
	seen := make(chan string, 100)
	var mu sync.Mutex
	streams := 0
	h.SetStreamHandler(ProtocolID(workertest.Network), func(s network.Stream) {
		mu.Lock()
		streams++
		mu.Unlock()
		for i := 0; ; i++ {
			body, _, err := frame.Read(s, frameLimit(workers.DefaultMaxPayload), nil)
			if err != nil {
				_ = s.Close()
				return
			}
			req, err := decodeRequest(body, workers.DefaultMaxPayload)
			if err != nil {
				_ = s.Reset()
				return
			}
			seen <- req.ID
			if i == 1 {
				if reset {
					_ = s.Reset()
				} else {
					_ = s.Close()
				}
				return
			}
			if _, err := s.Write(appendResponse(nil, &Response{ID: req.ID, Result: workers.OK(req.Payload)})); err != nil {
				_ = s.Reset()
				return
			}
		}
	})
	return seen
}

func TestStreams_RequestOnStreamClosedBetweenRequestsIsSentOnceMore(t *testing.T) {
	t.Run("closed: sent again on a fresh stream", func(t *testing.T) {
		clientHost, serverHost := workertest.NewHost(t), workertest.NewHost(t)
		seen := closingWorker(t, serverHost, false)
		workertest.Connect(t, clientHost, serverHost)
		c, err := NewClient(clientHost, workertest.Network)
		workertest.Must(t, err)
		mustEcho(t, c, serverHost.ID(), "one")
		mustEcho(t, c, serverHost.ID(), "two")
		for _, want := range []string{"one", "two", "two"} {
			if got := workertest.Recv(t, seen, "a request at the worker"); got != want {
				t.Errorf("the worker read %q, want %q", got, want)
			}
		}
		if got := c.opened.Load(); got != 2 {
			t.Errorf("%d streams opened, want 2: the second call once more on a fresh stream", got)
		}
	})
	t.Run("reset: an error, not sent again", func(t *testing.T) {
		clientHost, serverHost := workertest.NewHost(t), workertest.NewHost(t)
		seen := closingWorker(t, serverHost, true)
		workertest.Connect(t, clientHost, serverHost)
		c, err := NewClient(clientHost, workertest.Network)
		workertest.Must(t, err)
		mustEcho(t, c, serverHost.ID(), "one")
		ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
		defer cancel()
		if _, err := c.Do(ctx, serverHost.ID(), Request{ID: "two", Type: "echo"}); err == nil || errors.Is(err, errNotTaken) {
			t.Fatalf("a call whose stream was reset after its request: %v, want an error that is not 'not taken'", err)
		}
		for _, want := range []string{"one", "two"} {
			if got := workertest.Recv(t, seen, "a request at the worker"); got != want {
				t.Errorf("the worker read %q, want %q", got, want)
			}
		}
		select {
		case id := <-seen:
			t.Errorf("the worker read %q again: a request that may have run was sent twice", id)
		default:
		}
		if got := c.opened.Load(); got != 1 {
			t.Errorf("%d streams opened, want 1", got)
		}
	})
}

func TestStreams_IdleStreamsAreClosed(t *testing.T) {
	t.Run("by the client", func(t *testing.T) {
		p := newPair(t, nil)
		c, err := NewClient(p.clientHost, workertest.Network, WithStreamPool(4, 100*time.Millisecond))
		workertest.Must(t, err)
		defer c.Close()
		mustEcho(t, c, p.serverHost.ID(), "x")
		testkit.WaitFor(t, workertest.FailAfter, "the idle stream closed at both ends", func() error {
			if n, m := c.idleStreams(p.serverHost.ID()), workStreams(p.serverHost, p.clientHost.ID()); n != 0 || m != 0 {
				return fmt.Errorf("%d idle at the client, %d open at the server", n, m)
			}
			return nil
		})
		if st := p.server.Stats(); st.Malformed != 0 || st.Dropped != 0 {
			t.Errorf("server stats %+v: an idle stream's end is neither", st)
		}
	})
	t.Run("by the server", func(t *testing.T) {
		p := newPair(t, nil, WithIdleTimeout(100*time.Millisecond))
		mustEcho(t, p.client, p.serverHost.ID(), "x")
		testkit.WaitFor(t, workertest.FailAfter, "the client to drop the stream the server closed", func() error {
			if n := p.client.idleStreams(p.serverHost.ID()); n != 0 {
				return fmt.Errorf("%d idle at the client", n)
			}
			return nil
		})
		mustEcho(t, p.client, p.serverHost.ID(), "y")
		if got := p.client.opened.Load(); got != 2 {
			t.Errorf("%d streams opened, want a fresh one", got)
		}
	})
}

// A draining server closes each stream after its response; the client
// answers the FIN at once, so Drain does not wait for the acknowledgement
// timeout, and the next call takes a fresh stream.
func TestStreams_DrainClosesEachStreamAfterItsResponse(t *testing.T) {
	p := newPair(t, nil)
	p.server.ackWait = time.Hour // only the client's FIN can end the wait
	mustEcho(t, p.client, p.serverHost.ID(), "before")
	workertest.Recv(t, p.served, "the first request")
	startDraining(p.server)
	mustEcho(t, p.client, p.serverHost.ID(), "draining") // on the reused stream
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()
	workertest.Must(t, p.server.Drain(ctx))
	if sr := workertest.Recv(t, p.served, "the request while draining"); sr.Outcome != workers.Success {
		t.Errorf("served: %+v", sr)
	}
	mustEcho(t, p.client, p.serverHost.ID(), "after")
	if got := p.client.opened.Load(); got != 2 {
		t.Errorf("%d streams opened, want 2: one closed by the drain", got)
	}
}

// recorder is a handler that counts its runs per payload and answers with
// the payload, after wait (its context ends it sooner).
type recorder struct {
	wait time.Duration
	mu   sync.Mutex
	runs map[string]int
}

func (r *recorder) Do(ctx context.Context, payload []byte) workers.Result {
	r.mu.Lock()
	r.runs[string(payload)]++
	r.mu.Unlock()
	if r.wait > 0 {
		t := time.NewTimer(r.wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return workers.Fail(workers.RetryableError, "cancelled")
		}
	}
	return workers.OK(payload)
}

// Many callers on few streams, with fast work, work past the grace period,
// calls cancelled midway and a server that closes idle streams after a few
// milliseconds (so that its closing races the callers' next requests):
// every call gets its own response or an error, and no request runs twice.
func TestStreams_ConcurrentReuseNeverMixesNorRunsTwice(t *testing.T) {
	fast := &recorder{runs: map[string]int{}}
	slow := &recorder{wait: 3 * time.Millisecond, runs: map[string]int{}}
	p := newPair(t, map[string]workers.Handler{"fast": fast, "slow": slow},
		WithIdleTimeout(2*time.Millisecond), WithGracePeriod(time.Millisecond))
	c, err := NewClient(p.clientHost, workertest.Network, WithStreamPool(4, time.Minute))
	workertest.Must(t, err)
	defer c.Close()
	const callers, calls = 16, 40
	var wg sync.WaitGroup
	var mu sync.Mutex
	var okCount, cancelled, busy int
	for i := range callers {
		wg.Go(func() {
			for j := range calls {
				id := fmt.Sprintf("%d-%d", i, j)
				typ := "fast"
				if j%3 == 1 {
					typ = "slow"
				}
				ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
				if j%5 == 4 {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(j%4)*time.Millisecond+500*time.Microsecond)
				}
				resp, err := c.Do(ctx, p.serverHost.ID(), Request{ID: id, Type: typ, Payload: []byte(id), AcceptTimeout: time.Second})
				cancel()
				mu.Lock()
				switch {
				case err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) && j%5 == 4:
					cancelled++
				case err != nil:
					t.Errorf("call %s: %v", id, err)
				case resp.Outcome == workers.Busy:
					busy++ // 16 callers on 4+16 slots
				case resp.ID != id || (resp.Outcome == workers.Success && string(resp.Output) != id):
					t.Errorf("call %s got response %q with output %q", id, resp.ID, resp.Output)
				case resp.Outcome == workers.Success:
					okCount++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, r := range []*recorder{fast, slow} {
		r.mu.Lock()
		for id, n := range r.runs {
			if n > 1 {
				t.Errorf("request %s ran %d times", id, n)
			}
		}
		r.mu.Unlock()
	}
	if okCount < callers*calls/2 {
		t.Errorf("%d calls answered, %d cancelled, %d busy: want most answered", okCount, cancelled, busy)
	}
	t.Logf("%d answered, %d cancelled, %d busy; %d streams opened for %d calls", okCount, cancelled, busy, c.opened.Load(), callers*calls)
}

// A stream the worker's host refuses at its resource limits is refused
// before the work protocol sees it: the call is tried once more on a new
// stream (after the idle ones to that peer are closed, as they count
// against the limits), and fails cleanly when that is refused too; the
// work never runs.
func TestStreams_StreamRefusedAtTheWorkersLimitsIsNotTaken(t *testing.T) {
	limits := rcmgr.DefaultLimits
	limits.AddProtocolPeerLimit(ProtocolID(workertest.Network),
		rcmgr.BaseLimit{StreamsInbound: 1, StreamsOutbound: 1, Streams: 2, Memory: 16 << 20}, rcmgr.BaseLimitIncrease{})
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits.AutoScale()), rcmgr.WithMetricsDisabled())
	workertest.Must(t, err)
	serverHost, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/udp/0/quic-v1"), libp2p.DisableRelay(), libp2p.ResourceManager(rm))
	workertest.Must(t, err)
	t.Cleanup(func() { _ = serverHost.Close() })
	g := workertest.NewGate(true)
	defer g.Open()
	p := newPairOn(t, workertest.NewHost(t), serverHost, map[string]workers.Handler{"gate": g})
	workertest.Connect(t, p.clientHost, serverHost)
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()

	held := make(chan error, 1)
	go func() {
		_, err := p.client.Do(ctx, serverHost.ID(), Request{ID: "held", Type: "gate"})
		held <- err
	}()
	workertest.Recv(t, g.Started, "the held request to start")
	_, err = p.client.Do(ctx, serverHost.ID(), Request{ID: "refused", Type: "gate"})
	if !errors.Is(err, errRefused) {
		t.Fatalf("a call over the worker's stream limit: %v, want errRefused", err)
	}
	if got := p.client.opened.Load(); got != 3 {
		t.Errorf("%d streams opened, want 3: the held one, the refused one and its one retry", got)
	}
	if n := g.Runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once (the held request)", n)
	}
	g.Open()
	workertest.Must(t, workertest.Recv(t, held, "the held request"))
	resp, err := p.client.Do(ctx, serverHost.ID(), Request{ID: "after", Type: "echo", Payload: []byte("x")})
	workertest.Must(t, err)
	if resp.Outcome != workers.Success {
		t.Fatalf("after: %v %q", resp.Outcome, resp.Error)
	}
}

// A worker that answers one request per stream and closes it, as every
// worker did before streams were reused: each call succeeds, each request
// runs once, and the client opens a stream per call.
func TestStreams_WorkerThatClosesAfterEachResponse(t *testing.T) {
	clientHost, serverHost := workertest.NewHost(t), workertest.NewHost(t)
	seen := make(chan string, 100)
	serverHost.SetStreamHandler(ProtocolID(workertest.Network), func(s network.Stream) {
		body, _, err := frame.Read(s, frameLimit(workers.DefaultMaxPayload), nil)
		if err != nil {
			_ = s.Reset()
			return
		}
		req, err := decodeRequest(body, workers.DefaultMaxPayload)
		if err != nil {
			_ = s.Reset()
			return
		}
		seen <- req.ID
		if _, err := s.Write(appendResponse(nil, &Response{ID: req.ID, Result: workers.OK(req.Payload)})); err != nil {
			_ = s.Reset()
			return
		}
		_ = s.Close()
	})
	workertest.Connect(t, clientHost, serverHost)
	c, err := NewClient(clientHost, workertest.Network)
	workertest.Must(t, err)
	const n = 8
	for i := range n {
		mustEcho(t, c, serverHost.ID(), fmt.Sprint("old-", i))
	}
	for i := range n {
		if got, want := workertest.Recv(t, seen, "a request at the worker"), fmt.Sprint("old-", i); got != want {
			t.Errorf("the worker read %q, want %q", got, want)
		}
	}
	select {
	case id := <-seen:
		t.Errorf("the worker read %q twice", id)
	default:
	}
	if got := c.opened.Load(); got < n {
		t.Errorf("%d streams opened for %d calls to a worker that closes each", got, n)
	}
}

// watchedIdle reports whether every stream c keeps idle for p has its idle
// watch pending.
func (c *Client) watchedIdle(p peer.ID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cs := range c.idle[p] {
		if cs.watch == nil {
			return false
		}
	}
	return len(c.idle[p]) > 0
}

// A stream idle in the pool gets a watch, a read pending on it; the call
// that takes the stream takes that read over as the first byte of its
// response, on both transports, again and again.
func TestStreams_WatchedIdleStreamIsTakenOver(t *testing.T) {
	for _, tc := range transports {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.hosts(t)
			p := newPairOn(t, a, b, nil)
			for i := range 3 {
				mustEcho(t, p.client, p.serverHost.ID(), fmt.Sprint("call-", i))
				testkit.WaitFor(t, workertest.FailAfter, "the idle stream's watch", func() error {
					if !p.client.watchedIdle(p.serverHost.ID()) {
						return errors.New("not watched yet")
					}
					return nil
				})
			}
			mustEcho(t, p.client, p.serverHost.ID(), "last")
			if got := p.client.opened.Load(); got != 1 {
				t.Errorf("%d streams opened, want every call on the first", got)
			}
			if st := p.server.Stats(); st.Malformed != 0 || st.Dropped != 0 {
				t.Errorf("server stats %+v", st)
			}
		})
	}
}

// The server's idle timeout counts from a stream's last request: a stream
// that carries requests for longer than the timeout stays open, and ends
// once it has waited the timeout for its next one.
func TestStreams_ServerIdleTimeoutCountsFromTheLastRequest(t *testing.T) {
	const idle = 150 * time.Millisecond
	p := newPair(t, nil, WithIdleTimeout(idle))
	start := time.Now()
	tick := time.NewTicker(idle / 3)
	defer tick.Stop()
	calls := 0
	var last time.Time
	for {
		mustEcho(t, p.client, p.serverHost.ID(), fmt.Sprint("call-", calls))
		last = time.Now()
		calls++
		if time.Since(start) >= 3*idle {
			break
		}
		<-tick.C // the pace of the requests, a third of the idle timeout apart
	}
	if got := p.client.opened.Load(); got != 1 {
		t.Errorf("%d streams opened for %d calls over %s, want one: a stream in use is not idle", got, calls, 3*idle)
	}
	testkit.WaitFor(t, workertest.FailAfter, "the server to end the idle stream", func() error {
		if n := workStreams(p.serverHost, p.clientHost.ID()); n != 0 {
			return fmt.Errorf("%d work streams open at the server", n)
		}
		return nil
	})
	if waited := time.Since(last); waited < idle {
		t.Errorf("the stream ended %s after its last request, want at least the idle timeout %s", waited, idle)
	}
}
