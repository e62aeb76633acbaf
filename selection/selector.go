package selection

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/workmesh/workmesh/config"
)

// TypeInfo is one work type a peer advertises, with its head when the type
// has positions.
type TypeInfo struct {
	Name    string
	Head    uint64
	HasHead bool
}

// Peer is one remote candidate as the peer table knows it: what it can do,
// its group labels and its advertised load. Self is never a Peer.
type Peer struct {
	ID     string
	Labels []string
	Types  []TypeInfo
	// Load is the peer's advertised utilisation: 0 idle, 1 at capacity.
	Load float64
	// Concurrency is how many requests the peer runs at once, as it
	// advertises. A pick weighs the attempts this node has in flight on the
	// peer against it: k in flight on a peer that runs c at once cost as
	// much as load k/c (0, unknown, counts as 1).
	Concurrency int
	// Capacity is how many requests the peer takes at once, running and
	// queued, as it advertises (0: unknown); Used is how many of them it
	// advertised taken. A pick passes over a peer without free capacity,
	// Capacity less the larger of Used and the attempts this node has in
	// flight there, while another has some (see pickInGroup).
	Capacity int
	Used     int
	// Connected says the node holds a connection to the peer now, so
	// reaching it costs no dial. Rating mode offers connected peers first:
	// a peer that went away (its connection closed) is not the favourite
	// any more the moment the dispatcher hears of it, long before a dial
	// to it times out or liveness has counted its failures.
	Connected bool
	// Relayed says the node reaches the peer through a relay only (no
	// direct connection yet, or a NAT no hole punch gets through): rating
	// adds a cost, so a direct peer wins over it among equals.
	Relayed bool
}

// Equal reports whether p and q are the same candidate: every field equal.
func (p Peer) Equal(q Peer) bool {
	return p.ID == q.ID && p.Load == q.Load && p.Concurrency == q.Concurrency && p.Connected == q.Connected && p.Relayed == q.Relayed &&
		p.Capacity == q.Capacity && p.Used == q.Used &&
		slices.Equal(p.Labels, q.Labels) && slices.Equal(p.Types, q.Types)
}

// Option adjusts a Selector.
type Option func(*Selector) error

// WithClock sets the clock the Selector and its Liveness read.
func WithClock(c Clock) Option {
	return func(s *Selector) error {
		if c == nil {
			return fmt.Errorf("selection: nil clock")
		}
		s.clock = c
		return nil
	}
}

// WithSeed seeds the random choices (rating-spread ties, random mode) so that
// a run can be repeated.
func WithSeed(seed uint64) Option {
	return func(s *Selector) error { s.seed = seed; return nil }
}

// WithRefreshInterval sets how stale the ranking may get before MaybeRefresh
// rebuilds it (default 50ms).
func WithRefreshInterval(d time.Duration) Option {
	return func(s *Selector) error {
		if d < 0 {
			return fmt.Errorf("selection: negative refresh interval %s", d)
		}
		s.refreshEvery = d
		return nil
	}
}

// exploreInFlight bounds the attempts in flight on one unrated peer before
// it is passed over for rated ones: exploration learns, it does not flood.
const exploreInFlight = 1

// maxSpread caps rating-spread so a pick stays a bounded scan.
const maxSpread = 8

// loadAware is how many of the best rated peers of a group a pick weighs
// by the attempts this node has in flight on each. Without it the best
// peer would take every concurrent request while nearly as good ones stand
// idle, until its advertised load (announced at most once a second) caught
// up.
const loadAware = 4

