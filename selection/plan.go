package selection

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/workmesh/workmesh/config"
)

// Request is what the core needs to know of one submitted request.
type Request struct {
	// WorkType names the work; only peers advertising it are candidates.
	WorkType string
	// Labels a candidate must all carry (the request's label constraints).
	Labels []string
	// MinHead is the position the request names, when HasMinHead: a peer
	// whose advertised head is below it cannot serve it.
	MinHead    uint64
	HasMinHead bool
	// Idempotent work may be hedged (sent to a second peer concurrently).
	Idempotent bool
	// View marks a plan that is only looked at (an operator's plan view):
	// it is not counted by the retry budget and spends none of it.
	View bool
	// Again marks the plan of a request that comes back from the admission
	// queue (every worker was busy): it was counted as a request when it
	// first arrived, so its first pick is counted neither as a request nor
	// as a retry by the retry budget.
	Again bool
	// Claims, when set, is shared by the plans of one verified request's
	// replicas: a peer one of them took is never offered to another.
	Claims *Claims
	// Ran lists, for a plan of a request back from the admission queue
	// (Again), the peers its earlier rounds gave it to that did not
	// refuse it as busy: they ran the work, or may have, and are never
	// offered it again. Retries is what those rounds spent of max-retries.
	Ran     []string
	Retries int
}

// Pick is one peer a plan offers, with why it stands where it does.
type Pick struct {
	Peer string
	// Group is the priority group's label ("" without label balancing or for
	// the default group); GroupIndex its position in the order.
	Group      string
	GroupIndex int
	Score      float64
	Rated      bool
	// Hedge is true for a concurrent extra attempt.
	Hedge bool
}

// tried is one peer a plan handed out.
type tried struct {
	e        *entry
	group    int
	reported bool
	// missed: it answered empty and the request went on (a miss).
	missed bool
}

// Plan is the per-request state of one dispatch: the peers already tried,
// the group cursor, the budget spent. Retries and hedges of the request share
// it and nothing else does. Every Pick a plan hands out must be reported back
// exactly once with Report (Cancelled for an attempt that was abandoned). A
// Plan is safe for concurrent use by the attempts of its request. A caller
// that is done with a plan may Release it for a later request to reuse.
type Plan struct {
	s    *Selector
	view *typeView
	req  Request
	mode string
	lb   *config.LabelBalancingConfig
	lim  limits

	mu         sync.Mutex
	cursor     int
	tried      []tried
	triedBuf   [4]tried
	nexts      int // Next calls that produced a pick
	retries    int
	hedges     int
	beyondHead bool
	decided    bool
	// succeeded: a worker answered the request with data, which
	// contradicts every miss of it (tried.missed).
	succeeded bool
	// afterBusy: the last attempt reported was refused as busy, so the next
	// pick is a busy move (see Next), not a retry.
	afterBusy bool
	limitHit  string
	rnd       uint64
	rot       uint64
}

type limits struct {
	maxRemote, maxRetries, maxHedges, spread int
}

// Plan starts the plan of one request from the current ranking.
func (s *Selector) Plan(req Request) *Plan {
	tv := s.snap.Load().types[req.WorkType]
	p := plans.Get().(*Plan)
	*p = Plan{
		s:    s,
		view: tv,
		req:  req,
		mode: s.cfg.Selection.Mode,
		lim: limits{
			maxRemote:  s.cfg.Worker.MaxRemoteWorkers,
			maxRetries: s.cfg.Worker.MaxRetries,
			maxHedges:  s.cfg.Hedge.MaxCount,
			spread:     min(max(1, s.cfg.Rating.Spread), maxSpread),
		},
	}
	p.tried = p.triedBuf[:0]
	p.retries = req.Retries
	p.rnd = splitmix(s.seed + s.plans.Add(1))
	if tv == nil {
		return p
	}
	p.lb = tv.lb
	switch p.mode {
	case config.ModeRoundRobin:
		p.rot = tv.rr.Add(1) - 1
	case config.ModeRandom:
		p.rot = p.rand()
	}
	// The beyond-head rule: a position above every candidate's head cannot be
	// served by anyone, so the empty answer of the best candidate is the
	// truth. Unknown heads fail open.
	p.beyondHead = req.HasMinHead && tv.headsKnown && len(tv.all) > 0 && req.MinHead > tv.maxHead
	return p
}

