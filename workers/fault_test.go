package workers

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
)

func newFaults(t testing.TB, cfg config.FaultConfig, opts ...FaultOption) *Faults {
	t.Helper()
	f, err := NewFaults(cfg, opts...)
	must(t, err)
	return f
}

func TestFaults_SetRefusesOutOfBoundsAndKeepsCurrent(t *testing.T) {
	start := config.FaultConfig{ErrorRate: 0.25, Delay: time.Millisecond}
	f := newFaults(t, start)
	tests := []struct {
		cfg  config.FaultConfig
		want string
	}{
		{config.FaultConfig{ErrorRate: 1.5}, "fault-error-rate 1.5 must be between 0 and 1"},
		{config.FaultConfig{DropRate: -0.1}, "fault-drop-rate -0.1 must be between 0 and 1"},
		{config.FaultConfig{Delay: -time.Second}, "fault-delay -1s"},
		{config.FaultConfig{ErrorRate: math.NaN()}, "fault-error-rate is NaN"},
	}
	for _, tt := range tests {
		err := f.Set(tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Set(%+v) = %v, want an error with %q", tt.cfg, err, tt.want)
		}
		if got := f.Get(); got != start {
			t.Errorf("after a refused Set the settings are %+v, want %+v", got, start)
		}
	}
	if _, err := NewFaults(config.FaultConfig{DropRate: 2}); err == nil {
		t.Error("NewFaults accepted a drop rate of 2")
	}
}

func TestFaults_DrawGivesEachItsShare(t *testing.T) {
	// One number decides: [0, drop) drops, [drop, drop+error) fails.
	seq := []float64{0.05, 0.25, 0.45, 0.95}
	i := 0
	f := newFaults(t, config.FaultConfig{DropRate: 0.1, ErrorRate: 0.3}, withFaultRand(func() float64 { i++; return seq[i-1] }))
	want := []faultAction{faultDrop, faultError, faultNone, faultNone}
	for j, w := range want {
		if _, got := f.draw(); got != w {
			t.Errorf("draw %d (u=%g) = %d, want %d", j, seq[j], got, w)
		}
	}

	// Seeded faults repeat, and a rate of 0.5 fails about half.
	a := newFaults(t, config.FaultConfig{ErrorRate: 0.5}, WithFaultSeed(7))
	b := newFaults(t, config.FaultConfig{ErrorRate: 0.5}, WithFaultSeed(7))
	errs := 0
	for range 10000 {
		_, x := a.draw()
		_, y := b.draw()
		if x != y {
			t.Fatal("two Faults with the same seed drew differently")
		}
		if x == faultError {
			errs++
		}
	}
	if errs < 4700 || errs > 5300 {
		t.Errorf("error rate 0.5 failed %d of 10000", errs)
	}
}

func TestFaults_ErrorRateOneAnswersRetryableWithoutRunning(t *testing.T) {
	counter := &countingHandler{}
	faults := newFaults(t, config.FaultConfig{ErrorRate: 1})
	p := newPair(t, map[string]Handler{"count": counter}, WithFaults(faults))
	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()
	resp, err := p.do(t, ctx, Request{ID: "e", Type: "count", Payload: []byte("x")})
	must(t, err)
	if resp.Outcome != RetryableError || resp.Error != FaultInjectionError || resp.ID != "e" {
		t.Errorf("response = %v %q, want RetryableError %q", resp.Outcome, resp.Error, FaultInjectionError)
	}
	if n := counter.runs.Load(); n != 0 {
		t.Errorf("the handler ran %d times under an error rate of 1", n)
	}
	recv(t, p.served, "the server to finish the stream")
	if st := faults.Stats(); st != (FaultStats{Errors: 1}) {
		t.Errorf("fault stats = %+v", st)
	}
	if st := p.pool.Stats(); st.InFlight != 0 || st.Queued != 0 {
		t.Errorf("pool still holds the faulted request: %+v", st)
	}
}

