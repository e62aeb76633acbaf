package protocol

// The work server with its admission hooks: access limits (PeerLimiter)
// and fault injection (Interceptor), through real streams.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/access"
	"github.com/workmesh/workmesh/workers/faults"
	"github.com/workmesh/workmesh/workers/workertest"
)

func TestAccess_AllowlistServesListedPeerAndDeniesOthers(t *testing.T) {
	counter := &workertest.Counter{}
	// The pair's own client is a stranger; only allowedHost is listed.
	allowedHost := workertest.NewHost(t)
	acc := limiter(t, func(c *config.AccessConfig) {
		c.AcceptWorkFrom, c.AllowPeers = config.AcceptAllowlist, []string{allowedHost.ID().String()}
	})
	p := newPair(t, map[string]workers.Handler{"count": counter}, WithPeerLimiter(acc))
	workertest.Connect(t, allowedHost, p.serverHost)
	allowed, err := NewClient(allowedHost, workertest.Network)
	workertest.Must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()

	resp, err := allowed.Do(ctx, p.serverHost.ID(), Request{ID: "ok", Type: "count", Payload: []byte("x")})
	workertest.Must(t, err)
	if resp.Outcome != workers.Success || counter.Runs.Load() != 1 {
		t.Fatalf("allowlisted peer: %v %q, %d runs", resp.Outcome, resp.Error, counter.Runs.Load())
	}

	resp, err = p.do(t, ctx, Request{ID: "no", Type: "count", Payload: []byte("x")})
	workertest.Must(t, err)
	if resp.Outcome != workers.Denied || resp.Error != access.NotAllowedError || resp.ID != "no" {
		t.Errorf("other peer: %v %q (id %q), want Denied %q", resp.Outcome, resp.Error, resp.ID, access.NotAllowedError)
	}
	if n := counter.Runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1: it ran for the denied peer", n)
	}
	for range 2 {
		workertest.Recv(t, p.served, "the server to finish a stream")
	}
	if st := acc.Stats(); st != (access.AccessStats{Denied: 1}) {
		t.Errorf("access stats = %+v, want 1 denied", st)
	}
	if st := p.server.Stats(); st.ByOutcome[workers.Denied] != 1 || st.ByOutcome[workers.Success] != 1 {
		t.Errorf("server counts = %+v", st.ByOutcome)
	}
	if n := acc.Tracked(); n != 0 {
		t.Errorf("access holds state for %d peers after every stream ended", n)
	}
	// The allowed peer's stream is kept for its next request; the denied
	// one's is closed with the answer, not kept for the stranger to hold.
	testkit.WaitFor(t, workertest.FailAfter, "one stream waiting, the allowed peer's", func() error {
		if n := p.server.Stats().Waiting; n != 1 {
			return fmt.Errorf("%d waiting", n)
		}
		return nil
	})
}

