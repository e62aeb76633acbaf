package selection

import (
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/workmesh/workmesh/config"
)

// health is one peer's liveness. Its state is read without a lock on the
// request path; everything else is guarded by Liveness.mu.
type health struct {
	state       atomic.Int32
	failures    int       // decaying failure counter while StateAlive
	successes   int       // good polls in a row while StateProbing
	redials     int       // failed redials in a row while StateUnreachable
	lastPoll    time.Time // last poll or redial attempt
	nextAttempt time.Time // when an StateUnreachable peer is redialed next
	// gen tells this entry from an earlier one of the same peer: a poll
	// due for an entry that was removed since reports to nothing.
	gen uint64
	// fresh: the peer has never answered a poll; it waits in StateProbing
	// for its first good one, which makes it StateAlive at once.
	fresh bool
	// strikes counts work requests the peer accepted and left unanswered
	// past their deadline, less one for each answer (ReportStall,
	// ReportAnswer); cordons counts the times in a row strikes cordoned it,
	// and cordonUntil is when the last cordon (a stall's, or a dispute's:
	// ReportDispute) ends: until then no poll, probe or answer brings the
	// peer back (its pings are fine: that is what a stall or a lie is).
	strikes, cordons int
	cordonUntil      time.Time
	// reason says why the peer is not StateAlive, for the peers view.
	reason string
	// disputes counts the peer's results outvoted by others, in all;
	// disputeAt holds when the ones of dispute-window were (ReportDispute).
	disputes  int
	disputeAt []time.Time

	// The poll schedule (schedule.go): the peer's ID, the queue it is in
	// (nil: none), its place there and the time that orders it.
	id    string
	queue *dueQueue
	qi    int
	key   time.Time
}

func (h *health) load() State { return State(h.state.Load()) }

// Liveness tracks the liveness state of every known peer. A dispatcher polls
// the peers Due returns over the health protocol and reports every result
// with Report; dispatch attempts that could not reach a peer are reported
// too. Liveness is safe for concurrent use.
type Liveness struct {
	cfg   config.LivenessConfig
	clock Clock
	// seed spreads the first polls of new peers (see firstPoll); the
	// Selector sets it from its own.
	seed uint64

	mu    sync.Mutex
	peers map[string]*health
	// gens numbers entries (health.gen).
	gens uint64
	// awaitFirst: new peers wait in StateProbing for their first good poll
	// (AwaitFirstPoll).
	awaitFirst bool
	// striking counts the peers whose strikes are above zero, so that
	// ReportAnswer costs one atomic load while no peer stalls.
	striking atomic.Int32
	// onTransition, when set, is told of every state change (for logs and
	// metrics). It is called with mu held and must not call back.
	onTransition func(Transition)
	// trust holds the dispute settings (ReportDispute).
	trust config.TrustConfig
	// aliveQ and redialQ are the poll schedule (schedule.go).
	aliveQ, redialQ dueQueue
}

// NewLiveness returns a Liveness for cfg, reading the time from clock.
func NewLiveness(cfg config.LivenessConfig, clock Clock) (*Liveness, error) {
	if cfg.PollSuccessThreshold > 0 && cfg.PollInterval <= 0 {
		return nil, fmt.Errorf("liveness: poll-success-threshold %d needs poll-interval > 0", cfg.PollSuccessThreshold)
	}
	if cfg.PollFailureThreshold < 1 {
		return nil, fmt.Errorf("liveness: poll-failure-threshold %d must be at least 1", cfg.PollFailureThreshold)
	}
	if clock == nil {
		clock = SystemClock{}
	}
	return &Liveness{cfg: cfg, clock: clock, peers: make(map[string]*health)}, nil
}

// OnTransition sets a function told of every state change.
func (l *Liveness) OnTransition(f func(Transition)) {
	l.mu.Lock()
	l.onTransition = f
	l.mu.Unlock()
}

// AwaitFirstPoll makes peers learned from here on wait for their first good
// poll before they are StateAlive (they are StateProbing until then, with
// "not polled yet" as the reason): a record is a peer's own claim, a poll
// answered is evidence. A dispatcher that polls calls it before it syncs
// peers; without polling (poll-interval 0) nothing would ever answer, and
// new peers stay alive until they fail.
func (l *Liveness) AwaitFirstPoll() {
	l.mu.Lock()
	l.awaitFirst = l.cfg.PollInterval > 0
	l.mu.Unlock()
}

// firstPollSpread bounds the spread of new peers' first polls under
// AwaitFirstPoll: they are not selected before it, so it is short (the
// dispatcher starts due polls as it syncs new peers); it still keeps the
// dispatchers that learn of a newcomer at one moment from pinging it in
// the same instant.
const firstPollSpread = 5 * time.Millisecond

