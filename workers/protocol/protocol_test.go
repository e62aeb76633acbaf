package protocol

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/reqctx"
	"github.com/workmesh/workmesh/workers/workertest"
)

// pair is a client host and a server host, connected, with the work
// protocol served on the server.
type pair struct {
	clientHost, serverHost host.Host
	pool                   *pool.Pool
	server                 *Server
	client                 *Client
	served                 chan ServedRequest
}

func newPair(t testing.TB, handlers map[string]workers.Handler, opts ...Option) *pair {
	t.Helper()
	p := newPairOn(t, workertest.NewHost(t), workertest.NewHost(t), handlers, opts...)
	workertest.Connect(t, p.clientHost, p.serverHost)
	return p
}

// newPairOn is newPair on the given hosts, which it does not connect.
func newPairOn(t testing.TB, clientHost, serverHost host.Host, handlers map[string]workers.Handler, opts ...Option) *pair {
	t.Helper()
	p := &pair{clientHost: clientHost, serverHost: serverHost, served: make(chan ServedRequest, 1000)}
	p.pool = workertest.NewPool(t, 4, 16, handlers)
	opts = append([]Option{
		WithLogger(workertest.QuietLogger()),
		WithObserver(func(sr ServedRequest) {
			select {
			case p.served <- sr:
			default: // benchmarks do not read it
			}
		}),
	}, opts...)
	var err error
	p.server, err = NewServer(p.serverHost, workertest.Network, p.pool, opts...)
	workertest.Must(t, err)
	t.Cleanup(func() { _ = p.server.Close() })
	p.client, err = NewClient(p.clientHost, workertest.Network)
	workertest.Must(t, err)
	return p
}

func (p *pair) do(t testing.TB, ctx context.Context, req Request) (Response, error) {
	t.Helper()
	type out struct {
		resp Response
		err  error
	}
	ch := make(chan out, 1)
	go func() {
		resp, err := p.client.Do(ctx, p.serverHost.ID(), req)
		ch <- out{resp, err}
	}()
	o := workertest.Recv(t, ch, "the client call to return")
	return o.resp, o.err
}

func TestProtocolID(t *testing.T) {
	if got := ProtocolID("devnet"); got != "/workmesh/devnet/work/1.0.0" {
		t.Errorf("ProtocolID(devnet) = %s", got)
	}
	h := workertest.NewHost(t)
	for _, bad := range []string{"", "a/b", "with space"} {
		if _, err := NewClient(h, bad); err == nil {
			t.Errorf("NewClient accepted network %q", bad)
		}
	}
}

func TestProtocol_EchoAndSHA256RoundTrip(t *testing.T) {
	p := newPair(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()

	big := strings.Repeat("0123456789abcdef", 16<<10) // 256 KiB: several QUIC packets and a memory reservation
	for _, payload := range []string{"hello", "", big} {
		resp, err := p.do(t, ctx, Request{ID: "echo-1", Type: "echo", Payload: []byte(payload)})
		workertest.Must(t, err)
		if resp.ID != "echo-1" || resp.Outcome != workers.Success || string(resp.Output) != payload {
			t.Errorf("echo of %d bytes: %+v", len(payload), resp.Result.Outcome)
		}
	}
	sum := sha256.Sum256([]byte(big))
	resp, err := p.do(t, ctx, Request{ID: "sha-1", Type: "sha256", Payload: []byte(big)})
	workertest.Must(t, err)
	if resp.Outcome != workers.Success || string(resp.Output) != hex.EncodeToString(sum[:]) {
		t.Errorf("sha256: %v %q", resp.Outcome, resp.Output)
	}
	for range 4 { // the server counts a response after writing it
		workertest.Recv(t, p.served, "the server to finish a stream")
	}
	if got := p.server.Stats().ByOutcome[workers.Success]; got != 4 {
		t.Errorf("server counted %d successes, want 4", got)
	}
}

func TestProtocol_ConcurrentRequestsGetTheirOwnResponses(t *testing.T) {
	p := newPair(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			id := fmt.Sprint("req-", i)
			resp, err := p.client.Do(ctx, p.serverHost.ID(), Request{ID: id, Type: "echo", Payload: []byte(id)})
			if err != nil {
				t.Errorf("%s: %v", id, err)
				return
			}
			if resp.Outcome == workers.Busy {
				return // 16 at once on 4+16 slots may see busy; not a mix-up
			}
			if resp.ID != id || string(resp.Output) != id {
				t.Errorf("%s got response %q with output %q", id, resp.ID, resp.Output)
			}
		})
	}
	wg.Wait()
}