func TestFaults_DropRateOneResetsTheStreamAtOnce(t *testing.T) {
	counter := &countingHandler{}
	faults := newFaults(t, config.FaultConfig{DropRate: 1})
	p := newPair(t, map[string]Handler{"count": counter}, WithFaults(faults))
	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()
	_, err := p.do(t, ctx, Request{Type: "count", Payload: []byte("x")})
	if err == nil || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		t.Fatalf("client error = %v, want the stream reset well before the deadline", err)
	}
	sr := recv(t, p.served, "the server to finish the stream")
	if !errors.Is(sr.Err, ErrFaultDropped) || sr.Outcome != 0 {
		t.Errorf("served = %+v, want no response and ErrFaultDropped", sr)
	}
	if n := counter.runs.Load(); n != 0 {
		t.Errorf("the handler ran %d times under a drop rate of 1", n)
	}
	if st := p.server.Stats(); st.Dropped != 1 || len(st.ByOutcome) != 0 {
		t.Errorf("server stats = %+v, want 1 dropped and no response", st)
	}
	if st := faults.Stats(); st != (FaultStats{Drops: 1}) {
		t.Errorf("fault stats = %+v", st)
	}
}

func TestFaults_DelayIsHonouredAndCancellable(t *testing.T) {
	faults := newFaults(t, config.FaultConfig{Delay: 150 * time.Millisecond})
	delaying := make(chan struct{}, 10)
	faults.onDelay = func() { delaying <- struct{}{} }
	g := newGate(true)
	defer g.open()
	p := newPair(t, map[string]Handler{"gate": g}, WithFaults(faults))
	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()

	t.Run("honoured", func(t *testing.T) {
		start := time.Now()
		resp, err := p.do(t, ctx, Request{Type: "echo", Payload: []byte("late")})
		must(t, err)
		if took := time.Since(start); resp.Outcome != Success || took < 150*time.Millisecond {
			t.Errorf("delayed request: %v after %s, want success after at least 150ms", resp.Outcome, took)
		}
		recv(t, delaying, "the delay to start")
		recv(t, p.served, "the server to finish the stream")
	})

	// Long enough that only cutting it short ends a test in time, short
	// enough that a server that cannot cut it still closes.
	must(t, faults.Set(config.FaultConfig{Delay: 3 * failAfter}))
	t.Run("cut by the request deadline", func(t *testing.T) {
		resp, err := p.do(t, ctx, Request{Type: "gate", Timeout: 100 * time.Millisecond})
		must(t, err)
		if resp.Outcome != RetryableError || !strings.Contains(resp.Error, "delay of 30s cut short") {
			t.Errorf("response = %v %q, want a retryable error saying the delay was cut short", resp.Outcome, resp.Error)
		}
		recv(t, delaying, "the delay to start")
		recv(t, p.served, "the server to finish the stream")
	})
	t.Run("cut by the client going away", func(t *testing.T) {
		cctx, ccancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := p.client.Do(cctx, p.serverHost.ID(), Request{Type: "gate"})
			errc <- err
		}()
		recv(t, delaying, "the delay to start")
		ccancel()
		if err := recv(t, errc, "the client to return"); !errors.Is(err, context.Canceled) {
			t.Errorf("client error = %v", err)
		}
		sr := recv(t, p.served, "the server to end the delayed stream")
		if !errors.Is(sr.Err, ErrClientGone) {
			t.Errorf("served = %+v, want ErrClientGone", sr)
		}
	})
	if n := g.runs.Load(); n != 0 {
		t.Errorf("the handler ran %d times for requests whose delay was cut short", n)
	}
	if st := p.pool.Stats(); st.InFlight != 0 || st.Queued != 0 {
		t.Errorf("pool still holds delayed requests: %+v", st)
	}
	if st := faults.Stats(); st.Delays != 3 {
		t.Errorf("fault stats = %+v, want 3 delays", st)
	}
}

// faultsAPI returns f's handler mounted the way the node mounts it.
func faultsAPI(t testing.TB, f *Faults) http.Handler {
	t.Helper()
	mux := http.NewServeMux()
	must(t, f.Register(func(pattern string, h http.Handler) error { mux.Handle(pattern, h); return nil }))
	mux.Handle(FaultsPath, f) // the other methods, to see them refused
	return mux
}

// call serves one request on h and returns the status and body.
func call(t testing.TB, h http.Handler, method, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, FaultsPath, strings.NewReader(body)))
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: content type %q", method, FaultsPath, ct)
	}
	return rec.Code, rec.Body.String()
}

