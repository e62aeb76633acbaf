package selection

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/workmesh/workmesh/config"
)

// stats holds one peer's recent outcomes as exponentially decayed sums: a
// sample's weight halves every rating-window, so the rating describes the
// peer as it is now, not since it was first seen.
type stats struct {
	mu sync.Mutex

	// inflight counts attempts picked and not yet reported; read without the
	// lock to bound exploration of unrated peers.
	inflight atomic.Int32

	// The work types the peer asked to be left alone for (holdoff.go):
	// held counts them, read without the lock; heldUntil, under mu, says
	// until when.
	held      atomic.Int32
	heldUntil map[string]time.Time

	// The peer's load as its answers last told it (ObserveLoad), under mu:
	// how many requests it had running and queued, and when it said so
	// (zero: no answer told it since the record the selector holds).
	obsUsed int
	obsAt   time.Time
}

// rating is what rating knows of one peer for one work type: the decayed
// outcomes of its attempts of that type. A peer's types are rated apart,
// so that its slow work of one type, or a failing upstream behind another,
// does not make it look slow or failing for the rest.
type rating struct {
	mu   sync.Mutex
	last time.Time // when the sums were last decayed
	n    float64   // weighted number of samples
	errs float64   // weighted retryable errors and unreachable attempts
	busy float64   // weighted busy refusals
	// logLat and latN are the weighted sum of the logarithms of latencies
	// (in seconds) and their weighted count: a geometric mean, so one
	// stalled answer on a loaded machine does not outweigh many quick ones.
	// They count every outcome that took time; ansLog and ansN count the
	// answers (success, empty) alone. The peer's latency is the larger of
	// the two means (read): a failure slower than the answers (a timeout)
	// counts against the peer, a quick error or refusal never makes it
	// look fast.
	logLat float64
	latN   float64
	ansLog float64
	ansN   float64
	// proven says the peer's weighted outcomes of the type reached
	// rating-min-samples once: it stays rated while its outcomes fade below
	// them, since old evidence about it is still evidence, not the silence
	// of a newcomer. It is read without the lock too: a peer the ranking
	// still holds as unrated is not explored further once it is proven
	// (pickInGroup).
	proven atomic.Bool
	// used says an outcome was ever recorded: a type that got no work
	// yet (most of a large network's, for most types) reads as nothing
	// without taking the lock.
	used atomic.Bool
}

// observe notes the load an answer of the peer carried and reports whether
// it differs from the one noted before.
func (s *stats) observe(used int, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := s.obsAt.IsZero() || s.obsUsed != used
	s.obsUsed, s.obsAt = used, now
	return changed
}

// observed returns the load an answer told, when one did at most maxAge
// before now.
func (s *stats) observed(now time.Time, maxAge time.Duration) (used int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.obsAt.IsZero() || now.Sub(s.obsAt) > maxAge {
		return 0, false
	}
	return s.obsUsed, true
}

// forgetObserved drops the load answers told: a record newer than them
// says what the peer's load is.
func (s *stats) forgetObserved() {
	s.mu.Lock()
	s.obsAt = time.Time{}
	s.mu.Unlock()
}

// decay brings the sums forward to now.
func (s *rating) decay(now time.Time, halfLife time.Duration) {
	if s.last.IsZero() || halfLife <= 0 {
		s.last = now
		return
	}
	dt := now.Sub(s.last)
	if dt <= 0 {
		return
	}
	f := math.Exp2(-float64(dt) / float64(halfLife))
	s.n *= f
	s.errs *= f
	s.busy *= f
	s.logLat *= f
	s.latN *= f
	s.ansLog *= f
	s.ansN *= f
	s.last = now
}

