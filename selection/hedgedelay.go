package selection

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/workmesh/workmesh/config"
)

// The measured hedge delay: a hedge is sent when an attempt has run longer
// than most successful attempts of its work type took at this node lately
// (hedge-quantile of them, p95 by default), bounded by hedge-delay-min and
// hedge-delay-max. Until a work type has hedge-min-samples successes within
// hedge-window, and always with hedge-quantile 0, the fixed hedge-delay is
// used. Only successes count: an error, a refusal or an unreachable peer
// says nothing about how long the work takes, and an abandoned attempt (a
// hedge's loser, a request cut short) did not finish.
//
// Each work type keeps its last hedgeRing successes with the time each
// ended, in a ring; the quantile is worked out from the ones within
// hedge-window when it is read and hedgeRecompute new samples arrived or
// hedgeRefresh passed since it last was (so that old samples age out), and
// cached between. Nothing runs in the background.

const (
	// hedgeRing is how many recent successes a work type keeps.
	hedgeRing = 256
	// hedgeRecompute is how many new samples make the cached quantile stale.
	hedgeRecompute = 8
	// hedgeRefresh is how old the cached quantile may get while samples
	// arrive more slowly than hedgeRecompute, or age out.
	hedgeRefresh = 100 * time.Millisecond
	// hedgeMaxTypes bounds the work types measured; beyond it a new type
	// keeps the fixed hedge-delay.
	hedgeMaxTypes = 1024
)

// hedgeLatency holds the measured latency of every work type. Its zero
// value is ready for use.
type hedgeLatency struct {
	types sync.Map // work type -> *latencyWindow
	n     atomic.Int64
}

// latencyWindow is the recent successes of one work type.
type latencyWindow struct {
	mu   sync.Mutex
	base time.Time // sample times are offsets from it
	at   [hedgeRing]time.Duration
	d    [hedgeRing]time.Duration
	next int // where the next sample goes
	held int // samples in the ring, at most hedgeRing

	fresh    int // samples since the cached estimate
	computed bool
	estAt    time.Time
	est      time.Duration // the bounded quantile, when count >= min samples
	count    int           // samples within the window at estAt
	scratch  [hedgeRing]time.Duration
}

// window returns workType's window, creating it when create is set and the
// bound on types allows; nil otherwise.
func (h *hedgeLatency) window(workType string, create bool) *latencyWindow {
	if w, ok := h.types.Load(workType); ok {
		return w.(*latencyWindow)
	}
	if !create || h.n.Load() >= hedgeMaxTypes {
		return nil
	}
	w, loaded := h.types.LoadOrStore(workType, &latencyWindow{})
	if !loaded {
		h.n.Add(1)
	}
	return w.(*latencyWindow)
}

// observe records a successful attempt of workType that took d, ended at now.
func (h *hedgeLatency) observe(workType string, d time.Duration, now time.Time) {
	w := h.window(workType, true)
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.base.IsZero() {
		w.base = now
	}
	w.at[w.next], w.d[w.next] = now.Sub(w.base), max(d, 0)
	w.next = (w.next + 1) % hedgeRing
	w.held = min(w.held+1, hedgeRing)
	w.fresh++
}

// delay returns workType's measured hedge delay at now, with the samples it
// stands on; measured is false (and d is hedge-delay) while there are
// fewer than hedge-min-samples of them or measuring is off.
func (h *hedgeLatency) delay(workType string, cfg *config.HedgeConfig, now time.Time) (d time.Duration, samples int, measured bool) {
	if cfg.Quantile <= 0 {
		return cfg.Delay, 0, false
	}
	w := h.window(workType, false)
	if w == nil {
		return cfg.Delay, 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.computed || w.fresh >= hedgeRecompute || w.fresh > 0 && w.count < cfg.MinSamples ||
		now.Sub(w.estAt) >= hedgeRefresh {
		w.compute(cfg, now)
	}
	if w.count < cfg.MinSamples {
		return cfg.Delay, w.count, false
	}
	return w.est, w.count, true
}

// compute works the cached estimate out from the samples within the window.
func (w *latencyWindow) compute(cfg *config.HedgeConfig, now time.Time) {
	w.computed, w.fresh, w.estAt = true, 0, now
	since := now.Sub(w.base) - cfg.Window
	s := w.scratch[:0]
	for i := range w.held {
		if w.at[i] > since {
			s = append(s, w.d[i])
		}
	}
	w.count = len(s)
	if len(s) == 0 {
		return
	}
	// The nearest-rank quantile: the smallest sample at or above which the
	// share cfg.Quantile of the samples lies.
	i := min(max(int(cfg.Quantile*float64(len(s))+0.999999)-1, 0), len(s)-1)
	w.est = min(max(time.Duration(float64(nth(s, i))*max(cfg.Factor, 1)), cfg.DelayMin), cfg.DelayMax)
}

// nth returns the k-th smallest of s (from 0), reordering s: a quickselect
// (Hoare's partition, the middle element as pivot), linear on average.
func nth(s []time.Duration, k int) time.Duration {
	lo, hi := 0, len(s)-1
	for lo < hi {
		pivot := s[lo+(hi-lo)/2]
		i, j := lo, hi
		for i <= j {
			for s[i] < pivot {
				i++
			}
			for s[j] > pivot {
				j--
			}
			if i <= j {
				s[i], s[j] = s[j], s[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return s[k]
		}
	}
	return s[k]
}

// HedgeDelay returns the hedge delay of workType now: its measured one
// (hedge-quantile of its recent successes, within hedge-delay-min and
// hedge-delay-max), or hedge-delay while it has fewer than
// hedge-min-samples successes within hedge-window; samples is how many it
// has, measured whether the delay is the measured one.
func (s *Selector) HedgeDelay(workType string) (d time.Duration, samples int, measured bool) {
	return s.hedgeLat.delay(workType, &s.cfg.Hedge, s.clock.Now())
}

// observeHedge feeds the measured hedge delay with an attempt's outcome:
// only a success counts. Plan.Report feeds it the attempts of requests that
// may be hedged only, so that a type's writes (a jsonrpc transaction) do
// not move the delay of its reads.
func (s *Selector) observeHedge(workType string, o Outcome, latency time.Duration, at time.Time) {
	if o != Success || s.cfg.Hedge.Quantile <= 0 || s.cfg.Hedge.MaxCount == 0 {
		return
	}
	s.hedgeLat.observe(workType, latency, at)
}
