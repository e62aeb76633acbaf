package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/httpapi"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/pool"
)

// Fault injection makes this node's worker fail, stall or drop work on
// purpose, for resilience drills: like a proxy's fault filter, it sits in
// front of the handlers, so everything a peer sees is what a sick worker
// would show it. It is off unless configured, and can be changed while the
// node runs (PUT /v1/faults).

// FaultsPath is where the fault settings live on the local HTTP API: GET
// returns FaultSettings, PUT replaces them.
const FaultsPath = "/v1/faults"

// FaultInjectionError is the error message of a request failed on purpose.
const FaultInjectionError = "fault injection: error"

// ErrFaultDropped is the cause of a served request's context (and the Err
// its ServedRequest reports) when fault injection dropped it: the stream
// was reset with no answer.
var ErrFaultDropped = fmt.Errorf("fault injection: %w", workers.ErrDropped)

// errFaultError is the cause a request failed on purpose is cancelled with.
var errFaultError = errors.New(FaultInjectionError)

// maxFaultsBody bounds a PUT /v1/faults body; the settings fit in far less.
const maxFaultsBody = 4 << 10

// Faults holds the fault injection settings of a work protocol server. It
// is safe for concurrent use: the server reads a snapshot per request, and
// Set replaces the settings at once for every request that starts later.
type Faults struct {
	cur  atomic.Pointer[config.FaultConfig]
	rand func() float64
	// onDelay, when set, is called as a request's delay starts (tests).
	onDelay func()

	errors, drops, delays atomic.Uint64
}

// Option configures Faults.
type Option func(*Faults) error

// WithSeed makes the random choices of fault injection a seeded,
// repeatable sequence (default: unseeded), so that a drill or a test can be
// run again with the same faults.
func WithSeed(seed uint64) Option {
	return func(f *Faults) error {
		var mu sync.Mutex
		r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		f.rand = func() float64 {
			mu.Lock()
			defer mu.Unlock()
			return r.Float64()
		}
		return nil
	}
}

// withRand sets the source of the random choices (tests).
// WithOnDelay sets a function called as a request's delay starts, so
// that a test or a drill knows the delay is under way.
func WithOnDelay(f func()) Option {
	return func(fs *Faults) error { fs.onDelay = f; return nil }
}

func withRand(next func() float64) Option {
	return func(f *Faults) error {
		if next == nil {
			return errors.New("nil random source")
		}
		f.rand = next
		return nil
	}
}

// New returns fault injection with the settings of cfg (the zero
// value injects nothing).
func New(cfg config.FaultConfig, opts ...Option) (*Faults, error) {
	f := &Faults{rand: rand.Float64}
	for _, o := range opts {
		if err := o(f); err != nil {
			return nil, fmt.Errorf("fault injection: %w", err)
		}
	}
	if err := f.Set(cfg); err != nil {
		return nil, err
	}
	return f, nil
}

// Set replaces the settings. Settings out of bounds (a rate outside [0, 1],
// a negative delay) are refused and leave the current ones in place.
func (f *Faults) Set(cfg config.FaultConfig) error {
	for _, r := range []struct {
		name string
		v    float64
	}{{"fault-error-rate", cfg.ErrorRate}, {"fault-drop-rate", cfg.DropRate}} {
		if math.IsNaN(r.v) {
			return fmt.Errorf("fault injection: %s is NaN: want a number between 0 and 1", r.name)
		}
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("fault injection: %w", err)
	}
	f.cur.Store(&cfg)
	return nil
}

// Get returns the current settings.
func (f *Faults) Get() config.FaultConfig { return *f.cur.Load() }

// FaultStats counts the faults injected since the start.
type FaultStats struct {
	// Errors counts requests answered with FaultInjectionError.
	Errors uint64 `json:"errors"`
	// Drops counts requests dropped without an answer.
	Drops uint64 `json:"drops"`
	// Delays counts requests held back by the delay.
	Delays uint64 `json:"delays"`
}

// Stats returns the counts of injected faults.
func (f *Faults) Stats() FaultStats {
	return FaultStats{Errors: f.errors.Load(), Drops: f.drops.Load(), Delays: f.delays.Load()}
}

// FaultSettings is the JSON form of the settings, the body of GET and PUT
// /v1/faults. Delay is a Go duration ("250ms").
type FaultSettings struct {
	// ErrorRate is the share of requests answered with a retryable error.
	ErrorRate float64 `json:"error_rate"`
	// Delay is added before every request is worked on.
	Delay string `json:"delay"`
	// DropRate is the share of requests dropped without an answer.
	DropRate float64 `json:"drop_rate"`
}

// FaultView is what /v1/info shows of fault injection: the settings, whether
// any fault is on, and the counts so far.
type FaultView struct {
	FaultSettings
	// Active is true when any fault is on.
	Active bool `json:"active"`
	// Injected counts the faults injected since the start.
	Injected FaultStats `json:"injected"`
}

func settingsOf(c config.FaultConfig) FaultSettings {
	return FaultSettings{ErrorRate: c.ErrorRate, Delay: c.Delay.String(), DropRate: c.DropRate}
}

// View returns the settings and counts, for /v1/info.
func (f *Faults) View() FaultView {
	c := f.Get()
	return FaultView{FaultSettings: settingsOf(c), Active: active(&c), Injected: f.Stats()}
}

