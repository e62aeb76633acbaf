package faults

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/workertest"
)

func newFaults(t testing.TB, cfg config.FaultConfig, opts ...Option) *Faults {
	t.Helper()
	f, err := New(cfg, opts...)
	workertest.Must(t, err)
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
	if _, err := New(config.FaultConfig{DropRate: 2}); err == nil {
		t.Error("NewFaults accepted a drop rate of 2")
	}
}

func TestFaults_DrawGivesEachItsShare(t *testing.T) {
	// One number decides: [0, drop) drops, [drop, drop+error) fails.
	seq := []float64{0.05, 0.25, 0.45, 0.95}
	i := 0
	f := newFaults(t, config.FaultConfig{DropRate: 0.1, ErrorRate: 0.3}, withRand(func() float64 { i++; return seq[i-1] }))
	want := []faultAction{faultDrop, faultError, faultNone, faultNone}
	for j, w := range want {
		if _, got := f.draw(); got != w {
			t.Errorf("draw %d (u=%g) = %d, want %d", j, seq[j], got, w)
		}
	}

	// Seeded faults repeat, and a rate of 0.5 fails about half.
	a := newFaults(t, config.FaultConfig{ErrorRate: 0.5}, WithSeed(7))
	b := newFaults(t, config.FaultConfig{ErrorRate: 0.5}, WithSeed(7))
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

// Fault injection decides health pings as it does requests, with the same
// draw: a drop is a ping dropped, an error a ping answered as failing, and
// the local state reports the first failing check.
func TestFaults_HealthPings(t *testing.T) {
	seq := []float64{0.05, 0.25, 0.45}
	i := 0
	f := newFaults(t, config.FaultConfig{DropRate: 0.1, ErrorRate: 0.3, Delay: time.Hour}, withRand(func() float64 { i++; return seq[i-1] }))
	p := workertest.NewPool(t, 1, 1, nil)
	st := pool.NewLocalState(p, f)
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
	if err := pool.NewLocalState(p).Health(""); err != nil {
		t.Errorf("no checks: %v", err)
	}
}