func TestProtocol_OutcomesDeniedUnsupportedBusy(t *testing.T) {
	g := workertest.NewGate(true)
	defer g.Open()
	var denied sync.Map
	p := newPair(t, map[string]workers.Handler{"gate": g}, WithAllow(func(id peer.ID) bool {
		_, no := denied.Load(id)
		return !no
	}))
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()

	resp, err := p.do(t, ctx, Request{Type: "resize"})
	workertest.Must(t, err)
	if resp.Outcome != workers.Unsupported || !strings.Contains(resp.Error, "served: echo, gate, sha256, sleep") {
		t.Errorf("unknown type: %v %q", resp.Outcome, resp.Error)
	}

	// Fill the server's pool (4 running over the network, 16 admitted
	// locally, which is synchronous), then a request is busy.
	var running []<-chan workers.Result
	for i := range 4 {
		ch := make(chan workers.Result, 1)
		go func() {
			r, err := p.client.Do(ctx, p.serverHost.ID(), Request{Type: "gate", Payload: []byte(fmt.Sprint(i))})
			if err != nil {
				r.Result = workers.Fail(workers.RetryableError, "%v", err)
			}
			ch <- r.Result
		}()
		running = append(running, ch)
		workertest.Recv(t, g.Started, "a gate request to start")
	}
	for range 16 {
		tk, res, ok := p.pool.Admit(ctx, "echo", nil)
		if !ok {
			t.Fatalf("local admit: %v %q", res.Outcome, res.Error)
		}
		ch := make(chan workers.Result, 1)
		go func() { ch <- p.pool.RunInline(tk) }()
		running = append(running, ch)
	}
	resp, err = p.do(t, ctx, Request{Type: "gate"})
	workertest.Must(t, err)
	if resp.Outcome != workers.Busy || !strings.Contains(resp.Error, "4 running, 16 of 16 queued") {
		t.Errorf("full pool: %v %q, want Busy", resp.Outcome, resp.Error)
	}
	g.Open()
	for _, ch := range running {
		if r := workertest.Recv(t, ch, "a gate result"); r.Outcome != workers.Success {
			t.Errorf("gate: %v %q", r.Outcome, r.Error)
		}
	}

	denied.Store(p.clientHost.ID(), true)
	resp, err = p.do(t, ctx, Request{Type: "echo", Payload: []byte("x")})
	workertest.Must(t, err)
	if resp.Outcome != workers.Denied || len(resp.Output) != 0 {
		t.Errorf("denied peer: %v %q", resp.Outcome, resp.Output)
	}
	// The server counts a response once it is written, which may be just
	// after the client read it: wait for the server to finish the stream.
	for range 1 + 4 + 1 + 1 { // unsupported, the gates, busy, denied
		workertest.Recv(t, p.served, "the server to finish a stream")
	}
	st := p.server.Stats()
	if st.ByOutcome[workers.Unsupported] != 1 || st.ByOutcome[workers.Busy] != 1 || st.ByOutcome[workers.Denied] != 1 || st.ByOutcome[workers.Success] != 4 {
		t.Errorf("server counts = %+v", st.ByOutcome)
	}
}