func TestAccess_PeerStreamLimitIsBusyAtOnce(t *testing.T) {
	g := workertest.NewGate(true)
	defer g.Open()
	acc := limiter(t, func(c *config.AccessConfig) { c.PeerMaxStreams = 2 })
	p := newPair(t, map[string]workers.Handler{"gate": g}, WithPeerLimiter(acc))
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()

	held := make([]chan workers.Result, 2)
	for i := range held {
		held[i] = make(chan workers.Result, 1)
		go func() {
			r, err := p.client.Do(ctx, p.serverHost.ID(), Request{Type: "gate", Payload: []byte(fmt.Sprint(i))})
			if err != nil {
				r.Result = workers.Fail(workers.RetryableError, "%v", err)
			}
			held[i] <- r.Result
		}()
		workertest.Recv(t, g.Started, "a gate request to start")
	}

	// The limit is held: the next request is answered busy, not queued
	// (a queued one would wait for the gate and hit this short deadline).
	short, cancelShort := context.WithTimeout(ctx, workertest.FailAfter/2)
	defer cancelShort()
	resp, err := p.do(t, short, Request{ID: "third", Type: "gate"})
	workertest.Must(t, err)
	if resp.Outcome != workers.Busy || !strings.Contains(resp.Error, "2 work streams open, at most 2 per peer") {
		t.Fatalf("over the stream limit: %v %q, want Busy", resp.Outcome, resp.Error)
	}
	if n := g.Runs.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want 2", n)
	}

	// Another peer has limits of its own.
	other := workertest.NewHost(t)
	workertest.Connect(t, other, p.serverHost)
	otherClient, err := NewClient(other, workertest.Network)
	workertest.Must(t, err)
	resp, err = otherClient.Do(ctx, p.serverHost.ID(), Request{Type: "echo", Payload: []byte("mine")})
	workertest.Must(t, err)
	if resp.Outcome != workers.Success {
		t.Errorf("another peer while the first is at its limit: %v %q", resp.Outcome, resp.Error)
	}

	g.Open()
	for _, ch := range held {
		if r := workertest.Recv(t, ch, "a held request to finish"); r.Outcome != workers.Success {
			t.Errorf("held request: %v %q", r.Outcome, r.Error)
		}
	}
	// The streams are given back once the server is done with them.
	for range 4 { // two held, the busy one, the other peer's
		workertest.Recv(t, p.served, "the server to finish a stream")
	}
	resp, err = p.do(t, ctx, Request{Type: "echo", Payload: []byte("again")})
	workertest.Must(t, err)
	if resp.Outcome != workers.Success {
		t.Errorf("after the held streams ended: %v %q", resp.Outcome, resp.Error)
	}
	if st := acc.Stats(); st != (access.AccessStats{OverStreams: 1}) {
		t.Errorf("access stats = %+v, want 1 over-streams", st)
	}
}

func TestAccess_PeerRateLimitIsBusy(t *testing.T) {
	// A bucket of 2 that refills once in 1000s: the third request in a
	// row is over the rate.
	acc := limiter(t, func(c *config.AccessConfig) { c.PeerRate, c.PeerBurst = 0.001, 2 })
	p := newPair(t, nil, WithPeerLimiter(acc))
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()
	for i := range 3 {
		resp, err := p.do(t, ctx, Request{Type: "echo", Payload: []byte("x")})
		workertest.Must(t, err)
		want := workers.Success
		if i == 2 {
			want = workers.Busy
		}
		if resp.Outcome != want {
			t.Fatalf("request %d: %v %q, want %v", i+1, resp.Outcome, resp.Error, want)
		}
		if i == 2 && !strings.Contains(resp.Error, "more than 0.001 requests per second (burst 2)") {
			t.Errorf("busy message %q does not say which limit", resp.Error)
		}
	}
	if st := acc.Stats(); st != (access.AccessStats{OverRate: 1}) {
		t.Errorf("access stats = %+v, want 1 over-rate", st)
	}
}

func TestFaults_ErrorRateOneAnswersRetryableWithoutRunning(t *testing.T) {
	counter := &workertest.Counter{}
	inj := injector(t, config.FaultConfig{ErrorRate: 1})
	p := newPair(t, map[string]workers.Handler{"count": counter}, WithInterceptor(inj))
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()
	resp, err := p.do(t, ctx, Request{ID: "e", Type: "count", Payload: []byte("x")})
	workertest.Must(t, err)
	if resp.Outcome != workers.RetryableError || resp.Error != faults.FaultInjectionError || resp.ID != "e" {
		t.Errorf("response = %v %q, want RetryableError %q", resp.Outcome, resp.Error, faults.FaultInjectionError)
	}
	if n := counter.Runs.Load(); n != 0 {
		t.Errorf("the handler ran %d times under an error rate of 1", n)
	}
	workertest.Recv(t, p.served, "the server to finish the stream")
	if st := inj.Stats(); st != (faults.FaultStats{Errors: 1}) {
		t.Errorf("fault stats = %+v", st)
	}
	if st := p.pool.Stats(); st.InFlight != 0 || st.Queued != 0 {
		t.Errorf("pool still holds the faulted request: %+v", st)
	}
}

