package selection

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
)

// recordOf returns the first record of id, failing the test when there is none.
func recordOf(t *testing.T, cs []Candidate, id string) Candidate {
	t.Helper()
	for _, c := range cs {
		if c.Peer == id {
			return c
		}
	}
	t.Fatalf("no record of %s in %+v", id, cs)
	return Candidate{}
}

// TestCandidates_Reasons checks the record of one candidate for every
// reason a plan can leave a candidate out for, and for a selectable one.
func TestCandidates_Reasons(t *testing.T) {
	cases := []struct {
		name  string
		lb    *config.LabelBalancingConfig
		peers []Peer
		req   Request
		// setup runs on the selector before the plan is made, act on the
		// plan before its records are read.
		setup      func(*Selector)
		act        func(*testing.T, *Plan)
		peer       string
		want       Reason
		wantDetail string
		wantState  State
	}{
		{name: "selectable", peers: []Peer{peer("x")}, req: Request{WorkType: "sha256"},
			peer: "x", want: ReasonSelectable},
		{name: "unreachable", peers: []Peer{peer("x"), peer("y")}, req: Request{WorkType: "sha256"},
			setup: func(s *Selector) { s.Liveness().Report("x", false) },
			peer:  "x", want: ReasonUnreachable, wantState: StateUnreachable},
		{name: "probing", peers: []Peer{peer("x"), peer("y")}, req: Request{WorkType: "sha256"},
			setup: func(s *Selector) { s.Liveness().Report("x", false); s.Liveness().Report("x", true) },
			peer:  "x", want: ReasonProbing, wantState: StateProbing},
		{name: "head below", peers: []Peer{headPeer("x", 90), headPeer("y", 100)},
			req:  Request{WorkType: "block", MinHead: 95, HasMinHead: true},
			peer: "x", want: ReasonHeadBelow, wantDetail: "95"},
		{name: "beyond every head nobody is below", peers: []Peer{headPeer("x", 90), headPeer("y", 100)},
			req:  Request{WorkType: "block", MinHead: 101, HasMinHead: true},
			peer: "x", want: ReasonSelectable},
		{name: "lacks label, the first missing one named", peers: []Peer{peer("x", "full"), peer("y", "archive", "full")},
			req:  Request{WorkType: "sha256", Labels: []string{"full", "archive"}},
			peer: "x", want: ReasonLacksLabel, wantDetail: "archive"},
		{name: "a label before liveness", peers: []Peer{peer("x"), peer("y", "archive")},
			req:   Request{WorkType: "sha256", Labels: []string{"archive"}},
			setup: func(s *Selector) { s.Liveness().Report("x", false) },
			peer:  "x", want: ReasonLacksLabel, wantDetail: "archive", wantState: StateUnreachable},
		{name: "not in any group", lb: labelBalancing(false, false, "full"), peers: []Peer{peer("x"), peer("y", "full")},
			req:  Request{WorkType: "sha256"},
			peer: "x", want: ReasonNotInGroup},
		{name: "in the default group", lb: labelBalancing(false, true, "full"), peers: []Peer{peer("x"), peer("y", "full")},
			req:  Request{WorkType: "sha256"},
			peer: "x", want: ReasonSelectable},
		{name: "passed over by pass-on-error", lb: labelBalancing(true, true, "full"), peers: []Peer{peer("x", "full"), peer("y", "full"), peer("z")},
			req: Request{WorkType: "sha256"},
			act: func(t *testing.T, p *Plan) {
				if v := p.Report(mustNext(t, p), RetryableError, time.Millisecond); v != Retry {
					t.Fatalf("verdict %s, want retry", v)
				}
			},
			peer: "y", want: ReasonPassedOver},
		{name: "already tried", peers: []Peer{peer("x")}, req: Request{WorkType: "sha256"},
			act:  func(t *testing.T, p *Plan) { p.Report(mustNext(t, p), Cancelled, 0) },
			peer: "x", want: ReasonTried},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Liveness.PollFailureThreshold, cfg.Liveness.PollSuccessThreshold = 1, 2
			cfg.LabelBalancing = tc.lb
			s, _ := newSelector(t, cfg, tc.peers...)
			if tc.setup != nil {
				tc.setup(s)
			}
			p := s.Plan(tc.req)
			if tc.act != nil {
				tc.act(t, p)
			}
			c := recordOf(t, p.Candidates(), tc.peer)
			if c.Reason != tc.want || c.Detail != tc.wantDetail || c.State != tc.wantState {
				t.Errorf("record of %s: %s %q (%s), want %s %q (%s)", tc.peer, c.Reason, c.Detail, c.State, tc.want, tc.wantDetail, tc.wantState)
			}
		})
	}
}

