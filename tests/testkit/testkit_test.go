package testkit

import (
	"bytes"
	"errors"
	"fmt"
	"net/http/httptest"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

func TestFakeClock(t *testing.T) {
	c := NewFakeClock()
	if got, want := c.Now(), time.Unix(1_700_000_000, 0); !got.Equal(want) {
		t.Fatalf("a new clock reads %s, want %s", got, want)
	}
	start := c.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			c.Advance(time.Second)
			_ = c.Now()
		})
	}
	wg.Wait()
	if got := c.Now().Sub(start); got != 8*time.Second {
		t.Errorf("eight advances of a second moved the clock %s", got)
	}
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	c.Set(at)
	if !c.Now().Equal(at) {
		t.Errorf("after Set(%s) the clock reads %s", at, c.Now())
	}
	if got := NewFakeClockAt(at).Now(); !got.Equal(at) {
		t.Errorf("NewFakeClockAt(%s) reads %s", at, got)
	}
}

// recorder is a testing.TB whose Fatalf records the message and ends the
// goroutine, as the real one does.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls f with a recorder on a goroutine of its own, so that a Fatalf
// ends that goroutine and not the test, and returns what it recorded.
func run(t *testing.T, f func(tb testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.msg
}

func TestWaitForHolds(t *testing.T) {
	var checks int
	msg := run(t, func(tb testing.TB) {
		WaitFor(tb, 10*time.Second, "the third check", func() error {
			if checks++; checks < 3 {
				return fmt.Errorf("check %d", checks)
			}
			return nil
		})
	})
	if msg != "" || checks != 3 {
		t.Errorf("failed with %q after %d checks, want no failure after 3", msg, checks)
	}
}

func TestWaitForFailsNamingWhatAndWhy(t *testing.T) {
	var checks atomic.Int32
	start := time.Now()
	msg := run(t, func(tb testing.TB) {
		WaitFor(tb, 100*time.Millisecond, "a condition that never holds", func() error {
			return fmt.Errorf("still false after %d checks", checks.Add(1))
		})
	})
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("gave up after %s, before its 100ms", took)
	}
	want := fmt.Sprintf("a condition that never holds: not within 100ms: still false after %d checks", checks.Load())
	if msg != want {
		t.Errorf("failure %q, want %q", msg, want)
	}
}

// TestPollChecksAsTimeRunsOut: a condition that holds by the deadline is
// seen, though the last check before it failed.
func TestPollChecksAsTimeRunsOut(t *testing.T) {
	deadline := time.Now().Add(30 * time.Millisecond)
	_, err := Poll(30*time.Millisecond, func() error {
		if time.Now().Before(deadline) {
			return errors.New("too early")
		}
		return nil
	})
	if err != nil {
		t.Errorf("a condition that held as the time ran out: %v", err)
	}
}

// TestPollWakes: with checks an hour apart, a closed wake channel has the
// condition checked at once.
func TestPollWakes(t *testing.T) {
	defer func(first, most time.Duration) { firstPoll, maxPoll = first, most }(firstPoll, maxPoll)
	firstPoll, maxPoll = time.Hour, time.Hour
	var mu sync.Mutex
	changed := make(chan struct{})
	wake := func() <-chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		return changed
	}
	var holds atomic.Bool
	checked := make(chan struct{}, 1)
	go func() {
		<-checked
		holds.Store(true)
		mu.Lock()
		close(changed)
		changed = make(chan struct{})
		mu.Unlock()
	}()
	took, err := Poll(10*time.Second, func() error {
		select {
		case checked <- struct{}{}:
		default:
		}
		if !holds.Load() {
			return errors.New("not yet")
		}
		return nil
	}, wake)
	if err != nil || took > 5*time.Second {
		t.Errorf("Poll returned %v after %s, want the change seen at once", err, took)
	}
}

func TestMetricValue(t *testing.T) {
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_requests_total", Help: "h"}, []string{"type", "status"})
	reqs.WithLabelValues("sha256", "ok").Add(3)
	reqs.WithLabelValues("sha256", "empty").Add(1)
	peers := prometheus.NewGauge(prometheus.GaugeOpts{Name: "test_peers", Help: "h"})
	peers.Set(2)
	took := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "test_seconds", Help: "h"})
	took.Observe(0.1)
	took.Observe(0.2)
	cs := []prometheus.Collector{reqs, peers, took}

	reg := prometheus.NewRegistry()
	reg.MustRegister(cs...)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	for how, got := range map[string]map[string]*dto.MetricFamily{
		"gathered": Gather(t, cs...),
		"scraped":  Scrape(t, srv.URL),
	} {
		for _, c := range []struct {
			name   string
			labels map[string]string
			want   float64
			found  bool
		}{
			{"test_requests_total", map[string]string{"status": "ok"}, 3, true},
			{"test_requests_total", map[string]string{"type": "sha256", "status": "empty"}, 1, true},
			{"test_requests_total", nil, 1, true}, // the first series: "empty" sorts first
			{"test_requests_total", map[string]string{"status": "failed"}, 0, false},
			{"test_peers", nil, 2, true},
			{"test_seconds", nil, 2, true},
			{"test_absent", nil, 0, false},
		} {
			if v, ok := MetricValue(got, c.name, c.labels); v != c.want || ok != c.found {
				t.Errorf("%s: %s%v = %v (found %t), want %v (found %t)", how, c.name, c.labels, v, ok, c.want, c.found)
			}
		}
	}

	var text bytes.Buffer
	text.WriteString("# TYPE test_untyped untyped\ntest_untyped 7\n")
	if v, ok := MetricValue(ParseMetrics(t, &text), "test_untyped", nil); !ok || v != 7 {
		t.Errorf("untyped: %v (found %t), want 7", v, ok)
	}
}

// TestImports holds the package to its rules: it imports nothing of
// workmesh, and no non-test code imports it.
func TestImports(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list on the module")
	}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}", "github.com/workmesh/workmesh/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const self = "github.com/workmesh/workmesh/tests/testkit"
	for line := range strings.Lines(string(out)) {
		pkg, imports, _ := strings.Cut(strings.TrimSpace(line), ": ")
		for imp := range strings.FieldsSeq(imports) {
			if pkg == self && strings.HasPrefix(imp, "github.com/workmesh/workmesh") {
				t.Errorf("testkit imports %s", imp)
			}
			if imp == self {
				t.Errorf("non-test code of %s imports testkit", pkg)
			}
		}
	}
}