// Selector ranks candidates and makes per-request plans. One Selector lives
// as long as the dispatcher that owns it; it is safe for concurrent use.
type Selector struct {
	cfg          config.Config
	clock        Clock
	live         *Liveness
	seed         uint64
	refreshEvery time.Duration
	plans        atomic.Uint64 // per-plan random stream index
	budget       *retryBudget  // nil: no retry budget
	explore      *explore      // nil: exploration is not bounded
	hedgeLat     hedgeLatency  // the measured hedge delay of each work type

	mu          sync.Mutex // guards everything below
	peers       []Peer
	pstats      []*stats    // stats of peers[i]
	prates      [][]*rating // rating of peers[i] for each of its Types
	phealth     []*health   // liveness of peers[i]
	stats       map[string]*stats
	rates       map[rateKey]*rating
	lastRefresh time.Time
	changed     chan struct{} // closed when the next ranking is published

	snap atomic.Pointer[snapshot]
	// dirty says outcomes or loads arrived since the last refresh: set
	// after each report's change without the lock (markDirty), swapped
	// for false by Refresh before it reads them, so that a report whose
	// mark Refresh took is in that refresh, and any later one marks again.
	dirty atomic.Bool
}

// markDirty notes that the ranking's inputs changed.
func (s *Selector) markDirty() { s.dirty.Store(true) }

// New returns a Selector for cfg. cfg should have passed Validate; New checks
// what the core itself depends on.
func New(cfg config.Config, opts ...Option) (*Selector, error) {
	s := &Selector{
		cfg:          cfg,
		clock:        SystemClock{},
		seed:         0x9e3779b97f4a7c15,
		refreshEvery: 50 * time.Millisecond,
		stats:        make(map[string]*stats),
		rates:        make(map[rateKey]*rating),
		changed:      make(chan struct{}),
	}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	w := cfg.Worker
	s.budget = newRetryBudget(w.RetryBudgetWindow, w.RetryBudgetRatio, w.RetryBudgetMinPerSecond, s.clock.Now())
	switch cfg.Selection.Mode {
	case config.ModeRating, config.ModeRoundRobin, config.ModeRandom:
	case "":
		s.cfg.Selection.Mode = config.ModeRating
	default:
		return nil, fmt.Errorf("selection: unknown selection-mode %q (want rating, round-robin or random)", cfg.Selection.Mode)
	}
	live, err := NewLiveness(cfg.Liveness, s.clock)
	if err != nil {
		return nil, err
	}
	live.seed = s.seed
	live.trust = cfg.Trust
	s.live = live
	if sh := cfg.Trust.ExploreShare; sh < 1 && s.cfg.Selection.Mode == config.ModeRating {
		s.explore = &explore{share: sh}
	}
	s.snap.Store(&snapshot{types: map[string]*typeView{}})
	return s, nil
}

// Liveness returns the liveness tracker the Selector consults.
func (s *Selector) Liveness() *Liveness { return s.live }

// Clock returns the clock the Selector reads (WithClock): the times passed
// to ReportAttemptAt and ObserveLoadAt are read from it.
func (s *Selector) Clock() Clock { return s.clock }