// TestProtocol_ClientCancelCancelsServerHandler: a call ends when its
// caller cancels its context, and the worker's handler is cancelled as
// the client is gone, with no response written. Under a plain context the
// client watches it through context.AfterFunc; under the dispatcher's
// request context (reqctx) through its Watch, with no allocation. (At the
// deadline the worker's own deadline, the same, may come first.)
func TestProtocol_ClientCancelCancelsServerHandler(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func(parent context.Context) (context.Context, func())
	}{
		{"plain context", func(parent context.Context) (context.Context, func()) { return parent, func() {} }},
		{"request context", func(parent context.Context) (context.Context, func()) {
			c := reqctx.WithDeadline(parent, time.Now().Add(time.Minute))
			return c, c.Stop
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := workertest.NewGate(true)
			defer g.Open()
			p := newPair(t, map[string]workers.Handler{"gate": g})
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			ctx, stop := tc.ctx(parent)
			defer stop()
			errc := make(chan error, 1)
			go func() {
				_, err := p.client.Do(ctx, p.serverHost.ID(), Request{Type: "gate", Timeout: time.Minute})
				errc <- err
			}()
			workertest.Recv(t, g.Started, "the handler to start")
			cancel()
			if err := workertest.Recv(t, errc, "the client to return"); !errors.Is(err, context.Canceled) {
				t.Errorf("client error = %v, want context.Canceled", err)
			}
			if cause := workertest.Recv(t, g.Cancelled, "the server handler's context to be cancelled"); !errors.Is(cause, ErrClientGone) {
				t.Errorf("handler context cause = %v, want ErrClientGone", cause)
			}
			sr := workertest.Recv(t, p.served, "the server to finish the stream")
			if !errors.Is(sr.Err, ErrClientGone) || sr.Outcome != 0 {
				t.Errorf("served = %+v, want no response and ErrClientGone", sr)
			}
			if st := p.server.Stats(); st.Dropped != 1 {
				t.Errorf("Stats().Dropped = %d, want 1", st.Dropped)
			}
		})
	}
}

// silentServer registers a work protocol handler on h that reads the
// request and never answers until the test ends.
func silentServer(t testing.TB, h host.Host) <-chan struct{} {
	got := make(chan struct{}, 10)
	release := make(chan struct{})
	h.SetStreamHandler(ProtocolID(workertest.Network), func(s network.Stream) {
		got <- struct{}{}
		<-release
		_ = s.Reset()
	})
	t.Cleanup(func() { close(release) })
	return got
}

func TestProtocol_SilentServerBoundedByClientContext(t *testing.T) {
	clientHost, serverHost := workertest.NewHost(t), workertest.NewHost(t)
	reached := silentServer(t, serverHost)
	workertest.Connect(t, clientHost, serverHost)
	client, err := NewClient(clientHost, workertest.Network)
	workertest.Must(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := client.Do(ctx, serverHost.ID(), Request{Type: "echo", Payload: []byte("x")})
		errc <- err
	}()
	workertest.Recv(t, reached, "the request to reach the silent server")
	if err := workertest.Recv(t, errc, "the client to give up at its deadline"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error = %v, want context.DeadlineExceeded", err)
	}

	// With no deadline on the context, the client's default timeout bounds it.
	client, err = NewClient(clientHost, workertest.Network, WithDefaultTimeout(100*time.Millisecond))
	workertest.Must(t, err)
	go func() {
		_, err := client.Do(context.Background(), serverHost.ID(), Request{Type: "echo"})
		errc <- err
	}()
	if err := workertest.Recv(t, errc, "the client to give up at its default timeout"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error = %v, want context.DeadlineExceeded", err)
	}
}

