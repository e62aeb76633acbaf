package custom

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
)

func newService(t *testing.T, c config.CustomTypeConfig) *Service {
	t.Helper()
	s, err := NewService("enrich", c, Options{MaxOutput: workers.DefaultMaxPayload})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestServiceOutcomes(t *testing.T) {
	var status atomic.Int64
	status.Store(200)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer k" {
			http.Error(w, "bad request shape", http.StatusBadRequest)
			return
		}
		code := int(status.Load())
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "enriched(%s) status %d", body, code)
	}))
	defer srv.Close()
	s := newService(t, config.CustomTypeConfig{URL: srv.URL + "/enrich", Headers: map[string]string{"Authorization": "Bearer k"}})

	if r := s.Do(context.Background(), []byte("x")); r.Outcome != workers.Success || string(r.Output) != "enriched(x) status 200" {
		t.Fatalf("2xx: %v %q %q", r.Outcome, r.Output, r.Error)
	}
	status.Store(422)
	r := s.Do(context.Background(), []byte("y"))
	if r.Outcome != workers.PermanentError || workers.DetailOf(r) == nil || workers.DetailOf(r).HTTPStatus != 422 || workers.DetailOf(r).Body != "enriched(y) status 422" {
		t.Fatalf("4xx: %v %q %+v, want a permanent failure with status and body", r.Outcome, r.Error, workers.DetailOf(r))
	}
	status.Store(500)
	if r := s.Do(context.Background(), nil); r.Outcome != workers.RetryableError || workers.DetailOf(r).HTTPStatus != 500 {
		t.Fatalf("500: %v %q %+v", r.Outcome, r.Error, workers.DetailOf(r))
	}
	status.Store(503)
	if r := s.Do(context.Background(), nil); r.Outcome != workers.Busy {
		t.Fatalf("503: %v %q", r.Outcome, r.Error)
	}
	status.Store(429)
	if r := s.Do(context.Background(), nil); r.Outcome != workers.Busy || workers.DetailOf(r).RetryAfter != time.Second {
		t.Fatalf("429: %v %q %+v, want busy with Retry-After 1s", r.Outcome, r.Error, workers.DetailOf(r))
	}
	status.Store(200)
	if r := s.Do(context.Background(), nil); r.Outcome != workers.Busy || !strings.Contains(r.Error, "Retry-After") {
		t.Fatalf("within Retry-After: %v %q, want busy without asking", r.Outcome, r.Error)
	}
}

func TestServiceConnectionRefusedIsRetryable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := newService(t, config.CustomTypeConfig{URL: "http://" + addr + "/x"})
	if r := s.Do(context.Background(), nil); r.Outcome != workers.RetryableError {
		t.Fatalf("refused: %v %q", r.Outcome, r.Error)
	}
	if s.Addr() != addr {
		t.Fatalf("Addr %q, want %q", s.Addr(), addr)
	}
}

func TestServiceOutputOverBound(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, 2000))
	}))
	defer srv.Close()
	s := newService(t, config.CustomTypeConfig{URL: srv.URL, MaxOutput: 1000})
	if r := s.Do(context.Background(), nil); r.Outcome != workers.PermanentError || !strings.Contains(r.Error, "max-output 1000") {
		t.Fatalf("%v %q", r.Outcome, r.Error)
	}
}

func TestServiceHealth(t *testing.T) {
	var healthy atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			if !healthy.Load() {
				http.Error(w, "down", http.StatusServiceUnavailable)
			}
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	s := newService(t, config.CustomTypeConfig{URL: srv.URL + "/enrich", HealthURL: srv.URL + "/healthz", HealthInterval: 20 * time.Millisecond})
	changed := make(chan struct{}, 16)
	s.OnHealthChange(func() { changed <- struct{}{} })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	testkit.WaitFor(t, 5*time.Second, "type out while the health URL fails", func() error {
		if err := s.TypeHealth(); err == nil || !strings.Contains(err.Error(), "503") {
			return fmt.Errorf("TypeHealth %v", err)
		}
		return nil
	})
	if r := s.Do(context.Background(), nil); r.Outcome != workers.Unsupported {
		t.Fatalf("work while out: %v %q, want refused", r.Outcome, r.Error)
	}
	healthy.Store(true)
	testkit.WaitFor(t, 5*time.Second, "type back once the health URL passes", func() error { return s.TypeHealth() })
	select {
	case <-changed:
	default:
		t.Fatal("no health change reported")
	}
	if r := s.Do(context.Background(), nil); r.Outcome != workers.Success {
		t.Fatalf("work once back: %v %q", r.Outcome, r.Error)
	}
	healthy.Store(false)
	testkit.WaitFor(t, 5*time.Second, "type out again", func() error {
		if s.TypeHealth() == nil {
			return errors.New("still healthy")
		}
		return nil
	})
}

func TestNewRefusesBadTypes(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notexec.sh"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]config.CustomTypeConfig{
		"neither": {},
		"both":    {Command: []string{"cat"}, URL: "http://127.0.0.1:1/"},
		"ftp":     {URL: "ftp://127.0.0.1/"},
		// A program named by its path is checked as one named by its
		// name: there, and executable.
		"missing-path":       {Command: []string{filepath.Join(dir, "nosuch.sh")}},
		"not-executable":     {Command: []string{filepath.Join(dir, "notexec.sh")}},
		"missing-in-its-dir": {Command: []string{"./nosuch.sh"}, Dir: dir},
		"a-directory":        {Command: []string{dir}},
	} {
		if _, err := New(map[string]config.CustomTypeConfig{name: c}, Options{}); err == nil || !strings.Contains(err.Error(), "custom-types "+name) {
			t.Errorf("%s: New = %v, want an error naming the type", name, err)
		}
	}
	ts, err := New(map[string]config.CustomTypeConfig{
		"upper": {Command: []string{"tr", "a-z", "A-Z"}, Idempotent: true, Deterministic: true},
		"plain": {Command: []string{"cat"}},
	}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if tr := ts["upper"].Traits(); tr.Idempotent == nil || !tr.Idempotent(nil) || !tr.Deterministic {
		t.Fatalf("upper traits %+v", tr)
	}
	if tr := ts["plain"].Traits(); tr.Idempotent != nil || tr.Deterministic {
		t.Fatalf("plain traits %+v: a type promises nothing unless declared", tr)
	}
}

// A service type keeps a connection open for every run that can be under
// way at once: bursts of as many concurrent runs as local-concurrency
// allows reuse the connections of the first instead of closing those over
// a fixed idle limit and opening them again.
func TestServiceKeepsAConnectionPerConcurrentRun(t *testing.T) {
	const runs = 32
	srv := testkit.NewBurstServer(t, runs, "ok")
	s, err := NewService("enrich", config.CustomTypeConfig{URL: srv.URL}, Options{MaxOutput: workers.DefaultMaxPayload, LocalConcurrency: runs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for burst := range 3 {
		var wg sync.WaitGroup
		for range runs {
			wg.Go(func() {
				if r := s.Do(context.Background(), []byte("x")); r.Outcome != workers.Success {
					t.Errorf("burst %d: %v %q", burst, r.Outcome, r.Error)
				}
			})
		}
		wg.Wait()
	}
	if n := srv.Opened(); n != runs {
		t.Fatalf("3 bursts of %d concurrent runs opened %d connections to the service, want %d (one per run under way, kept between bursts)", runs, n, runs)
	}
}