// reasonFirstPoll is the reason of a peer that has not answered a poll yet.
const reasonFirstPoll = "not polled yet"

// handleLocked returns the peer's health, creating it when it is new:
// StateAlive (trusted until it fails), or StateProbing until its first good
// poll under AwaitFirstPoll. l.mu must be held.
func (l *Liveness) handleLocked(id string) *health {
	h := l.peers[id]
	if h == nil {
		l.gens++
		h = &health{lastPoll: l.firstPoll(id), gen: l.gens, id: id, qi: -1}
		if l.awaitFirst {
			h.state.Store(int32(StateProbing))
			h.fresh, h.reason = true, reasonFirstPoll
		}
		l.peers[id] = h
		l.reschedLocked(h)
	}
	return h
}

// firstPoll returns the last-poll time a new peer starts with, so that its
// first poll is due at a point of the next poll-interval drawn from the
// seed and the peer: the dispatchers that learn of a newcomer at the same
// moment do not all dial it at once. A new peer is alive until it fails
// (an attempt that cannot reach it counts at once), so nothing waits on
// that first poll.
func (l *Liveness) firstPoll(id string) time.Time {
	now := l.clock.Now()
	iv := l.cfg.PollInterval
	if iv <= 0 {
		return now
	}
	if l.awaitFirst {
		// The peer is not selected until that poll: spread over at
		// most firstPollSpread, so it waits little.
		q := min(iv/4, firstPollSpread)
		if q <= 0 {
			return now.Add(-iv)
		}
		f := fnv.New64a()
		f.Write([]byte(id))
		return now.Add(time.Duration(splitmix(l.seed^f.Sum64())%uint64(q)) - iv)
	}
	f := fnv.New64a()
	f.Write([]byte(id))
	return now.Add(time.Duration(splitmix(l.seed^f.Sum64())%uint64(iv)) - iv)
}

// retain forgets every peer not in keep. A forgotten peer stays forgotten:
// reports about it (a poll that was in flight) change nothing, and only
// the next SetPeers that holds it again makes a new entry.
func (l *Liveness) retain(keep map[string]struct{}) {
	l.mu.Lock()
	for id, h := range l.peers {
		if _, ok := keep[id]; !ok {
			if h.strikes > 0 {
				l.striking.Add(-1)
			}
			l.unschedLocked(h)
			delete(l.peers, id)
		}
	}
	l.mu.Unlock()
}

// Reason says why the peer is not StateAlive ("" when it is, or unknown):
// polls that failed, a stall, no poll answered yet.
func (l *Liveness) Reason(id string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.peers[id]; h != nil && h.load() != StateAlive {
		return h.reason
	}
	return ""
}

// Strikes returns the peer's stall count (see ReportStall).
func (l *Liveness) Strikes(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.peers[id]; h != nil {
		return h.strikes
	}
	return 0
}

// State returns the peer's state; an unknown peer is StateAlive.
func (l *Liveness) State(id string) State {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.peers[id]; h != nil {
		return h.load()
	}
	return StateAlive
}

// Failures returns the peer's current failure count.
func (l *Liveness) Failures(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.peers[id]; h != nil {
		return h.failures
	}
	return 0
}

// Poll is one poll due (DuePolls): the peer and the entry it was due for.
type Poll struct {
	Peer string
	gen  uint64
	// news: asked for by news of the peer (ProbeFor), not the schedule.
	news bool
}

// DuePolls is Due with each peer's entry: a poll reported with ReportPoll
// counts only for the entry it was due for, so one that ends after its
// peer was removed (or removed and learned again) changes nothing.
func (l *Liveness) DuePolls() []Poll {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := l.dueLocked()
	out := make([]Poll, len(ids))
	for i, id := range ids {
		out[i] = Poll{Peer: id, gen: l.peers[id].gen}
	}
	return out
}

// PollFor returns a poll of the peer's current entry, due or not (a probe
// that something other than the schedule asks for: a new connection, a new
// record), and false when the peer is not known.
func (l *Liveness) PollFor(id string) (Poll, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.peers[id]
	if h == nil {
		return Poll{}, false
	}
	return Poll{Peer: id, gen: h.gen}, true
}

// ReportPoll is Report for a poll DuePolls returned.
func (l *Liveness) ReportPoll(p Poll, ok bool) (Transition, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.peers[p.Peer]
	if h == nil || h.gen != p.gen {
		return Transition{}, false
	}
	if !ok && p.news && h.fresh && h.load() == StateProbing {
		// A probe news asked for that found no way to a new peer yet
		// counts nothing against it: its scheduled polls do.
		return Transition{}, false
	}
	return l.reportLocked(p.Peer, h, ok)
}