func TestFaults_DropRateOneResetsTheStreamAtOnce(t *testing.T) {
	counter := &workertest.Counter{}
	inj := injector(t, config.FaultConfig{DropRate: 1})
	p := newPair(t, map[string]workers.Handler{"count": counter}, WithInterceptor(inj))
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()
	_, err := p.do(t, ctx, Request{Type: "count", Payload: []byte("x")})
	if err == nil || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		t.Fatalf("client error = %v, want the stream reset well before the deadline", err)
	}
	sr := workertest.Recv(t, p.served, "the server to finish the stream")
	if !errors.Is(sr.Err, faults.ErrFaultDropped) || sr.Outcome != 0 {
		t.Errorf("served = %+v, want no response and faults.ErrFaultDropped", sr)
	}
	if n := counter.Runs.Load(); n != 0 {
		t.Errorf("the handler ran %d times under a drop rate of 1", n)
	}
	if st := p.server.Stats(); st.Dropped != 1 || len(st.ByOutcome) != 0 {
		t.Errorf("server stats = %+v, want 1 dropped and no response", st)
	}
	if st := inj.Stats(); st != (faults.FaultStats{Drops: 1}) {
		t.Errorf("fault stats = %+v", st)
	}
}

func TestFaults_DelayIsHonouredAndCancellable(t *testing.T) {
	delaying := make(chan struct{}, 10)
	inj := injector(t, config.FaultConfig{Delay: 150 * time.Millisecond}, faults.WithOnDelay(func() { delaying <- struct{}{} }))
	g := workertest.NewGate(true)
	defer g.Open()
	p := newPair(t, map[string]workers.Handler{"gate": g}, WithInterceptor(inj))
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()

	t.Run("honoured", func(t *testing.T) {
		start := time.Now()
		resp, err := p.do(t, ctx, Request{Type: "echo", Payload: []byte("late")})
		workertest.Must(t, err)
		if took := time.Since(start); resp.Outcome != workers.Success || took < 150*time.Millisecond {
			t.Errorf("delayed request: %v after %s, want success after at least 150ms", resp.Outcome, took)
		}
		workertest.Recv(t, delaying, "the delay to start")
		workertest.Recv(t, p.served, "the server to finish the stream")
	})

	// Long enough that only cutting it short ends a test in time, short
	// enough that a server that cannot cut it still closes.
	workertest.Must(t, inj.Set(config.FaultConfig{Delay: 3 * workertest.FailAfter}))
	t.Run("cut by the request deadline", func(t *testing.T) {
		resp, err := p.do(t, ctx, Request{Type: "gate", Timeout: 100 * time.Millisecond})
		workertest.Must(t, err)
		if resp.Outcome != workers.RetryableError || !strings.Contains(resp.Error, "delay of 30s cut short") {
			t.Errorf("response = %v %q, want a retryable error saying the delay was cut short", resp.Outcome, resp.Error)
		}
		workertest.Recv(t, delaying, "the delay to start")
		workertest.Recv(t, p.served, "the server to finish the stream")
	})
	t.Run("cut by the client going away", func(t *testing.T) {
		cctx, ccancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := p.client.Do(cctx, p.serverHost.ID(), Request{Type: "gate"})
			errc <- err
		}()
		workertest.Recv(t, delaying, "the delay to start")
		ccancel()
		if err := workertest.Recv(t, errc, "the client to return"); !errors.Is(err, context.Canceled) {
			t.Errorf("client error = %v", err)
		}
		sr := workertest.Recv(t, p.served, "the server to end the delayed stream")
		if !errors.Is(sr.Err, ErrClientGone) {
			t.Errorf("served = %+v, want ErrClientGone", sr)
		}
	})
	if n := g.Runs.Load(); n != 0 {
		t.Errorf("the handler ran %d times for requests whose delay was cut short", n)
	}
	if st := p.pool.Stats(); st.InFlight != 0 || st.Queued != 0 {
		t.Errorf("pool still holds delayed requests: %+v", st)
	}
	if st := inj.Stats(); st.Delays != 3 {
		t.Errorf("fault stats = %+v, want 3 delays", st)
	}
}