func TestFaults_ChangedAtRunTimeThroughTheAPI(t *testing.T) {
	faults := newFaults(t, config.FaultConfig{})
	p := newPair(t, nil, WithFaults(faults))
	api := faultsAPI(t, faults)
	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()

	code, body := call(t, api, http.MethodGet, "")
	if code != http.StatusOK || strings.TrimSpace(body) != `{"error_rate":0,"delay":"0s","drop_rate":0}` {
		t.Fatalf("GET = %d %s", code, body)
	}
	code, body = call(t, api, http.MethodPut, `{"error_rate": 1, "delay": "1ms"}`)
	if code != http.StatusOK || strings.TrimSpace(body) != `{"error_rate":1,"delay":"1ms","drop_rate":0}` {
		t.Fatalf("PUT = %d %s", code, body)
	}
	resp, err := p.do(t, ctx, Request{Type: "echo", Payload: []byte("x")})
	must(t, err)
	if resp.Outcome != RetryableError || resp.Error != FaultInjectionError {
		t.Errorf("after PUT error_rate 1: %v %q", resp.Outcome, resp.Error)
	}
	var view FaultView
	b, err := json.Marshal(faults.View())
	must(t, err)
	must(t, json.Unmarshal(b, &view))
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
	if got := faults.Get(); got != (config.FaultConfig{ErrorRate: 1, Delay: time.Millisecond}) {
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
	must(t, err)
	if resp.Outcome != Success {
		t.Errorf("after PUT {}: %v %q", resp.Outcome, resp.Error)
	}
	if faults.View().Active {
		t.Error("View().Active after every fault was turned off")
	}
}

func TestProtocol_SilentPeerIsFreedByTheReadDeadline(t *testing.T) {
	// A peer that opens a stream and never writes a byte of its request
	// holds a stream until the read deadline, no more, and neither its own
	// later requests nor anyone else's wait for it (access counts a
	// stream only once its request is in).
	access := newAccess(t, func(c *config.AccessConfig) { c.PeerMaxStreams = 1 })
	p := newPair(t, nil, WithRequestReadTimeout(300*time.Millisecond), WithAccess(access))
	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()

	silent := rawStream(t, p.clientHost, p.serverHost)
	_, err := silent.Write(nil) // the protocol header only: the handler runs, no request comes
	must(t, err)
	opened := time.Now()
	resp, err := p.do(t, ctx, Request{ID: "meanwhile", Type: "echo", Payload: []byte("meanwhile")})
	must(t, err)
	if resp.Outcome != Success {
		t.Fatalf("the same peer while its other stream is silent: %v %q", resp.Outcome, resp.Error)
	}
	var silentEnd ServedRequest
	for range 2 {
		if sr := recv(t, p.served, "the normal and the silent stream to end"); sr.ID != "meanwhile" {
			silentEnd = sr
		}
	}
	if !errors.Is(silentEnd.Err, os.ErrDeadlineExceeded) || silentEnd.Outcome != 0 {
		t.Errorf("silent stream ended with %+v, want a read deadline error and no response", silentEnd)
	}
	if took := time.Since(opened); took > failAfter/2 {
		t.Errorf("the silent stream was held %s", took)
	}
	if _, err := io.ReadAll(silent); err == nil {
		t.Error("the silent peer's stream ended cleanly; want a reset with no answer")
	}
	if st := p.server.Stats(); st.Malformed != 1 || st.ByOutcome[Success] != 1 {
		t.Errorf("server stats = %+v, want 1 malformed and 1 success", st)
	}
}

// Fault injection decides health pings as it does requests, with the same
// draw: a drop is a ping dropped, an error a ping answered as failing, and
// the local state reports the first failing check.
func TestFaults_HealthPings(t *testing.T) {
	seq := []float64{0.05, 0.25, 0.45}
	i := 0
	f := newFaults(t, config.FaultConfig{DropRate: 0.1, ErrorRate: 0.3, Delay: time.Hour}, withFaultRand(func() float64 { i++; return seq[i-1] }))
	pool := newTestPool(t, 1, 1, nil)
	st := NewLocalState(pool, f)
	if err := st.Health(""); !errors.Is(err, node.ErrHealthDropped) {
		t.Errorf("u=0.05: %v, want a dropped ping", err)
	}
	if err := st.Health(""); err == nil || errors.Is(err, node.ErrHealthDropped) || err.Error() != FaultInjectionError {
		t.Errorf("u=0.25: %v, want %q", err, FaultInjectionError)
	}
	if err := st.Health(""); err != nil {
		t.Errorf("u=0.45: %v, want healthy (the delay does not apply to pings)", err)
	}
	if s := f.Stats(); s != (FaultStats{}) {
		t.Errorf("pings counted as requests: %+v", s)
	}
	if err := NewLocalState(pool).Health(""); err != nil {
		t.Errorf("no checks: %v", err)
	}
}