func TestProtocol_AcceptTimeoutBoundsTimeToAccept(t *testing.T) {
	t.Run("silent server", func(t *testing.T) {
		clientHost, serverHost := workertest.NewHost(t), workertest.NewHost(t)
		silentServer(t, serverHost)
		workertest.Connect(t, clientHost, serverHost)
		client, err := NewClient(clientHost, workertest.Network)
		workertest.Must(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
		defer cancel()
		start := time.Now()
		_, err = client.Do(ctx, serverHost.ID(), Request{Type: "echo", AcceptTimeout: 100 * time.Millisecond})
		if !errors.Is(err, ErrAcceptTimeout) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error = %v, want ErrAcceptTimeout", err)
		}
		if took := time.Since(start); took > workertest.FailAfter/2 {
			t.Errorf("gave up after %s", took)
		}
	})
	t.Run("transport without stream deadlines", func(t *testing.T) {
		// go-libp2p's mock network ignores stream deadlines, as any
		// transport may: the accept timeout must hold all the same.
		clientHost, serverHost := workertest.MockPair(t)
		silentServer(t, serverHost)
		client, err := NewClient(clientHost, workertest.Network)
		workertest.Must(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
		defer cancel()
		_, err = client.Do(ctx, serverHost.ID(), Request{Type: "echo", AcceptTimeout: 100 * time.Millisecond})
		if !errors.Is(err, ErrAcceptTimeout) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error = %v, want ErrAcceptTimeout", err)
		}
	})
	t.Run("work longer than the grace, transport without stream deadlines", func(t *testing.T) {
		// The server's watchdog (it sends the accept msg) must end
		// its read without a deadline, or the response is never sent.
		clientHost, serverHost := workertest.MockPair(t)
		p := newPairOn(t, clientHost, serverHost, nil)
		ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
		defer cancel()
		resp, err := p.do(t, ctx, Request{Type: "sleep", Payload: []byte("100ms"), AcceptTimeout: 100 * time.Millisecond})
		workertest.Must(t, err)
		if resp.Outcome != workers.Success {
			t.Fatalf("slow work: %v %q", resp.Outcome, resp.Error)
		}
	})
	t.Run("work longer than the accept timeout", func(t *testing.T) {
		p := newPair(t, nil)
		ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
		defer cancel()
		// The work takes three accept timeouts; only the accept frame
		// keeps the client waiting for it.
		resp, err := p.do(t, ctx, Request{Type: "sleep", Payload: []byte("300ms"), AcceptTimeout: 100 * time.Millisecond})
		workertest.Must(t, err)
		if resp.Outcome != workers.Success {
			t.Fatalf("slow work: %v %q", resp.Outcome, resp.Error)
		}
	})
}

// rawStream opens a bare stream for the work protocol.
func rawStream(t testing.TB, from, to host.Host) network.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()
	s, err := from.NewStream(ctx, to.ID(), ProtocolID(workertest.Network))
	workertest.Must(t, err)
	t.Cleanup(func() { _ = s.Reset() })
	_ = s.SetDeadline(time.Now().Add(workertest.FailAfter))
	return s
}