func TestFaults_ChangedAtRunTimeThroughTheAPI(t *testing.T) {
	inj := injector(t, config.FaultConfig{})
	p := newPair(t, nil, WithInterceptor(inj))
	api := faultsAPI(t, inj)
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()

	code, body := call(t, api, http.MethodGet, "")
	if code != http.StatusOK || !sameJSON(t, body, `{"error_rate":0,"delay":"0s","drop_rate":0}`) {
		t.Fatalf("GET = %d %s", code, body)
	}
	code, body = call(t, api, http.MethodPut, `{"error_rate": 1, "delay": "1ms"}`)
	if code != http.StatusOK || !sameJSON(t, body, `{"error_rate":1,"delay":"1ms","drop_rate":0}`) {
		t.Fatalf("PUT = %d %s", code, body)
	}
	resp, err := p.do(t, ctx, Request{Type: "echo", Payload: []byte("x")})
	workertest.Must(t, err)
	if resp.Outcome != workers.RetryableError || resp.Error != faults.FaultInjectionError {
		t.Errorf("after PUT error_rate 1: %v %q", resp.Outcome, resp.Error)
	}
	var view faults.FaultView
	b, err := json.Marshal(inj.View())
	workertest.Must(t, err)
	workertest.Must(t, json.Unmarshal(b, &view))
	if !view.Active || view.ErrorRate != 1 || view.Delay != "1ms" || view.Injected.Errors != 1 {
		t.Errorf("View() = %s", b)
	}

	// Refused changes say why and change nothing.
	for _, bad := range []struct {
		body string
		code int
		want string
	}{
		{`{"error_rate": 2}`, 400, "fault-error-rate 2 must be between 0 and 1"},
		{`{"delay": "soon"}`, 400, `delay: want a Go duration such as \"250ms\"`},
		{`{"delay": 5}`, 400, "body: want a JSON object"},
		{`{"error_rate": 0, "rate": 1}`, 400, `unknown field \"rate\"`},
		{`{} {}`, 400, "unexpected data after the JSON object"},
		{`null`, 400, "body: want a JSON object"},
		{``, 400, "body: want a JSON object"},
		{`{"delay": "` + strings.Repeat("1", 5000) + `ms"}`, 413, "body: larger than 4096 bytes"},
	} {
		code, body := call(t, api, http.MethodPut, bad.body)
		if code != bad.code || !strings.Contains(body, bad.want) || !strings.HasPrefix(body, `{"error":`) {
			t.Errorf("PUT %.40s = %d %s, want %d with %q", bad.body, code, body, bad.code, bad.want)
		}
	}
	if got := inj.Get(); got != (config.FaultConfig{ErrorRate: 1, Delay: time.Millisecond}) {
		t.Errorf("refused PUTs changed the settings to %+v", got)
	}
	if code, body := call(t, api, http.MethodPost, "{}"); code != http.StatusMethodNotAllowed || !strings.Contains(body, "want GET, or PUT") {
		t.Errorf("POST = %d %s", code, body)
	}

	// A missing field is off: PUT {} turns every fault off.
	if code, body := call(t, api, http.MethodPut, `{}`); code != http.StatusOK {
		t.Fatalf("PUT {} = %d %s", code, body)
	}
	resp, err = p.do(t, ctx, Request{Type: "echo", Payload: []byte("x")})
	workertest.Must(t, err)
	if resp.Outcome != workers.Success {
		t.Errorf("after PUT {}: %v %q", resp.Outcome, resp.Error)
	}
	if inj.View().Active {
		t.Error("View().Active after every fault was turned off")
	}
}