// TestCandidates_Layout checks the records' order: groups in order with
// their members as Next walks them, a peer in two groups once in each with
// one reason, then the candidates in no group in ID order.
func TestCandidates_Layout(t *testing.T) {
	cfg := testConfig()
	cfg.Liveness.PollFailureThreshold = 1
	cfg.LabelBalancing = labelBalancing(false, false, "full", "archive")
	s, _ := newSelector(t, cfg, peer("u2"), peer("both", "full", "archive"), peer("f1", "full"), peer("a1", "archive"), peer("u1"))
	s.Liveness().Report("both", false)
	cs := s.Plan(Request{WorkType: "sha256"}).Candidates()
	var got []string
	for _, c := range cs {
		got = append(got, fmt.Sprintf("%s/%s/%d/%s", c.Peer, c.Group, c.GroupIndex, c.Reason))
	}
	want := []string{
		"both/full/0/unreachable", "f1/full/0/selectable",
		"a1/archive/1/selectable", "both/archive/1/unreachable",
		"u1//-1/not in any group", "u2//-1/not in any group",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("records\n got %q\nwant %q", got, want)
	}

	cfg.LabelBalancing = labelBalancing(false, true, "full")
	s, _ = newSelector(t, cfg, peer("f1", "full"), peer("u1"))
	cs = s.Plan(Request{WorkType: "sha256"}).Candidates()
	if len(cs) != 2 || cs[0].Default || !cs[1].Default || cs[1].GroupIndex != 1 || cs[1].Group != "" {
		t.Fatalf("with include-default: %+v, want f1 in full, then u1 in the default group", cs)
	}
	if cs := s.Plan(Request{WorkType: "nope"}).Candidates(); cs != nil {
		t.Fatalf("no candidate of the type: %+v", cs)
	}
}

// TestCandidates_AgreeWithNext walks plans of many shapes and checks the
// records against the walk: every pick Next returns was reported
// selectable just before, and every candidate reported selectable is
// picked before Next runs out (the budget here is larger than the peers).
func TestCandidates_AgreeWithNext(t *testing.T) {
	peers := func() []Peer {
		ps := []Peer{
			peer("f1", "full"), peer("f2", "full"), peer("fa", "full", "archive"),
			peer("a1", "archive"), peer("a2", "archive"), peer("u1"), peer("u2"),
		}
		for i := range ps {
			ps[i].Types = append(ps[i].Types, TypeInfo{Name: "block", Head: uint64(90 + 5*i), HasHead: true})
		}
		return ps
	}
	lbs := map[string]*config.LabelBalancingConfig{
		"no groups":                    nil,
		"groups":                       labelBalancing(false, true, "full", "archive"),
		"groups, no default":           labelBalancing(false, false, "full", "archive"),
		"pass-on-error":                labelBalancing(true, true, "full", "archive"),
		"pass-on-error, no default":    labelBalancing(true, false, "archive", "full"),
		"pass-on-error, one group":     labelBalancing(true, false, "full"),
		"pass-on-error, overlap first": labelBalancing(true, true, "archive"),
	}
	reqs := map[string]Request{
		"any":           {WorkType: "sha256"},
		"label":         {WorkType: "sha256", Labels: []string{"archive"}},
		"two labels":    {WorkType: "sha256", Labels: []string{"full", "archive"}},
		"head":          {WorkType: "block", MinHead: 105, HasMinHead: true},
		"beyond head":   {WorkType: "block", MinHead: 1000, HasMinHead: true},
		"label at head": {WorkType: "block", Labels: []string{"full"}, MinHead: 100, HasMinHead: true},
	}
	outcomes := []Outcome{Cancelled, RetryableError, Empty}
	walks := 0
	for _, mode := range []string{config.ModeRating, config.ModeRoundRobin, config.ModeRandom} {
		for lbName, lb := range lbs {
			for reqName, req := range reqs {
				for _, o := range outcomes {
					name := fmt.Sprintf("%s/%s/%s/%s", mode, lbName, reqName, o)
					cfg := testConfig()
					cfg.Selection.Mode = mode
					cfg.Liveness.PollFailureThreshold, cfg.Liveness.PollSuccessThreshold = 1, 2
					cfg.LabelBalancing = lb
					s, _ := newSelector(t, cfg, peers()...)
					s.Liveness().Report("f2", false) // unreachable
					s.Liveness().Report("a2", false) // then probing
					s.Liveness().Report("a2", true)
					checkWalk(t, name, s.Plan(req), o, req.HasMinHead && req.MinHead > 120)
					walks++
				}
			}
		}
	}
	if walks == 0 {
		t.Fatal("no plan walked")
	}
}

