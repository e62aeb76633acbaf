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
	// ReasonSelectable is no reason to leave the peer out: the request may
	// try it, budget permitting. Candidate records carry it; Explain counts
	// such a peer under ReasonLimit, since the budget is what left it out.
	ReasonSelectable
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
	ReasonSelectable:  "selectable",
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

// Tally counts candidate records by reason, each peer once (a peer in
// several groups has a record in each, all with the same reason). It is the
// explanation of a plan view: a candidate the request may try counts as
// ReasonSelectable.
func Tally(workType string, cs []Candidate) Explanation {
	x := Explanation{WorkType: workType}
	seen := make(map[string]struct{}, len(cs))
	for _, c := range cs {
		if _, ok := seen[c.Peer]; ok {
			continue
		}
		seen[c.Peer] = struct{}{}
		x.Candidates++
		x.Add(c.Reason, c.Detail, 1)
	}
	return x
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

// Explain says why the plan has nothing (more) to offer: every candidate
// counted once, under the reason its records carry, and the ones the
// request could still try under the limit that stopped it.
func (p *Plan) Explain() Explanation {
	p.mu.Lock()
	cs := p.candidatesLocked()
	limit := p.limitHit
	p.mu.Unlock()
	x := Tally(p.req.WorkType, cs)
	if limit == "" {
		limit = "budget"
	}
	for i, c := range x.Counts {
		if c.Reason == ReasonSelectable {
			x.Counts = slices.Delete(x.Counts, i, i+1)
			x.Add(ReasonLimit, limit, c.N)
			break
		}
	}
	return x
}