// record adds one outcome; minSamples is rating-min-samples. A miss is an
// empty answer the request went on from (at or below the head): the peer
// took that long, but it is no answer, so it sets no latency of answers.
func (s *rating) record(o Outcome, latency time.Duration, now time.Time, halfLife time.Duration, minSamples float64, miss bool) {
	if o == Cancelled || o >= NumOutcomes {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used.Store(true)
	s.decay(now, halfLife)
	s.n++
	switch {
	case o.isError():
		s.errs++
	case o == Busy:
		s.busy++
	}
	if latency > 0 {
		l := math.Log(latency.Seconds())
		s.logLat += l
		s.latN++
		if o == Success || o == Empty && !miss {
			s.ansLog += l
			s.ansN++
		}
	}
	if s.n >= minSamples {
		s.proven.Store(true)
	}
}

// contradict turns a miss recorded before into an error: another worker
// answered the same request with data, so the peer's empty answer was
// wrong (it lied, or lost what it claims to hold).
func (s *rating) contradict(now time.Time, halfLife time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decay(now, halfLife)
	s.errs = min(s.errs+1, s.n)
}

// view is a point-in-time reading of stats; latency is the geometric mean
// of every outcome that took time or of the answers alone, whichever is
// larger (see rating.logLat), and answered says some of it is answers.
// rated says the peer is judged on its outcomes: they weigh at least
// minSamples now, or did once (rating.proven).
type view struct {
	n, errRate, busyRate, latency float64
	rated, answered               bool
}

func (s *rating) read(now time.Time, halfLife time.Duration) view {
	if !s.used.Load() {
		return view{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decay(now, halfLife)
	if s.n <= 0 {
		return view{rated: s.proven.Load()}
	}
	v := view{n: s.n, errRate: s.errs / s.n, busyRate: s.busy / s.n, rated: s.proven.Load()}
	if s.latN > 0 {
		v.latency = math.Exp(s.logLat / s.latN)
	}
	if s.ansN > 0 {
		v.latency = max(v.latency, math.Exp(s.ansLog/s.ansN))
		v.answered = true
	}
	return v
}

// scoreInputs are the terms of one peer's score for one work type.
type scoreInputs struct {
	view
	bestLatency float64 // the lowest mean latency among rated peers of the type that answered
	headLag     float64 // blocks behind the highest head of the type; 0 when unknown
	load        float64 // advertised utilisation, 0 (idle) to 1 (full) and beyond
	relayed     bool    // reached through a relay only
}

// relayedCost is what a peer reached through a relay only adds to its
// cost, as much as answering a quarter slower than the best peer (a
// quarter of rating-latency-floor slower, when the best is faster): among
// otherwise equal peers a direct one wins (a relayed connection takes a
// third host's way and has a data limit), yet a relayed peer clearly
// better than the rest is still chosen.
const relayedCost = 0.25

// cost is the sum of the weighted costs behind a score; the score, a number
// in (0, 1] where higher is better, is 1 / (1 + cost). Each term is a cost
// scaled by its weight: latency relative to the best peer (a peer twice as
// slow costs 1; a difference is measured against rating-latency-floor when
// the best peer is faster than that, so that sub-millisecond jitter counts
// as the fraction of a millisecond it is), error and busy rates, head lag
// (a peer 1 behind costs 0.5, far behind nearly 1), load, and relayedCost
// for a peer reached through a relay only.
//
// The terms from outcomes (latency, errors, busy) count in full while the
// outcomes weigh at least rating-min-samples. A proven peer whose outcomes
// have faded below that (it got no work since, as a bad peer does not) is
// judged as if the missing samples were good: its outcome costs shrink with
// their weight, halving every rating-window, so it is tried again as a
// rated peer once it is competitive, neither shunned for ever nor explored
// as a newcomer all at once.
func cost(in scoreInputs, w config.RatingConfig) float64 {
	conf := 1.0
	if m := float64(max(1, w.MinSamples)); in.n < m {
		conf = in.n / m
	}
	cost := 0.0
	if in.bestLatency > 0 && in.latency > in.bestLatency {
		ref := max(in.bestLatency, w.LatencyFloor.Seconds())
		cost += conf * w.LatencyWeight * (in.latency - in.bestLatency) / ref
	}
	cost += conf * w.ErrorWeight * in.errRate
	cost += conf * w.BusyWeight * in.busyRate
	if in.headLag > 0 {
		cost += w.HeadLagWeight * in.headLag / (1 + in.headLag)
	}
	if in.load > 0 {
		cost += w.LoadWeight * in.load
	}
	if in.relayed {
		cost += relayedCost
	}
	return cost
}

// rateKey names the rating of one peer for one work type.
type rateKey struct{ peer, workType string }

// observedLoadAge is how long the load an answer carried (ObserveLoad)
// stands in for the one the peer's record advertises: a dispatcher that
// stopped hearing from a peer goes back to its record.
const observedLoadAge = 30 * time.Second

// loadSteps is how finely rating weighs the load answers tell: in steps of
// an eighth of the peer's capacity. Every answer tells a load, and one
// request more or less at a peer that takes dozens would otherwise reorder
// equal peers at every refresh, sending the next requests to peers this
// node has not warmed; a peer an eighth fuller than another ranks below it.
const loadSteps = 8

// loadStep rounds an observed utilisation down to a step of 1/loadSteps.
func loadStep(l float64) float64 { return math.Floor(l*loadSteps) / loadSteps }

// ObserveLoad notes the load a peer's answer carried (a health ping's, a
// work response's): used requests running and queued at the peer when it
// answered. Until a newer record of the peer arrives, or observedLoadAge
// passes, rating and capacity use it instead of the load the record
// advertised, which is a snapshot from when the record was signed (records
// are not re-signed for load). A change is in the ranking at the next
// refresh. An unknown peer is ignored.
func (s *Selector) ObserveLoad(id string, used int) { s.ObserveLoadAt(id, used, s.clock.Now()) }

// ObserveLoadAt is ObserveLoad for an answer that came in at at, read from
// the selector's clock (Selector.Clock) by a caller that has read it since:
// it is not read again.
func (s *Selector) ObserveLoadAt(id string, used int, at time.Time) {
	s.mu.Lock()
	st := s.stats[id]
	s.mu.Unlock()
	if st == nil || !st.observe(max(used, 0), at) {
		return
	}
	s.markDirty()
}

// record feeds one attempt's outcome to rating (miss: see rating.record)
// and, when the peer could not be reached, to liveness; it returns the
// liveness transition that caused, if any.
func (s *Selector) record(e *entry, o Outcome, latency time.Duration, miss bool, at time.Time) (t Transition, changed bool) {
	if o == Cancelled {
		return Transition{}, false
	}
	e.rate.record(o, latency, at, s.cfg.Rating.Window, float64(max(1, s.cfg.Rating.MinSamples)), miss)
	if o == Unreachable {
		// Dispatch only adds evidence of unreachability; recovery is proven
		// by polls, so a grey peer cannot hide behind its successes.
		t, changed = s.live.Report(e.id, false)
	}
	s.markDirty()
	return t, changed
}

// contradicted turns e's earlier miss into an error (rating.contradict).
func (s *Selector) contradicted(e *entry) {
	e.rate.contradict(s.clock.Now(), s.cfg.Rating.Window)
	s.markDirty()
}