// plans holds the plans released, for the next requests: a plan is a few
// hundred bytes a request, and at tens of thousands of requests a second
// the garbage collector's share of the work follows the bytes allocated.
var plans = sync.Pool{New: func() any { return new(Plan) }}

// Release gives the plan back for a later request to reuse, once its
// request is done with it: every pick reported, its Explain and
// Candidates read. Nothing may use the plan after that. A plan that is
// never released is collected as garbage.
func (p *Plan) Release() {
	*p = Plan{}
	plans.Put(p)
}

// Retries returns how many of max-retries the request has spent, in this
// plan and the earlier rounds it was made with (Request.Retries).
func (p *Plan) Retries() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.retries
}

// Idempotent reports whether the request may be hedged.
func (p *Plan) Idempotent() bool { return p.req.Idempotent }

// BeyondHead reports whether the request names a position above every
// candidate's head: one attempt, its empty answer final, no fallback.
func (p *Plan) BeyondHead() bool { return p.beyondHead }

// HasCandidates reports whether any peer advertises the request's work type,
// whatever its labels, head or liveness.
func (p *Plan) HasCandidates() bool { return p.view != nil && len(p.view.all) > 0 }

// AnyHead reports whether any peer advertising the request's work type
// advertises a head for it: a type no peer has a head for cannot serve a
// request that names a position, unless the local worker can.
func (p *Plan) AnyHead() bool { return p.view != nil && p.view.anyHead }

// FallbackAllowed reports whether the local worker may serve the request
// when no remote attempt succeeded. Beyond every head it may not: the empty
// answer is the truth and the local worker cannot know better.
func (p *Plan) FallbackAllowed() bool { return !p.beyondHead }

// Next returns the next peer to try: the first, or a retry after a failure.
// It returns false when no peer is left or the budget is spent; Explain then
// says why.
func (p *Plan) Next() (Pick, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.decided {
		return Pick{}, false
	}
	// A busy move, the pick after a worker refused the work at once as
	// busy, is no retry: nothing ran, so it does not amplify load the way a
	// retry after an error may (the work ran, or may have, and runs again).
	// It is bounded by max-remote-workers (each peer once per plan) and
	// spends neither max-retries nor the retry budget, which would
	// otherwise be spent by a burst's refusals and fail requests the
	// network can finish.
	busyMove := p.afterBusy && p.nexts > 0
	if !busyMove && p.retriesSpentLocked() || !p.budgetLocked() {
		return Pick{}, false
	}
	if !busyMove && !p.retryBudgetLocked() {
		return Pick{}, false
	}
	pk, ok := p.pickLocked(false)
	if !ok {
		return Pick{}, false
	}
	p.afterBusy = false
	if !busyMove {
		p.spendLocked()
		if p.nexts > 0 {
			p.retries++
		}
	}
	p.nexts++
	return pk, true
}

// retryBudgetLocked reports whether the node's retry budget allows this
// request a retry now, noting the limit for Explain when it does not.
func (p *Plan) retryBudgetLocked() bool {
	b := p.s.budget
	if b == nil || p.req.View || p.nexts == 0 {
		return true
	}
	ok, retries, allowed := b.allows(p.s.clock.Now())
	if !ok {
		p.limitHit = fmt.Sprintf("retry budget spent (%d retries in the last %s, %d allowed)", retries, p.s.cfg.Worker.RetryBudgetWindow, allowed)
	}
	return ok
}

// spendLocked counts a pick Next hands out in the retry budget: the first
// as one request of the window, any later one as a retry.
func (p *Plan) spendLocked() {
	b := p.s.budget
	if b == nil || p.req.View || p.req.Again && p.nexts == 0 {
		return
	}
	if p.nexts == 0 {
		b.request(p.s.clock.Now())
	} else {
		b.retry(p.s.clock.Now())
	}
}

// Hedge returns a peer for a concurrent extra attempt, when the request is
// idempotent and hedging is on. A hedge is not an error: it never moves the
// group cursor on, even under pass-on-error.
func (p *Plan) Hedge() (Pick, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.decided || !p.req.Idempotent || p.hedges >= p.lim.maxHedges {
		return Pick{}, false
	}
	if !p.budgetLocked() {
		return Pick{}, false
	}
	pk, ok := p.pickLocked(true)
	if !ok {
		return Pick{}, false
	}
	p.hedges++
	return pk, true
}