// SetPeers replaces the candidate set (from the peer table) and rebuilds the
// ranking. Peers that are gone are forgotten by rating and liveness.
func (s *Selector) SetPeers(peers []Peer) {
	cp := make([]Peer, len(peers))
	copy(cp, peers)
	// Kept in ID order, so a peer's index is its deterministic tie-break.
	slices.SortFunc(cp, func(a, b Peer) int { return cmp.Compare(a.ID, b.ID) })
	keep := make(map[string]struct{}, len(cp))
	for _, p := range cp {
		keep[p.ID] = struct{}{}
	}
	s.live.retain(keep)
	ids := make([]string, len(cp))
	for i, p := range cp {
		ids[i] = p.ID
	}
	handles := s.live.handles(ids)
	s.mu.Lock()
	old := s.peers // in ID order too
	s.peers = cp
	s.phealth = handles
	for id := range s.stats {
		if _, ok := keep[id]; !ok {
			delete(s.stats, id)
		}
	}
	s.pstats = make([]*stats, len(cp))
	j := 0
	for i, p := range cp {
		for j < len(old) && old[j].ID < p.ID {
			j++
		}
		st := s.stats[p.ID]
		if st == nil {
			st = &stats{}
			s.stats[p.ID] = st
		} else if j < len(old) && old[j].ID == p.ID && (old[j].Used != p.Used || old[j].Load != p.Load) {
			// A new record with a load of its own is newer than what
			// the peer's answers told before it.
			st.forgetObserved()
		}
		s.pstats[i] = st
	}
	// Each type of each peer is rated apart. A peer that left is
	// forgotten; a type a present peer no longer advertises keeps its
	// rating if it was ever used, so that a peer withdrawing a type for a
	// while (its health flapped, or to shed a bad rating) is judged on its
	// record when it advertises the type again. Those are bounded by the
	// types this node sent the peer work of.
	rates := make(map[rateKey]*rating, len(s.rates))
	for k, r := range s.rates {
		if _, ok := keep[k.peer]; ok && r.used.Load() {
			rates[k] = r
		}
	}
	s.prates = make([][]*rating, len(cp))
	for i, p := range cp {
		s.prates[i] = make([]*rating, len(p.Types))
		for j, t := range p.Types {
			k := rateKey{p.ID, t.Name}
			r := s.rates[k]
			if r == nil {
				r = &rating{}
			}
			rates[k], s.prates[i][j] = r, r
		}
	}
	s.rates = rates
	s.mu.Unlock()
	s.Refresh()
}

// MaybeRefresh rebuilds the ranking when outcomes arrived since the last
// rebuild and that rebuild is older than the refresh interval. A dispatcher
// calls it after reporting outcomes, or on a ticker of its own.
func (s *Selector) MaybeRefresh() bool {
	s.mu.Lock()
	due := s.dirty.Load() && s.clock.Now().Sub(s.lastRefresh) >= s.refreshEvery
	s.mu.Unlock()
	if due {
		s.Refresh()
	}
	return due
}

// entry is one peer as a candidate for one work type, in a snapshot.
type entry struct {
	id      string
	labels  []string
	head    uint64
	hasHead bool
	load    float64
	conn    bool // the peer was connected at the last refresh
	relayed bool // reached through a relay only (Peer.Relayed)
	score   float64
	cost    float64 // the score's cost: score = 1 / (1 + cost)
	// concurrency is the peer's advertised concurrency, at least 1.
	concurrency float64
	// capacity and used are the peer's advertised Capacity and Used.
	capacity, used int64
	rated          bool
	health         *health
	stats          *stats  // the peer's, whatever the type
	rate           *rating // the peer's for this type
	view           view    // rate as the refresh read it
	idx            int32   // the peer's position in ID order
}

func (e *entry) hasLabel(l string) bool { return slices.Contains(e.labels, l) }

// group is one priority group in rated order.
type group struct {
	label   string // the order label; "" for the default group or no label balancing
	members []*entry
	// rated counts the members that are rated (proven): exploring an
	// unrated one spends the exploration budget only when there are some.
	rated int
}

// typeView is everything a request for one work type needs, precomputed.
type typeView struct {
	name    string
	lb      *config.LabelBalancingConfig
	groups  []group
	all     []*entry // every candidate of the type, in rated order
	maxHead uint64
	// headsKnown: every candidate advertises a head, so "above every head"
	// can be decided. One unknown head makes the rule fail open.
	headsKnown bool
	// anyHead: at least one candidate advertises a head.
	anyHead bool
	rr      *atomic.Uint64 // round-robin position, carried from one snapshot to the next
}

// snapshot is an immutable ranking; requests read it with one atomic load.
type snapshot struct {
	types map[string]*typeView
	at    time.Time
}

