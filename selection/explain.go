package selection

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Reason says why a candidate was not offered to a request. Reasons are
// ordered from the most to the least useful to an operator.
type Reason uint8

const (
	reasonNone Reason = iota
	// ReasonUnreachable: liveness marked the peer unreachable.
	ReasonUnreachable
	// ReasonProbing: the peer is back but has not answered enough polls yet.
	ReasonProbing
	// ReasonHeadBelow: the peer's head is below the position asked for.
	ReasonHeadBelow
	// ReasonLacksLabel: the peer lacks a label the request requires.
	ReasonLacksLabel
	// ReasonNotInGroup: label balancing is on, include-default is false and
	// the peer carries none of the order's labels.
	ReasonNotInGroup
	// ReasonPassedOver: pass-on-error moved the request past the peer's groups.
	ReasonPassedOver
	// ReasonTried: the request already tried the peer.
	ReasonTried
	// ReasonLimit: the peer was selectable but the request's budget was spent.
	ReasonLimit
	// ReasonOther: a reason given from outside the core (the peer table's).
	ReasonOther
	numReasons
)

var reasonNames = [numReasons]string{
	ReasonUnreachable: "unreachable",
	ReasonProbing:     "probing",
	ReasonHeadBelow:   "head below",
	ReasonLacksLabel:  "lacks label",
	ReasonNotInGroup:  "not in any group",
	ReasonPassedOver:  "passed over by pass-on-error",
	ReasonTried:       "already tried",
	ReasonLimit:       "not tried",
	ReasonOther:       "other",
}

// String returns the reason's short name.
func (r Reason) String() string {
	if r > reasonNone && r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Count is the number of candidates left out for one reason.
type Count struct {
	Reason Reason
	// Detail completes the reason: the missing label, the head asked for,
	// the limit that was reached.
	Detail string
	N      int
}

// String renders the count as in "2 unreachable" or "1 lacks label archive".
func (c Count) String() string {
	switch c.Reason {
	case ReasonHeadBelow:
		return fmt.Sprintf("%d with head below %s", c.N, c.Detail)
	case ReasonNotInGroup:
		return fmt.Sprintf("%d carry no label of the order (include-default is false)", c.N)
	case ReasonLimit:
		return fmt.Sprintf("%d not tried (%s)", c.N, c.Detail)
	case ReasonOther:
		return fmt.Sprintf("%d %s", c.N, c.Detail)
	}
	if c.Detail != "" {
		return fmt.Sprintf("%d %s %s", c.N, c.Reason, c.Detail)
	}
	return fmt.Sprintf("%d %s", c.N, c.Reason)
}

// Explanation says why a plan has no peer left to offer: every candidate of
// the work type counted once, under the first reason that excluded it.
type Explanation struct {
	WorkType   string
	Candidates int
	Counts     []Count
}

// Add counts n candidates left out for a reason found outside the core, such
// as the peer table's "stale record".
func (x *Explanation) Add(r Reason, detail string, n int) {
	if n <= 0 {
		return
	}
	for i := range x.Counts {
		if x.Counts[i].Reason == r && x.Counts[i].Detail == detail {
			x.Counts[i].N += n
			return
		}
	}
	x.Counts = append(x.Counts, Count{Reason: r, Detail: detail, N: n})
	x.sort()
}

// N returns the count for a reason, over all details.
func (x Explanation) N(r Reason) int {
	n := 0
	for _, c := range x.Counts {
		if c.Reason == r {
			n += c.N
		}
	}
	return n
}

func (x *Explanation) sort() {
	slices.SortStableFunc(x.Counts, func(a, b Count) int {
		if c := cmp.Compare(a.Reason, b.Reason); c != 0 {
			return c
		}
		return cmp.Compare(a.Detail, b.Detail)
	})
}

// String renders the explanation, e.g. "6 candidates for work type sha256:
// 2 unreachable, 1 lacks label archive, 3 already tried".
func (x Explanation) String() string {
	if x.Candidates == 0 && len(x.Counts) == 0 {
		return fmt.Sprintf("no peer advertises work type %s", x.WorkType)
	}
	parts := make([]string, len(x.Counts))
	for i, c := range x.Counts {
		parts[i] = c.String()
	}
	noun := "candidates"
	if x.Candidates == 1 {
		noun = "candidate"
	}
	return fmt.Sprintf("%d %s for work type %s: %s", x.Candidates, noun, x.WorkType, strings.Join(parts, ", "))
}

// reason returns why e may not be tried by this request now, or reasonNone.
// The stages run from what the request asks (cheap, certain) to what the
// network says (liveness), so each candidate is counted under the reason an
// operator can act on first.
func (p *Plan) reason(e *entry) Reason {
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
	switch e.health.load() {
	case StateUnreachable:
		return ReasonUnreachable
	case StateProbing:
		return ReasonProbing
	}
	return reasonNone
}

// Explain says why the plan has nothing (more) to offer.
func (p *Plan) Explain() Explanation {
	p.mu.Lock()
	defer p.mu.Unlock()
	x := Explanation{WorkType: p.req.WorkType}
	if p.view == nil {
		return x
	}
	x.Candidates = len(p.view.all)
	for _, e := range p.view.all {
		r := p.reason(e)
		detail := ""
		switch r {
		case ReasonLacksLabel:
			for _, l := range p.req.Labels {
				if !e.hasLabel(l) {
					detail = l
					break
				}
			}
		case ReasonHeadBelow:
			detail = fmt.Sprint(p.req.MinHead)
		case reasonNone:
			r, detail = p.groupReason(e)
		}
		x.Add(r, detail, 1)
	}
	return x
}

// groupReason says why a selectable candidate was not offered: the groups,
// the cursor, or the budget.
func (p *Plan) groupReason(e *entry) (Reason, string) {
	if p.lb != nil {
		if !inAnyGroup(e, p.lb) && !p.lb.IncludesDefault() {
			return ReasonNotInGroup, ""
		}
		ahead := false
		for gi := p.cursor; gi < len(p.view.groups); gi++ {
			if slices.Contains(p.view.groups[gi].members, e) {
				ahead = true
				break
			}
		}
		if !ahead {
			return ReasonPassedOver, ""
		}
	}
	limit := p.limitHit
	if limit == "" {
		limit = "budget"
	}
	return ReasonLimit, limit
}