// HedgeDelay is how long after an attempt starts a hedge may be sent: the
// request's work type's measured hedge delay (Selector.HedgeDelay).
func (p *Plan) HedgeDelay() time.Duration {
	d, _, _ := p.s.HedgeDelay(p.req.WorkType)
	return d
}

// budgetLocked reports whether another distinct remote peer may be tried.
// retriesSpentLocked reports whether max-retries allows no further retry,
// noting the limit for Explain.
func (p *Plan) retriesSpentLocked() bool {
	if p.nexts > 0 && p.retries >= p.lim.maxRetries {
		p.limitHit = fmt.Sprintf("max-retries %d reached", p.lim.maxRetries)
		return true
	}
	return false
}

func (p *Plan) budgetLocked() bool {
	if p.beyondHead && len(p.tried) >= 1 {
		p.limitHit = "beyond every head: one attempt only"
		return false
	}
	if len(p.tried) >= p.lim.maxRemote {
		p.limitHit = fmt.Sprintf("max-remote-workers %d reached", p.lim.maxRemote)
		return false
	}
	return true
}

// pickLocked walks the groups from the cursor. A group with no selectable
// peer always falls through to the next one.
func (p *Plan) pickLocked(hedge bool) (Pick, bool) {
	if p.view == nil {
		return Pick{}, false
	}
	first := !hedge && p.nexts == 0 && !p.req.View && !p.req.Again
	for p.cursor < len(p.view.groups) {
		g := &p.view.groups[p.cursor]
		e := p.pickInGroup(g, first)
		if e != nil && p.req.Claims != nil && !p.req.Claims.Claim(e.id) {
			continue // another replica took it meanwhile: pick again
		}
		if e != nil {
			if first && p.s.explore != nil {
				p.s.explore.note(!e.rated && !e.rate.proven.Load() && g.rated > 0)
			}
			p.tried = append(p.tried, tried{e: e, group: p.cursor})
			e.stats.inflight.Add(1)
			return Pick{Peer: e.id, Group: g.label, GroupIndex: p.cursor, Score: e.score, Rated: e.rated, Hedge: hedge}, true
		}
		p.cursor++
	}
	return Pick{}, false
}

// pickInGroup returns the best selectable member of g, or nil. In rating
// mode unrated peers come first but only while they have no attempt in
// flight. Among the best few rated peers (loadAware, or rating-spread when
// larger) the pick weighs each peer's score with the attempts this node has
// in flight on it, as a share of its concurrency (rating-load-weight per
// concurrency's worth), so concurrent requests spread over equally good peers
// at once; with rating-spread above 1 it is a seeded random one among the
// best rating-spread of them. A peer without free capacity (see
// entry.fill) is the last resort in every mode: the least full of them is
// picked only when no member has room, since its refusal costs the request
// a round trip and says nothing new.
//
// A request's first attempt explores an unrated peer only while the
// exploration budget (explore-share) allows it or the group has no rated
// peer: over the budget the unrated peers wait behind the rated ones.
func (p *Plan) pickInGroup(g *group, first bool) *entry {
	n := len(g.members)
	if n == 0 {
		return nil
	}
	budgeted := first && p.mode == config.ModeRating && g.rated > 0 && !p.s.explore.allows()
	start := 0
	switch {
	case p.mode != config.ModeRating:
		start = int(p.rot % uint64(n))
	case budgeted:
		// A group's unrated members come first (buildView). With the
		// exploration budget spent they are only the fallback of a pick
		// that finds no rated member, so the rated ones, at the end, are
		// looked at first: in a large network most members are unrated
		// at any one dispatcher, and walking past them all on every pick
		// grew the pick with the network.
		start = n - g.rated
	}
	var deferred, full *entry
	var deferredLoad, fullFill float64
	var top [maxSpread]*entry
	var costs [maxSpread]float64
	consider := max(p.lim.spread, loadAware)
	found := 0
	for i := range n {
		e := g.members[(start+i)%n]
		if !p.offerable(e) {
			continue
		}
		inflight := e.stats.inflight.Load()
		f := e.fill(int64(inflight))
		if e.stats.held.Load() > 0 && e.stats.heldFor(p.req.WorkType, p.s.clock.Now()) {
			f = max(f, 1) // it asked to be left alone (HoldOff)
		}
		if f >= 1 {
			if full == nil || f < fullFill {
				full, fullFill = e, f
			}
			continue
		}
		if p.mode != config.ModeRating {
			return e
		}
		if !e.rated {
			if inflight >= exploreInFlight || budgeted || e.rate.proven.Load() {
				// Exploration learns, it does not flood: the least loaded
				// of the unrated peers with attempts in flight waits here.
				// So does one proven since the ranking was built: it is no
				// longer a newcomer, and the next refresh rates it
				// (explored on until then, a peer failing half its work got
				// every first attempt in a row, one at a time, for as long
				// as a refresh took).
				if l := float64(inflight) / e.concurrency; deferred == nil || l < deferredLoad {
					deferred, deferredLoad = e, l
				}
				continue
			}
			return e
		}
		if found == 0 && inflight <= 0 && p.lim.spread == 1 {
			// The best rated peer with nothing in flight: no one after
			// it can weigh less.
			return e
		}
		c := e.cost
		if inflight > 0 {
			c += p.s.cfg.Rating.LoadWeight * float64(inflight) / e.concurrency
		}
		// Insert in order of weighed cost; ties keep the rank order.
		j := found
		for j > 0 && costs[j-1] > c {
			top[j], costs[j] = top[j-1], costs[j-1]
			j--
		}
		top[j], costs[j] = e, c
		found++
		if found >= consider {
			break
		}
	}
	switch {
	case found == 0 && deferred != nil:
		return deferred
	case found == 0:
		return full
	case p.lim.spread == 1 || found == 1:
		return top[0]
	}
	return top[p.rand()%uint64(min(found, p.lim.spread))]
}