// Refresh rebuilds the ranking snapshot from the current peers and outcomes.
// It runs off the request path.
func (s *Selector) Refresh() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	s.dirty.Swap(false)
	s.lastRefresh = now

	// One slab of entries per refresh: a peer has one entry per work type.
	// Each entry's type is looked up once, as a small index.
	total := 0
	for _, p := range s.peers {
		total += len(p.Types)
	}
	typeIdx := make(map[string]int32)
	var names []string
	var counts []int
	entryType := make([]int32, 0, total)
	for _, p := range s.peers {
		for _, t := range p.Types {
			ti, ok := typeIdx[t.Name]
			if !ok {
				ti = int32(len(names))
				typeIdx[t.Name] = ti
				names = append(names, t.Name)
				counts = append(counts, 0)
			}
			counts[ti]++
			entryType = append(entryType, ti)
		}
	}
	slab := make([]entry, 0, total)
	lists := make([][]*entry, len(names))
	for ti, n := range counts {
		lists[ti] = make([]*entry, 0, n)
	}
	for i, p := range s.peers {
		load, used := p.Load, p.Used
		if u, ok := s.pstats[i].observed(now, observedLoadAge); ok {
			used = u
			if p.Capacity > 0 {
				load = loadStep(float64(u) / float64(p.Capacity))
			}
		}
		for j, t := range p.Types {
			rate := s.prates[i][j]
			slab = append(slab, entry{
				id: p.ID, labels: p.Labels, head: t.Head, hasHead: t.HasHead,
				load: load, concurrency: float64(max(1, p.Concurrency)), conn: p.Connected, relayed: p.Relayed,
				capacity: int64(p.Capacity), used: int64(used),
				health: s.phealth[i], stats: s.pstats[i], rate: rate, view: rate.read(now, s.cfg.Rating.Window), idx: int32(i),
			})
			ti := entryType[len(slab)-1]
			lists[ti] = append(lists[ti], &slab[len(slab)-1])
		}
	}
	prev := s.snap.Load()
	snap := &snapshot{types: make(map[string]*typeView, len(names)), at: now}
	for ti, name := range names {
		tv := s.buildView(name, lists[ti])
		// The round-robin position outlives the refresh: restarted at every
		// refresh (every 50ms under load), it sent most requests to the
		// first peers in ID order.
		if old := prev.types[name]; old != nil {
			tv.rr = old.rr
		}
		snap.types[name] = tv
	}
	s.snap.Store(snap)
	close(s.changed)
	s.changed = make(chan struct{})
}

// Changed returns a channel that is closed when the next ranking is
// published (a peer sync, or a refresh after outcomes or liveness changes),
// for views that follow the ranking without polling it.
func (s *Selector) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *Selector) buildView(name string, entries []*entry) *typeView {
	tv := &typeView{name: name, lb: s.cfg.LabelBalancingFor(name), headsKnown: true, rr: new(atomic.Uint64)}
	best := 0.0
	for _, e := range entries {
		if e.hasHead {
			tv.maxHead = max(tv.maxHead, e.head)
			tv.anyHead = true
		} else {
			tv.headsKnown = false
		}
		v := e.view
		e.rated = v.rated
		// Only peers with outcomes enough now that can be chosen and that
		// answered set the benchmark latency: neither a dead peer's old quick
		// answers nor quick failures may make the survivors look slow.
		if v.n >= float64(max(1, s.cfg.Rating.MinSamples)) {
			if e.health.load() == StateAlive && v.answered && v.latency > 0 && (best == 0 || v.latency < best) {
				best = v.latency
			}
		}
	}
	for _, e := range entries {
		in := scoreInputs{view: e.view, bestLatency: best, load: e.load, relayed: e.relayed}
		if e.hasHead && tv.maxHead > e.head {
			in.headLag = float64(tv.maxHead - e.head)
		}
		if !e.rated {
			// Unrated peers are judged on what they advertise alone.
			in.view = view{}
		}
		e.cost = cost(in, s.cfg.Rating)
		e.score = 1 / (1 + e.cost)
	}
	// Entries arrive in ID order; round-robin and random modes keep it.
	if s.cfg.Selection.Mode == config.ModeRating {
		// Unrated peers first, so they are explored; then best score first.
		// Ties break by peer ID, so the order is deterministic.
		// One integer key per entry sorts without a comparator: the high
		// 32 bits order by score descending (unrated first, as scores are in
		// (0, 1] and unrated ones get 2 added), the low 32 bits keep the
		// entry's position, which is peer ID order, for ties.
		keys := make([]uint64, len(entries))
		for i, e := range entries {
			k := e.score
			if !e.rated {
				k += 2
			}
			if e.conn {
				k += 4 // connected peers before the ones a request would dial
			}
			keys[i] = uint64(math.MaxUint32-uint32(k*(1<<29)))<<32 | uint64(i)
		}
		slices.Sort(keys)
		sorted := make([]*entry, len(entries))
		for i, k := range keys {
			sorted[i] = entries[uint32(k)]
		}
		entries = sorted
	}
	tv.all = entries
	tv.groups = partition(entries, tv.lb)
	for i := range tv.groups {
		for _, e := range tv.groups[i].members {
			if e.rated {
				tv.groups[i].rated++
			}
		}
	}
	return tv
}