// Report records the result of a poll (or of a redial, while the peer is
// StateUnreachable), or of an attempt that could not reach the peer, and
// returns the transition it caused, if any. A peer that is not known
// (never learned, or removed) is left unknown.
func (l *Liveness) Report(id string, ok bool) (Transition, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.peers[id]
	if h == nil {
		return Transition{}, false
	}
	return l.reportLocked(id, h, ok)
}

func (l *Liveness) reportLocked(id string, h *health, ok bool) (Transition, bool) {
	defer l.reschedLocked(h)
	now := l.clock.Now()
	h.lastPoll = now
	from := h.load()
	var err error
	switch from {
	case StateAlive:
		if ok {
			// Decay, not reset: a grey peer failing often enough still climbs.
			h.failures = max(0, h.failures-1)
			return Transition{}, false
		}
		h.failures++
		if h.failures < l.cfg.PollFailureThreshold {
			return Transition{}, false
		}
		err = l.toUnreachable(id, h, now)
		h.reason = fmt.Sprintf("%d failures (polls or attempts that could not reach it)", l.cfg.PollFailureThreshold)
	case StateUnreachable:
		if !ok {
			h.redials++
			h.nextAttempt = now.Add(l.backoff(h.redials))
			if h.nextAttempt.Before(h.cordonUntil) {
				h.nextAttempt = h.cordonUntil
			}
			return Transition{}, false
		}
		if now.Before(h.cordonUntil) {
			// Cordoned: a poll in flight when the cordon began, or a
			// probe news asked for, does not end it sooner.
			return Transition{}, false
		}
		h.reason = "redialed, answering polls"

		if l.cfg.PollSuccessThreshold <= 0 {
			err = l.toAlive(id, h)
		} else {
			err = l.toProbing(id, h)
		}
	case StateProbing:
		if !ok && h.fresh {
			// A new peer's failed polls count as an alive peer's do: it
			// waits, not selected, until one is answered, and is
			// unreachable at poll-failure-threshold of them.
			h.failures++
			h.reason = fmt.Sprintf("not polled yet: %d of %d polls failed", h.failures, l.cfg.PollFailureThreshold)
			if h.failures < l.cfg.PollFailureThreshold {
				return Transition{}, false
			}
			err = l.toUnreachable(id, h, now)
			h.reason = fmt.Sprintf("its first %d polls failed", l.cfg.PollFailureThreshold)
			h.fresh = false
			break
		}
		if !ok {
			// One failure while probing sends the peer back to redialing.
			h.redials++
			err = l.toUnreachable(id, h, now)
			h.nextAttempt = now.Add(l.backoff(h.redials))
			h.reason = "a poll failed while probing"
			break
		}
		if h.fresh {
			// The first poll a new peer answers is what makes it alive.
			if err := l.toAlive(id, h); err != nil {
				return Transition{}, false
			}
			t := Transition{Peer: id, From: from, To: StateAlive, First: true}
			if l.onTransition != nil {
				l.onTransition(t)
			}
			return t, true
		}
		h.successes++
		if h.successes < l.cfg.PollSuccessThreshold {
			return Transition{}, false
		}
		err = l.toAlive(id, h)
	}
	if err != nil {
		return Transition{}, false
	}
	t := Transition{Peer: id, From: from, To: h.load()}
	if l.onTransition != nil {
		l.onTransition(t)
	}
	return t, true
}