// fill is how full the peer is for this node with inflight attempts of
// its own there: the larger of what it advertised taken and those
// attempts, as a share of the capacity it advertised; 1 or more means no
// free capacity. A peer that advertises no capacity is never full.
func (e *entry) fill(inflight int64) float64 {
	if e.capacity <= 0 {
		return 0
	}
	return float64(max(e.used, inflight)) / float64(e.capacity)
}

// selectable reports whether e may be tried by this request now.
func (p *Plan) selectable(e *entry) bool {
	return p.reason(e, e.health.load()) == reasonNone
}

func (p *Plan) rand() uint64 {
	p.rnd += 0x9e3779b97f4a7c15
	return splitmix(p.rnd)
}

// splitmix is the SplitMix64 finaliser: a fast, allocation-free stream.
func splitmix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// offerable reports whether the plan may offer e: selectable, and not
// taken by another replica (Claims) or by an earlier round (Ran).
func (p *Plan) offerable(e *entry) bool {
	return p.selectable(e) && (p.req.Claims == nil || !p.req.Claims.Has(e.id)) && (len(p.req.Ran) == 0 || !slices.Contains(p.req.Ran, e.id))
}

// Upcoming returns up to n peers the plan would offer after the ones already
// handed out, without handing them out: a dispatcher dials them ahead so
// that one dead candidate does not cost its whole connect timeout serially.
// It spends no budget and moves no cursor.
func (p *Plan) Upcoming(n int) []string { return p.AppendUpcoming(nil, n) }

// AppendUpcoming is Upcoming appending to dst, for a caller that keeps
// room for them.
func (p *Plan) AppendUpcoming(dst []string, n int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.view == nil || p.decided || n <= 0 {
		return dst
	}
	n = min(n, p.lim.maxRemote-len(p.tried))
	if p.beyondHead {
		n = 0
	}
	out, from := dst, len(dst)
	n += from
	for gi := p.cursor; gi < len(p.view.groups) && len(out) < n; gi++ {
		members := p.view.groups[gi].members
		// Walk from where pickInGroup starts, so that round-robin and
		// random plans dial ahead the peers they will actually offer next.
		start := 0
		if p.mode != config.ModeRating && len(members) > 0 {
			start = int(p.rot % uint64(len(members)))
		}
		for i := range members {
			if len(out) >= n {
				break
			}
			e := members[(start+i)%len(members)]
			if p.offerable(e) && !slices.Contains(out[from:], e.id) {
				out = append(out, e.id)
			}
		}
	}
	return out
}
