package access

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/time/rate"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
)

// NotAllowedError is the error message of the Denied result a peer that
// may not send work here gets.
const NotAllowedError = "not allowed: this node takes work only from the peers on its allow-peer list"

// minSweep is the number of peers the access state holds before it first
// looks for idle peers to forget.
const minSweep = 256

// Access decides which peers may send this node work and how much: who
// (accept-work-from any or allowlist), how many work streams at once and
// how many requests per second (a token bucket) per peer. Over a limit the
// peer is answered Busy at once; nothing ever waits in a queue of its own.
// It is safe for concurrent use.
type Access struct {
	// allowed is nil when any peer may send work.
	allowed    map[peer.ID]struct{}
	maxStreams int
	limit      rate.Limit // 0: no rate limit
	burst      int
	now        func() time.Time

	mu      sync.Mutex
	peers   map[peer.ID]*peerUse
	sweepAt int

	denied, overStreams, overRate atomic.Uint64

	// member, when set, admits only a closed network's members; see
	// RequireMembers.
	member    func(peer.ID) bool
	notMember atomic.Uint64
}

// peerUse is what one peer is using now: its open work streams and its
// token bucket.
type peerUse struct {
	streams int
	bucket  *rate.Limiter // nil without a rate limit
}

// AccessStats counts the requests access refused, by reason.
type AccessStats struct {
	// Denied counts requests from peers that may not send work here.
	Denied uint64 `json:"denied"`
	// OverStreams counts requests refused because their peer had
	// peer-max-streams work streams open already.
	OverStreams uint64 `json:"over_streams"`
	// OverRate counts requests refused by their peer's token bucket.
	OverRate uint64 `json:"over_rate"`
}

// New returns the access rules of cfg. Every allow-peer entry must be
// a peer ID; an allowlist needs at least one, and allow-peer entries under
// accept-work-from any are refused rather than silently ignored.
func New(cfg config.AccessConfig) (*Access, error) {
	a := &Access{maxStreams: cfg.PeerMaxStreams, burst: cfg.PeerBurst, now: time.Now,
		peers: make(map[peer.ID]*peerUse), sweepAt: minSweep}
	switch cfg.AcceptWorkFrom {
	case config.AcceptAny:
		if len(cfg.AllowPeers) > 0 {
			return nil, fmt.Errorf("access: allow-peer is set (%d entries) but accept-work-from is %s: set accept-work-from %s to use the list",
				len(cfg.AllowPeers), config.AcceptAny, config.AcceptAllowlist)
		}
	case config.AcceptAllowlist:
		if len(cfg.AllowPeers) == 0 {
			return nil, fmt.Errorf("access: accept-work-from %s with no allow-peer entry: no peer could send work", config.AcceptAllowlist)
		}
		a.allowed = make(map[peer.ID]struct{}, len(cfg.AllowPeers))
		for i, s := range cfg.AllowPeers {
			id, err := peer.Decode(strings.TrimSpace(s))
			if err != nil {
				return nil, fmt.Errorf("access: allow-peer entry %d %q: not a peer ID: %w", i+1, s, err)
			}
			a.allowed[id] = struct{}{}
		}
	default:
		return nil, fmt.Errorf("access: accept-work-from %q: want %s or %s", cfg.AcceptWorkFrom, config.AcceptAny, config.AcceptAllowlist)
	}
	if cfg.PeerMaxStreams < 1 {
		return nil, fmt.Errorf("access: peer-max-streams %d: want at least 1", cfg.PeerMaxStreams)
	}
	switch r := cfg.PeerRate; {
	case math.IsNaN(r) || r < 0:
		return nil, fmt.Errorf("access: peer-rate %g: want 0 (no limit) or more", r)
	case r > 0 && !math.IsInf(r, 1):
		if cfg.PeerBurst < 1 {
			return nil, fmt.Errorf("access: peer-burst %d: want at least 1 with peer-rate %g", cfg.PeerBurst, r)
		}
		a.limit = rate.Limit(r)
	}
	return a, nil
}

// Allowed reports whether p may send work here at all.
func (a *Access) Allowed(p peer.ID) bool {
	if a.allowed == nil {
		return true
	}
	_, ok := a.allowed[p]
	return ok
}

// Stats returns the counts of refused requests.
func (a *Access) Stats() AccessStats {
	return AccessStats{Denied: a.denied.Load(), OverStreams: a.overStreams.Load(), OverRate: a.overRate.Load()}
}

// Acquire admits one request of p, or returns the result p gets instead
// (ok false): Denied for a peer that is not allowed, Busy over a limit. An
// admitted request holds one of p's streams until release.
func (a *Access) Acquire(p peer.ID) (res workers.Result, ok bool) {
	// Membership and the allowlist first: a refused peer leaves no state
	// behind.
	if res, refused := a.memberRefusal(p); refused {
		return res, false
	}
	if !a.Allowed(p) {
		a.denied.Add(1)
		return workers.Result{Outcome: workers.Denied, Error: NotAllowedError}, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u := a.peers[p]
	if u == nil {
		if len(a.peers) >= a.sweepAt {
			a.sweep()
		}
		u = &peerUse{}
		if a.limit > 0 {
			u.bucket = rate.NewLimiter(a.limit, a.burst)
		}
		a.peers[p] = u
	}
	// Streams before the rate: a request refused for its streams does not
	// spend a token.
	if u.streams >= a.maxStreams {
		a.overStreams.Add(1)
		return workers.Fail(workers.Busy, "peer busy: %d work streams open, at most %d per peer", u.streams, a.maxStreams), false
	}
	if u.bucket != nil && !u.bucket.AllowN(a.now(), 1) {
		a.overRate.Add(1)
		return workers.Fail(workers.Busy, "peer over its rate: more than %g requests per second (burst %d)", float64(a.limit), a.burst), false
	}
	u.streams++
	return workers.Result{}, true
}

// Release ends a request admitted by acquire.
func (a *Access) Release(p peer.ID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if u := a.peers[p]; u != nil {
		u.streams--
		a.forget(p, u)
	}
}

// forget drops the state of a peer with nothing to remember: no stream
// open and no token bucket (a bucket is kept until it is full again, or a
// peer could reset its bucket by sending one request at a time).
func (a *Access) forget(p peer.ID, u *peerUse) {
	if u.streams == 0 && u.bucket == nil {
		delete(a.peers, p)
	}
}

// Tracked returns the number of peers the limits hold state for: those
// with streams open or tokens spent, until a sweep drops the idle ones.
func (a *Access) Tracked() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.peers)
}

// sweep drops idle peers whose bucket has refilled, and sets when to look
// again, so the state grows with the peers that are busy, not with every
// peer ever seen. a.mu is held.
func (a *Access) sweep() {
	now := a.now()
	for p, u := range a.peers {
		if u.streams == 0 && (u.bucket == nil || u.bucket.TokensAt(now) >= float64(a.burst)) {
			delete(a.peers, p)
		}
	}
	a.sweepAt = max(minSweep, 2*len(a.peers))
}