// ReportStall records a work request that the peer accepted (or was sent)
// and left unanswered until the request's deadline: its health pings may
// say alive, its work does not. A strike is added; at stall-threshold
// strikes an alive peer is cordoned, StateUnreachable for stall-cordon
// (doubled for each cordon in a row, up to 16 times) before it is redialed
// and probed, with the reason in the peers view. Only an answer
// (ReportAnswer) takes a strike away; polls do not. It returns the
// transition it caused, if any.
func (l *Liveness) ReportStall(id string) (Transition, bool) {
	if l.cfg.StallThreshold <= 0 {
		return Transition{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.peers[id]
	if h == nil {
		return Transition{}, false
	}
	defer l.reschedLocked(h)
	if h.strikes == 0 {
		l.striking.Add(1)
	}
	h.strikes++
	from := h.load()
	if from != StateAlive || h.strikes < l.cfg.StallThreshold {
		return Transition{}, false
	}
	now := l.clock.Now()
	if err := l.toUnreachable(id, h, now); err != nil {
		return Transition{}, false
	}
	h.cordons++
	h.nextAttempt = now.Add(l.cordon(h.cordons))
	h.cordonUntil = h.nextAttempt
	h.reason = fmt.Sprintf("stalled: %d accepted work requests left unanswered past their deadline", h.strikes)
	// Back from the cordon, one more stall cordons it again.
	h.strikes = l.cfg.StallThreshold - 1
	if h.strikes == 0 {
		l.striking.Add(-1)
	}
	t := Transition{Peer: id, From: from, To: StateUnreachable}
	if l.onTransition != nil {
		l.onTransition(t)
	}
	return t, true
}

// ReportAnswer records that the peer answered a work request (a result or
// an error; the dispatcher does not report refusals, busy or denied, which
// show nothing ran): it takes one strike away, and with none left the next
// cordon is the shortest again. While no peer has strikes it costs one
// atomic load.
func (l *Liveness) ReportAnswer(id string) {
	if l.striking.Load() == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.peers[id]
	if h == nil || h.strikes == 0 || l.clock.Now().Before(h.cordonUntil) {
		// An answer to work sent before the cordon, arriving during it,
		// forgives nothing: the next cordon still doubles.
		return
	}
	h.strikes--
	if h.strikes == 0 {
		h.cordons = 0
		l.striking.Add(-1)
		l.reschedLocked(h) // a probing peer's interval depends on cordons
	}
}

// cordon returns how long a peer cordoned for the nth time in a row is
// kept out: stall-cordon doubled n-1 times, at most 16 times stall-cordon.
func (l *Liveness) cordon(n int) time.Duration {
	d := l.cfg.StallCordon
	for i := 1; i < n && i <= 4; i++ {
		d *= 2
	}
	return d
}

// backoff returns the wait before redial number n+1: redial-backoff-min
// doubled n times, capped at redial-backoff-max.
func (l *Liveness) backoff(n int) time.Duration {
	d := l.cfg.RedialBackoffMin
	if d <= 0 {
		return 0
	}
	for i := 0; i < n && d < l.cfg.RedialBackoffMax; i++ {
		d *= 2
	}
	if l.cfg.RedialBackoffMax > 0 && d > l.cfg.RedialBackoffMax {
		d = l.cfg.RedialBackoffMax
	}
	return d
}

// Counts returns how many known peers are in each state.
func (l *Liveness) Counts() map[State]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[State]int, numStates)
	for _, h := range l.peers {
		out[h.load()]++
	}
	return out
}

// handles returns the health of each peer in ids, creating the missing ones,
// under one lock.
func (l *Liveness) handles(ids []string) []*health {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*health, len(ids))
	for i, id := range ids {
		out[i] = l.handleLocked(id)
	}
	return out
}

// AwaitsFirstPoll reports whether the peer is new and has not answered a
// poll yet (StateProbing under AwaitFirstPoll, not selected until it
// answers one): a request that finds only such candidates may wait for
// that poll instead of being refused.
func (l *Liveness) AwaitsFirstPoll(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.peers[id]
	return h != nil && h.fresh && h.load() == StateProbing
}

// probeIntervalDivisor divides poll-interval for a peer that answers again
// (see pollInterval).
const probeIntervalDivisor = 4

// pollInterval returns the time between the peer's polls: poll-interval,
// or a quarter of it while the peer is StateProbing after it answered a
// redial (back from a partition, a restart, a cordon): the good polls in
// a row it needs come that much sooner, so a peer that is back serves
// again within about a second at the defaults, not after whole intervals.
// A failure among them sends it back to redialing as before. A peer back
// from a stall cordon is polled every poll-interval.
func (l *Liveness) pollInterval(h *health) time.Duration {
	// A peer back from a stall cordon answered its pings all along: it is
	// probed at the usual pace.
	if h.load() == StateProbing && !h.fresh && h.cordons == 0 {
		return l.cfg.PollInterval / probeIntervalDivisor
	}
	return l.cfg.PollInterval
}

// FirstPollsFailed reports whether the peer awaits its first poll (see
// AwaitsFirstPoll) and at least one of its polls failed: news of it (a
// new record, a connection) may be the way to it those polls lacked.
func (l *Liveness) FirstPollsFailed(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.peers[id]
	return h != nil && h.fresh && h.failures > 0 && h.load() == StateProbing
}

// CountFirstPollsFailed returns how many peers FirstPollsFailed holds.
func (l *Liveness) CountFirstPollsFailed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, h := range l.peers {
		if h.fresh && h.failures > 0 && h.load() == StateProbing {
			n++
		}
	}
	return n
}

// ProbeFor is PollFor for a probe that news of the peer asked for (a new
// record, a connection): while the peer is new and awaits its first good
// poll, a failed one does not count toward poll-failure-threshold.
func (l *Liveness) ProbeFor(id string) (Poll, bool) {
	p, ok := l.PollFor(id)
	p.news = ok
	return p, ok
}