func TestProtocol_HalfMessageGetsCleanErrorAndServerKeepsServing(t *testing.T) {
	p := newPair(t, nil, WithRequestReadTimeout(300*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()

	// A peer that stalls in the middle of its request holds nothing up.
	stalled := rawStream(t, p.clientHost, p.serverHost)
	msg := appendRequest(nil, &Request{ID: "half", Type: "echo", Payload: []byte("0123456789")})
	_, err := stalled.Write(msg[:len(msg)/2])
	workertest.Must(t, err)
	resp, err := p.do(t, ctx, Request{ID: "meanwhile", Type: "echo", Payload: []byte("meanwhile")})
	workertest.Must(t, err)
	if resp.Outcome != workers.Success || string(resp.Output) != "meanwhile" {
		t.Fatalf("while another peer stalls: %v %q", resp.Outcome, resp.Error)
	}
	for range 2 {
		switch sr := workertest.Recv(t, p.served, "the normal and the stalled request to end"); sr.ID {
		case "meanwhile":
			if sr.Err != nil {
				t.Errorf("normal request: %v", sr.Err)
			}
		default:
			if !errors.Is(sr.Err, os.ErrDeadlineExceeded) {
				t.Errorf("stalled request: %v, want a read deadline error", sr.Err)
			}
		}
	}
	if _, err := io.ReadAll(stalled); err == nil {
		t.Error("the stalled peer's stream ended cleanly; want a reset")
	}

	// A peer that sends half a message and closes gets a reset at once.
	half := rawStream(t, p.clientHost, p.serverHost)
	_, err = half.Write(msg[:len(msg)-3])
	workertest.Must(t, err)
	workertest.Must(t, half.CloseWrite())
	if _, err := io.ReadAll(half); err == nil {
		t.Error("the half message got a clean end of stream; want a reset")
	}
	sr := workertest.Recv(t, p.served, "the half message to be refused")
	if !errors.Is(sr.Err, ErrTruncated) {
		t.Errorf("half message: %v, want ErrTruncated", sr.Err)
	}

	// A header claiming 1 GiB is refused without reading on.
	huge := rawStream(t, p.clientHost, p.serverHost)
	_, err = huge.Write(binary.BigEndian.AppendUint32(nil, 1<<30))
	workertest.Must(t, err)
	if _, err := io.ReadAll(huge); err == nil {
		t.Error("the oversized message got a clean end of stream; want a reset")
	}
	sr = workertest.Recv(t, p.served, "the oversized message to be refused")
	if !errors.Is(sr.Err, ErrFrameTooLarge) {
		t.Errorf("oversized message: %v, want ErrFrameTooLarge", sr.Err)
	}

	resp, err = p.do(t, ctx, Request{Type: "echo", Payload: []byte("after")})
	workertest.Must(t, err)
	if resp.Outcome != workers.Success || string(resp.Output) != "after" {
		t.Fatalf("after the bad peers: %v %q", resp.Outcome, resp.Error)
	}
	workertest.Recv(t, p.served, "the last request to be served") // counted after it was written
	if st := p.server.Stats(); st.Malformed != 3 || st.ByOutcome[workers.Success] != 2 {
		t.Errorf("Stats() = %+v, want 3 malformed and 2 successes", st)
	}
}

func TestProtocol_ServerCloseCancelsWork(t *testing.T) {
	g := workertest.NewGate(true)
	defer g.Open()
	p := newPair(t, map[string]workers.Handler{"gate": g})
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()
	type out struct {
		resp Response
		err  error
	}
	ch := make(chan out, 1)
	go func() {
		resp, err := p.client.Do(ctx, p.serverHost.ID(), Request{Type: "gate"})
		ch <- out{resp, err}
	}()
	workertest.Recv(t, g.Started, "the handler to start")
	closed := make(chan struct{})
	go func() { _ = p.server.Close(); close(closed) }()
	if cause := workertest.Recv(t, g.Cancelled, "the handler to be cancelled by Close"); !errors.Is(cause, ErrServerClosed) {
		t.Errorf("cause = %v, want ErrServerClosed", cause)
	}
	workertest.Recv(t, closed, "Close to return")
	o := workertest.Recv(t, ch, "the client to get an answer")
	if o.err != nil || o.resp.Outcome != workers.RetryableError {
		t.Errorf("client got %v %v, want a retryable error response", o.resp.Outcome, o.err)
	}
	// The protocol is gone: a new call fails.
	if _, err := p.do(t, ctx, Request{Type: "echo"}); err == nil {
		t.Error("a call after Close succeeded")
	}
}

// passedDeadline is a context whose deadline has passed while its timer has
// not fired yet: Err is still nil.
type passedDeadline struct{ context.Context }

func (passedDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A call whose deadline has passed before its context says so ends with
// context.DeadlineExceeded, not with a nil cause in its message.
func TestClientDeadlinePassedBeforeContextEnds(t *testing.T) {
	h := workertest.NewHost(t)
	c, err := NewClient(h, workertest.Network)
	workertest.Must(t, err)
	_, err = c.Do(passedDeadline{context.Background()}, h.ID(), Request{ID: "r1", Type: "echo", Payload: []byte("x")})
	if !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "%!") {
		t.Fatalf("err %v; want context.DeadlineExceeded and a readable message", err)
	}
}