func TestProtocol_SilentPeerIsFreedByTheReadDeadline(t *testing.T) {
	// A peer that opens a stream and never writes a byte of its request
	// holds a stream until the read deadline, no more, and neither its own
	// later requests nor anyone else's wait for it (access counts a
	// stream only once its request is in).
	acc := limiter(t, func(c *config.AccessConfig) { c.PeerMaxStreams = 1 })
	p := newPair(t, nil, WithRequestReadTimeout(300*time.Millisecond), WithPeerLimiter(acc))
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()

	silent := rawStream(t, p.clientHost, p.serverHost)
	_, err := silent.Write(nil) // the protocol header only: the handler runs, no request comes
	workertest.Must(t, err)
	opened := time.Now()
	resp, err := p.do(t, ctx, Request{ID: "meanwhile", Type: "echo", Payload: []byte("meanwhile")})
	workertest.Must(t, err)
	if resp.Outcome != workers.Success {
		t.Fatalf("the same peer while its other stream is silent: %v %q", resp.Outcome, resp.Error)
	}
	var silentEnd ServedRequest
	for range 2 {
		if sr := workertest.Recv(t, p.served, "the normal and the silent stream to end"); sr.ID != "meanwhile" {
			silentEnd = sr
		}
	}
	if !errors.Is(silentEnd.Err, os.ErrDeadlineExceeded) || silentEnd.Outcome != 0 {
		t.Errorf("silent stream ended with %+v, want a read deadline error and no response", silentEnd)
	}
	if took := time.Since(opened); took > workertest.FailAfter/2 {
		t.Errorf("the silent stream was held %s", took)
	}
	if _, err := io.ReadAll(silent); err == nil {
		t.Error("the silent peer's stream ended cleanly; want a reset with no answer")
	}
	if st := p.server.Stats(); st.Malformed != 1 || st.ByOutcome[workers.Success] != 1 {
		t.Errorf("server stats = %+v, want 1 malformed and 1 success", st)
	}
}

// limiter returns the access settings (defaults changed by edit) the
// server asks as its PeerLimiter.
func limiter(t testing.TB, edit func(*config.AccessConfig)) *access.Access {
	c := config.Defaults().Access
	edit(&c)
	a, err := access.New(c)
	workertest.Must(t, err)
	return a
}

// injector returns fault injection with cfg, as the server's Interceptor.
func injector(t testing.TB, cfg config.FaultConfig, opts ...faults.Option) *faults.Faults {
	f, err := faults.New(cfg, opts...)
	workertest.Must(t, err)
	return f
}

// faultsAPI returns f's handler mounted the way the node mounts it.
func faultsAPI(t testing.TB, f *faults.Faults) http.Handler {
	t.Helper()
	mux := http.NewServeMux()
	workertest.Must(t, f.Register(func(pattern string, h http.Handler) error { mux.Handle(pattern, h); return nil }))
	mux.Handle(faults.FaultsPath, f) // the other methods, to see them refused
	return mux
}

// call serves one request on h and returns the status and body.
func call(t testing.TB, h http.Handler, method, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, faults.FaultsPath, strings.NewReader(body)))
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: content type %q", method, faults.FaultsPath, ct)
	}
	return rec.Code, rec.Body.String()
}

// sameJSON reports whether body is one JSON value equal to want: the same
// fields with the same values, none more, whatever the layout (the API
// indents its answers).
func sameJSON(t testing.TB, body, want string) bool {
	t.Helper()
	var got, exp any
	dec := json.NewDecoder(strings.NewReader(body))
	if err := dec.Decode(&got); err != nil || dec.More() {
		t.Errorf("body %q: not one JSON value (%v)", body, err)
		return false
	}
	workertest.Must(t, json.Unmarshal([]byte(want), &exp))
	return reflect.DeepEqual(got, exp)
}
