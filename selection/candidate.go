package selection

import (
	"cmp"
	"slices"
	"strconv"
)

// Candidate is what a plan decides about one candidate of its work type in
// one priority group: where it stands in the ranking, and whether the
// request may try it or the first reason it may not. Views and explanations
// read these records instead of deciding again.
type Candidate struct {
	Peer string
	// Group is the priority group's label ("" for the default group or
	// without label balancing); GroupIndex is its position in the order, -1
	// for a candidate in no group (label balancing without include-default).
	Group      string
	GroupIndex int
	// Default marks the default group: the peers carrying none of the
	// order's labels.
	Default bool
	Score   float64
	Rated   bool
	// State is the candidate's liveness state when the record was made.
	State State
	// Reason is ReasonSelectable when the request may try the candidate,
	// otherwise the first reason it may not. Every record of one peer
	// carries the same reason.
	Reason Reason
	// Detail completes Reason: the missing label, the head asked for.
	Detail string
}

// Candidates returns the plan's decision on every candidate of its work type
// now: one record per group a candidate is in, groups in order and members
// in the order Next walks them, then the candidates in no group, in peer ID
// order. It is built when asked for (a plan view, an explanation), never on
// a request's way to its next peer.
func (p *Plan) Candidates() []Candidate {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.candidatesLocked()
}

func (p *Plan) candidatesLocked() []Candidate {
	tv := p.view
	if tv == nil {
		return nil
	}
	// A peer's last group decides whether the cursor has passed it by.
	last := make(map[*entry]int, len(tv.all))
	records := 0
	for gi := range tv.groups {
		for _, e := range tv.groups[gi].members {
			last[e] = gi
		}
		records += len(tv.groups[gi].members)
	}
	type decision struct {
		state  State
		reason Reason
		detail string
	}
	decided := make(map[*entry]decision, len(tv.all))
	var outside []*entry
	for _, e := range tv.all {
		gi, in := last[e]
		if !in {
			gi = -1
			outside = append(outside, e)
		}
		state := e.health.load()
		r, detail := p.decide(e, state, gi)
		decided[e] = decision{state, r, detail}
	}
	out := make([]Candidate, 0, records+len(outside))
	add := func(e *entry, gi int) {
		d := decided[e]
		c := Candidate{Peer: e.id, GroupIndex: gi, Score: e.score, Rated: e.rated, State: d.state, Reason: d.reason, Detail: d.detail}
		if gi >= 0 {
			c.Group = tv.groups[gi].label
			c.Default = p.lb != nil && gi >= len(p.lb.Order)
		}
		out = append(out, c)
	}
	for gi := range tv.groups {
		for _, e := range tv.groups[gi].members {
			add(e, gi)
		}
	}
	slices.SortFunc(outside, func(a, b *entry) int { return cmp.Compare(a.idx, b.idx) })
	for _, e := range outside {
		add(e, -1)
	}
	return out
}

// decide says whether the request may try e, whose liveness state is state
// and whose last group is lastGroup (-1 for none): the per-request stages of
// reason first, then the groups.
func (p *Plan) decide(e *entry, state State, lastGroup int) (Reason, string) {
	r := p.reason(e, state)
	switch r {
	case reasonNone:
		// The request's own stages let it through: the groups decide.
	case ReasonLacksLabel:
		for _, l := range p.req.Labels {
			if !e.hasLabel(l) {
				return r, l
			}
		}
		return r, ""
	case ReasonHeadBelow:
		return r, strconv.FormatUint(p.req.MinHead, 10)
	default:
		return r, ""
	}
	if p.lb != nil {
		if lastGroup < 0 {
			return ReasonNotInGroup, ""
		}
		if lastGroup < p.cursor {
			return ReasonPassedOver, ""
		}
	}
	return ReasonSelectable, ""
}

// reason returns why e, whose liveness state is state, may not be tried by
// this request now, or reasonNone. The stages run from what the request asks
// (cheap, certain) to what the network says (liveness), so each candidate is
// counted under the reason an operator can act on first. A request's walk
// (selectable) and the records (decide) both ask it.
func (p *Plan) reason(e *entry, state State) Reason {
	for i := range p.tried {
		if p.tried[i].e.id == e.id {
			return ReasonTried
		}
	}
	for _, l := range p.req.Labels {
		if !e.hasLabel(l) {
			return ReasonLacksLabel
		}
	}
	// Beyond every head all heads are below; the best candidate is asked anyway.
	if p.req.HasMinHead && !p.beyondHead && e.hasHead && e.head < p.req.MinHead {
		return ReasonHeadBelow
	}
	switch state {
	case StateUnreachable:
		return ReasonUnreachable
	case StateProbing:
		return ReasonProbing
	}
	return reasonNone
}