// checkWalk walks p, reporting o for every pick, and checks each pick
// against the records made just before it. A beyond-head plan stops after
// one attempt by its budget, so only its first pick is checked.
func checkWalk(t *testing.T, name string, p *Plan, o Outcome, beyondHead bool) {
	t.Helper()
	initial := map[string]Reason{}
	for _, c := range p.Candidates() {
		if r, ok := initial[c.Peer]; ok && r != c.Reason {
			t.Errorf("%s: %s has records with reasons %s and %s", name, c.Peer, r, c.Reason)
		}
		initial[c.Peer] = c.Reason
	}
	picked := map[string]bool{}
	for range 100 {
		selectable, before := map[string]bool{}, map[string]Reason{}
		for _, c := range p.Candidates() {
			before[c.Peer] = c.Reason
			if c.Reason == ReasonSelectable {
				selectable[c.Peer] = true
			}
		}
		pk, ok := p.Next()
		if !ok {
			if len(selectable) > 0 && !beyondHead {
				t.Errorf("%s: Next offers nothing, the records call %v selectable (%s)", name, selectable, p.Explain())
			}
			break
		}
		if !selectable[pk.Peer] {
			t.Errorf("%s: Next offered %s, its record said %s", name, pk.Peer, before[pk.Peer])
		}
		if picked[pk.Peer] {
			t.Errorf("%s: %s offered twice", name, pk.Peer)
		}
		picked[pk.Peer] = true
		if v := p.Report(pk, o, time.Millisecond); v != Retry && o != Cancelled {
			break
		}
	}
	if o != Cancelled || beyondHead {
		return
	}
	// Nothing failed, so nothing moved the cursor: the walk reaches exactly
	// the candidates first reported selectable.
	for id, r := range initial {
		if (r == ReasonSelectable) != picked[id] {
			t.Errorf("%s: %s was first reported %s, picked %t", name, id, r, picked[id])
		}
	}
	if x := p.Explain(); x.N(ReasonTried) != len(picked) {
		t.Errorf("%s: explanation %q, want %d already tried", name, x, len(picked))
	}
}

// TestTally checks that a plan view's counts and a request's explanation
// come from the same records and are phrased by the same sentence.
func TestTally(t *testing.T) {
	cfg := testConfig()
	cfg.Liveness.PollFailureThreshold = 1
	cfg.LabelBalancing = labelBalancing(false, true, "full", "archive")
	s, _ := newSelector(t, cfg, peer("both", "full", "archive"), peer("f1", "full"), peer("n1"), peer("d1", "archive"))
	s.Liveness().Report("d1", false)
	p := s.Plan(Request{WorkType: "sha256", Labels: []string{"archive"}})
	x := Tally("sha256", p.Candidates())
	want := "4 candidates for work type sha256: 1 unreachable, 2 lacks label archive, 1 selectable"
	if got := x.String(); got != want {
		t.Fatalf("tally:\n got %q\nwant %q", got, want)
	}
	// A request's explanation counts the selectable one under the budget.
	want = "4 candidates for work type sha256: 1 unreachable, 2 lacks label archive, 1 not tried (budget)"
	if got := p.Explain().String(); got != want {
		t.Fatalf("explanation:\n got %q\nwant %q", got, want)
	}
	if got := Tally("nope", nil).String(); got != "no peer advertises work type nope" {
		t.Fatalf("no candidates: %q", got)
	}
	one := Tally("sha256", []Candidate{{Peer: "x", Reason: ReasonSelectable}, {Peer: "x", Reason: ReasonSelectable}})
	if got := one.String(); got != "1 candidate for work type sha256: 1 selectable" {
		t.Fatalf("one peer in two groups: %q", got)
	}
}
