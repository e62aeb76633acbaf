package selection

import (
	"fmt"
	"sync"
	"time"

	"github.com/workmesh/workmesh/config"
)

// Claims is the set of peers the plans of one verified request have taken:
// each of its replicas runs a plan of its own, and a peer one of them took
// is never offered to another, so that every vote comes from a distinct
// peer whatever the retries and hedges. It is safe for concurrent use.
type Claims struct {
	mu  sync.Mutex
	ids map[string]bool
}

// Claim takes id for the caller; false when another plan has it.
func (c *Claims) Claim(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ids[id] {
		return false
	}
	if c.ids == nil {
		c.ids = map[string]bool{}
	}
	c.ids[id] = true
	return true
}

// Release gives id back, for a plan whose attempt on it was refused as
// busy: nothing ran there, so another round (or replica) may take it.
func (c *Claims) Release(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.ids, id)
}

// Has reports whether some plan took id.
func (c *Claims) Has(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[id]
}

// explore is the exploration budget: of any config.ExploreWindow requests
// in a row, at most explore-share of them (20 of 200 by default) send
// their first attempt to an unproven (unrated) peer while a proven one was
// there to take it. A node that just started may spend its 20 at once, so
// that newcomers are rated quickly while a stream of them cannot take more.
// A request whose group has no proven peer does not count: the network
// must work while nobody has proven itself yet.
type explore struct {
	mu    sync.Mutex
	share float64
	ring  [config.ExploreWindow]bool
	n     int // requests in the ring (at most its length)
	next  int // the ring position the next request takes
	spent int // true entries in the ring
}

// allows reports whether one more request may explore now.
func (x *explore) allows() bool {
	if x == nil {
		return true
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return float64(x.spent+1) <= x.share*float64(len(x.ring))
}

// note counts one request's first attempt; explored says it went to an
// unproven peer while a proven one was there.
func (x *explore) note(explored bool) {
	if x == nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.n == len(x.ring) && x.ring[x.next] {
		x.spent--
	}
	x.ring[x.next] = explored
	if explored {
		x.spent++
	}
	x.next = (x.next + 1) % len(x.ring)
	x.n = min(x.n+1, len(x.ring))
}

// ExploreShare returns the share of the last requests whose first attempt
// explored an unproven peer while a proven one could have taken it.
func (s *Selector) ExploreShare() float64 {
	x := s.explore
	if x == nil {
		return 0
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.n == 0 {
		return 0
	}
	return float64(x.spent) / float64(x.n)
}

// ReportDispute records that the peer's result was outvoted by other
// workers (or contradicted by an audit). Every dispute is counted
// (Disputes); at dispute-threshold disputes within dispute-window an alive
// peer is cordoned: StateUnreachable for dispute-cordon, with the reason in
// the peers view, before it is redialed and probed. It returns the
// transition it caused, if any.
func (l *Liveness) ReportDispute(id string) (Transition, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.peers[id]
	if h == nil {
		return Transition{}, false
	}
	defer l.reschedLocked(h)
	now := l.clock.Now()
	h.disputes++
	t := l.trust
	if t.DisputeThreshold <= 0 {
		return Transition{}, false
	}
	keep := h.disputeAt[:0]
	for _, at := range h.disputeAt {
		if now.Sub(at) < t.DisputeWindow {
			keep = append(keep, at)
		}
	}
	h.disputeAt = append(keep, now)
	from := h.load()
	if from != StateAlive || len(h.disputeAt) < t.DisputeThreshold {
		return Transition{}, false
	}
	if err := l.toUnreachable(id, h, now); err != nil {
		return Transition{}, false
	}
	h.nextAttempt = now.Add(t.DisputeCordon)
	// As a stall cordon: no poll, probe or redial during it ends it sooner.
	h.cordonUntil = h.nextAttempt
	h.reason = fmt.Sprintf("disputed: %d results outvoted by other workers within %s (%d in all); cordoned for %s", len(h.disputeAt), t.DisputeWindow, h.disputes, t.DisputeCordon)
	h.disputeAt = h.disputeAt[:0]
	tr := Transition{Peer: id, From: from, To: StateUnreachable}
	if l.onTransition != nil {
		l.onTransition(tr)
	}
	return tr, true
}

// Disputes returns the peer's disputes since it was first seen.
func (l *Liveness) Disputes(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.peers[id]; h != nil {
		return h.disputes
	}
	return 0
}

// SetTrust sets the dispute settings (New sets them from the config).
func (l *Liveness) SetTrust(t config.TrustConfig) {
	l.mu.Lock()
	l.trust = t
	l.mu.Unlock()
}

// disputeWindowOf is for tests: the disputes now counted toward the cordon.
func (l *Liveness) disputeCount(id string, now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	if h := l.peers[id]; h != nil {
		for _, at := range h.disputeAt {
			if now.Sub(at) < l.trust.DisputeWindow {
				n++
			}
		}
	}
	return n
}