// partition splits entries (in rated order) into the priority groups of lb:
// one group per order label, then the default group of peers carrying none of
// them when include-default is on. A peer with several labels is in several
// groups. Without label balancing there is one group of everyone.
func partition(entries []*entry, lb *config.LabelBalancingConfig) []group {
	if lb == nil {
		return []group{{members: entries}}
	}
	groups := make([]group, 0, len(lb.Order)+1)
	for _, label := range lb.Order {
		g := group{label: label, members: make([]*entry, 0, len(entries)/len(lb.Order)+1)}
		for _, e := range entries {
			if e.hasLabel(label) {
				g.members = append(g.members, e)
			}
		}
		groups = append(groups, g)
	}
	if lb.IncludesDefault() {
		g := group{}
		for _, e := range entries {
			if !inAnyGroup(e, lb) {
				g.members = append(g.members, e)
			}
		}
		groups = append(groups, g)
	}
	return groups
}

func inAnyGroup(e *entry, lb *config.LabelBalancingConfig) bool {
	for _, l := range lb.Order {
		if e.hasLabel(l) {
			return true
		}
	}
	return false
}

// Ranked is one peer's place in the current ranking, for explanations.
type Ranked struct {
	Peer  string
	Group string
	Score float64
	Rated bool
	State State
}

// Ranking returns the current order for a work type, group by group, as a
// request would walk it (before per-request filters).
func (s *Selector) Ranking(workType string) []Ranked {
	tv := s.snap.Load().types[workType]
	if tv == nil {
		return nil
	}
	var out []Ranked
	for _, g := range tv.groups {
		for _, e := range g.members {
			out = append(out, Ranked{Peer: e.id, Group: g.label, Score: e.score, Rated: e.rated, State: e.health.load()})
		}
	}
	return out
}

// Leading returns the peers that lead the current ranking: the first n of
// every work type's order, group by group as a request walks it, at most
// limit in all, each once; work types are taken in name order. It is what
// a dispatcher keeps its connections to whatever else it trims.
func (s *Selector) Leading(n, limit int) []string {
	snap := s.snap.Load()
	if snap == nil || n <= 0 || limit <= 0 {
		return nil
	}
	names := make([]string, 0, len(snap.types))
	for name := range snap.types {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []string
	seen := make(map[string]bool)
	for _, name := range names {
		taken := 0
		for _, g := range snap.types[name].groups {
			for _, e := range g.members {
				if taken == n {
					break
				}
				if e.health.load() == StateUnreachable {
					continue // no connection to keep
				}
				taken++
				if seen[e.id] {
					continue
				}
				if len(out) == limit {
					return out
				}
				seen[e.id] = true
				out = append(out, e.id)
			}
		}
	}
	return out
}