func active(c *config.FaultConfig) bool { return c.ErrorRate > 0 || c.DropRate > 0 || c.Delay > 0 }

// faultAction is what fault injection does to one request after its delay.
type faultAction uint8

const (
	faultNone faultAction = iota
	faultError
	faultDrop
)

// draw decides the fate of one request. One random number decides between
// drop and error, so that each gets exactly its share when the two rates
// add up to at most 1 (the drop wins where they overlap).
func (f *Faults) draw() (time.Duration, faultAction) {
	c := f.cur.Load()
	if !active(c) {
		return 0, faultNone
	}
	act := faultNone
	if c.ErrorRate > 0 || c.DropRate > 0 {
		switch u := f.rand(); {
		case u < c.DropRate:
			act = faultDrop
		case u < c.DropRate+c.ErrorRate:
			act = faultError
		}
	}
	return c.Delay, act
}

// Intercept applies the faults to an admitted request before its handler
// runs. It returns the request's result and whether it did anything;
// when it did, the handler did not run and the ticket was released. A drop
// cancels the ticket's context with ErrFaultDropped, which is how the
// server knows to reset the stream. The delay ends early when the ticket's
// context does (deadline, client gone, server closed).
func (f *Faults) Intercept(p *pool.Pool, t *pool.Ticket) (workers.Result, bool) {
	delay, act := f.draw()
	if delay > 0 {
		f.delays.Add(1)
		if f.onDelay != nil {
			f.onDelay()
		}
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-t.Context().Done():
			timer.Stop()
			cause := context.Cause(t.Context())
			p.RunInline(t) // releases the ticket: its context is done
			return workers.Fail(workers.RetryableError, "fault injection: delay of %s cut short: %v", delay, cause), true
		}
	}
	switch act {
	case faultDrop:
		f.drops.Add(1)
		t.Cancel(ErrFaultDropped)
		p.RunInline(t) // releases the ticket without running the handler
		return workers.Fail(workers.RetryableError, "%v", ErrFaultDropped), true
	case faultError:
		f.errors.Add(1)
		t.Cancel(errFaultError)
		p.RunInline(t)
		return workers.Fail(workers.RetryableError, FaultInjectionError), true
	}
	return workers.Result{}, false
}

// Healthy decides the fate of one health ping as draw does for a request,
// so that a drill's sick worker is sick to liveness polls as well as to
// work: a drop resets the ping unanswered, an error answers it as failing.
// The delay does not apply to pings (it is the work that is slow). It
// counts nothing in Stats, which counts requests.
func (f *Faults) Healthy() error {
	switch _, act := f.draw(); act {
	case faultDrop:
		return fmt.Errorf("%w: %w", node.ErrHealthDropped, ErrFaultDropped)
	case faultError:
		return errFaultError
	}
	return nil
}

// Register mounts GET and PUT /v1/faults with handle; (*node.Node).HandleAPI
// fits.
func (f *Faults) Register(handle func(pattern string, h http.Handler) error) error {
	for _, m := range []string{http.MethodGet, http.MethodPut} {
		if err := handle(m+" "+FaultsPath, f); err != nil {
			return fmt.Errorf("fault injection: %w", err)
		}
	}
	return nil
}

// ServeHTTP answers GET /v1/faults with the settings and PUT /v1/faults
// (a FaultSettings body, every field optional, a missing one meaning off)
// by replacing them and answering with the new settings. Errors are
// {"error": "..."} with status 400, 405 or 413.
func (f *Faults) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPut:
		cfg, code, err := decodeFaults(w, r)
		if err == nil {
			err = f.Set(cfg)
		}
		if err != nil {
			httpapi.WriteError(w, code, "", "%v", err)
			return
		}
	default:
		w.Header().Set("Allow", "GET, PUT")
		httpapi.WriteError(w, http.StatusMethodNotAllowed, "", "%s %s: want GET, or PUT with a JSON body", r.Method, FaultsPath)
		return
	}
	_ = httpapi.WriteJSON(w, http.StatusOK, settingsOf(f.Get()))
}

// decodeFaults reads a PUT body strictly: one JSON object of known fields.
func decodeFaults(w http.ResponseWriter, r *http.Request) (config.FaultConfig, int, error) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxFaultsBody))
	if err != nil {
		if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return config.FaultConfig{}, http.StatusRequestEntityTooLarge, fmt.Errorf("body: larger than %d bytes", mbe.Limit)
		}
		return config.FaultConfig{}, http.StatusBadRequest, fmt.Errorf("body: read: %w", err)
	}
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' {
		return config.FaultConfig{}, http.StatusBadRequest, errors.New("body: want a JSON object with error_rate, delay and drop_rate")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var s FaultSettings
	if err := dec.Decode(&s); err != nil {
		return config.FaultConfig{}, http.StatusBadRequest,
			fmt.Errorf("body: want a JSON object with error_rate, delay and drop_rate: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return config.FaultConfig{}, http.StatusBadRequest, errors.New("body: unexpected data after the JSON object")
	}
	cfg := config.FaultConfig{ErrorRate: s.ErrorRate, DropRate: s.DropRate}
	if s.Delay != "" {
		if cfg.Delay, err = time.ParseDuration(s.Delay); err != nil {
			return config.FaultConfig{}, http.StatusBadRequest, fmt.Errorf("delay: want a Go duration such as \"250ms\": %w", err)
		}
	}
	return cfg, http.StatusBadRequest, nil
}
