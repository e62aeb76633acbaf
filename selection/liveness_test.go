package selection

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
)

func newLiveness(t *testing.T, failures, successes int) (*Liveness, *testkit.FakeClock) {
	t.Helper()
	clk := testkit.NewFakeClock()
	l, err := NewLiveness(config.LivenessConfig{
		PollInterval:         time.Second,
		PollFailureThreshold: failures,
		PollSuccessThreshold: successes,
		RedialBackoffMin:     time.Second,
		RedialBackoffMax:     8 * time.Second,
	}, clk)
	if err != nil {
		t.Fatal(err)
	}
	return l, clk
}

// report feeds a sequence of poll results ("f" fail, "s" succeed) for a
// peer it makes known first, as SetPeers does.
func report(l *Liveness, id, seq string) {
	l.handles([]string{id})
	for _, c := range seq {
		l.Report(id, c == 's')
	}
}

func TestLiveness_DecayingCounterEjectsGreyFailure(t *testing.T) {
	l, _ := newLiveness(t, 3, 0)
	report(l, "grey", "ffsff")
	if got := l.State("grey"); got != StateUnreachable {
		t.Fatalf("fail, fail, succeed, fail, fail with threshold 3: state %s, want unreachable (a success takes one away, it does not reset)", got)
	}
	// A peer that fails rarely stays alive: the counter never climbs.
	report(l, "ok", "fsfsfsfsfs")
	if got := l.State("ok"); got != StateAlive {
		t.Fatalf("alternating failures with threshold 3: state %s, want alive", got)
	}
	if n := l.Failures("ok"); n != 0 {
		t.Fatalf("failures = %d, want 0 (never below zero)", n)
	}
}

func TestLiveness_SuccessThresholdBeforeAlive(t *testing.T) {
	l, _ := newLiveness(t, 1, 3)
	report(l, "p", "f")
	if got := l.State("p"); got != StateUnreachable {
		t.Fatalf("state %s, want unreachable", got)
	}
	report(l, "p", "s") // the redial succeeds
	if got := l.State("p"); got != StateProbing {
		t.Fatalf("after a good redial: state %s, want probing", got)
	}
	report(l, "p", "ss")
	if got := l.State("p"); got != StateProbing {
		t.Fatalf("after 2 of 3 good polls: state %s, want probing", got)
	}
	report(l, "p", "s")
	if got := l.State("p"); got != StateAlive {
		t.Fatalf("after 3 good polls in a row: state %s, want alive", got)
	}

	// Without a success threshold a good redial is enough.
	l0, _ := newLiveness(t, 1, 0)
	report(l0, "p", "fs")
	if got := l0.State("p"); got != StateAlive {
		t.Fatalf("threshold 0: state %s, want alive after one good redial", got)
	}
}

func TestLiveness_FailureWhileProbingRedials(t *testing.T) {
	l, clk := newLiveness(t, 1, 3)
	report(l, "p", "fsss") // unreachable, probing, 2 of 3
	if got := l.State("p"); got != StateProbing {
		t.Fatalf("state %s, want probing", got)
	}
	report(l, "p", "f")
	if got := l.State("p"); got != StateUnreachable {
		t.Fatalf("a failure while probing: state %s, want unreachable (back to redialing)", got)
	}
	// It is redialed after a backoff, not at once.
	if due := l.Due(); len(due) != 0 {
		t.Fatalf("due right after the failure: %v, want none until the backoff passes", due)
	}
	clk.Advance(2 * time.Second)
	if due := l.Due(); len(due) != 1 || due[0] != "p" {
		t.Fatalf("due after the backoff: %v, want [p]", due)
	}
	// And it starts probing from zero: three more good polls are needed.
	report(l, "p", "sss")
	if got := l.State("p"); got != StateProbing {
		t.Fatalf("after redial and 2 polls: state %s, want probing (count restarted)", got)
	}
	report(l, "p", "s")
	if got := l.State("p"); got != StateAlive {
		t.Fatalf("state %s, want alive", got)
	}
}

func TestLiveness_RedialBackoffDoubles(t *testing.T) {
	l, clk := newLiveness(t, 1, 0)
	report(l, "p", "f")
	for _, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second} {
		clk.Advance(wait - time.Millisecond)
		if due := l.Due(); len(due) != 0 {
			t.Fatalf("due %v before the %s backoff passed", due, wait)
		}
		clk.Advance(time.Millisecond)
		if due := l.Due(); len(due) != 1 {
			t.Fatalf("not due after the %s backoff", wait)
		}
		report(l, "p", "f")
	}
}

func TestLiveness_TransitionMatrix(t *testing.T) {
	// Every state has a name: a state added without one fails here.
	for _, s := range States() {
		if strings.HasPrefix(s.String(), "state(") {
			t.Fatalf("state %d has no name", int(s))
		}
	}
	// The design's transitions: alive <-> unreachable, unreachable ->
	// probing -> alive, probing -> unreachable on any failure, and
	// unreachable -> alive only without a success threshold.
	wantAllowed := map[[2]State]bool{
		{StateAlive, StateUnreachable}:   true,
		{StateUnreachable, StateProbing}: true,
		{StateUnreachable, StateAlive}:   true,
		{StateProbing, StateAlive}:       true,
		{StateProbing, StateUnreachable}: true,
	}
	// Reach each source state through real reports.
	reach := map[State]string{StateAlive: "", StateUnreachable: "f", StateProbing: "fs"}
	if len(reach) != int(numStates) {
		t.Fatalf("the matrix covers %d states, there are %d", len(reach), numStates)
	}
	for _, from := range States() {
		for _, to := range States() {
			l, _ := newLiveness(t, 1, 2)
			report(l, "p", reach[from])
			if got := l.State("p"); got != from {
				t.Fatalf("setup: state %s, want %s", got, from)
			}
			allowed := slices.Contains(allowedFrom[to], from)
			if allowed != wantAllowed[[2]State{from, to}] {
				t.Errorf("table: %s -> %s allowed %v, the liveness design says %v", from, to, allowed, !allowed)
			}
			err := l.setState("p", to)
			switch {
			case allowed && err != nil:
				t.Errorf("%s -> %s is allowed but refused: %v", from, to, err)
			case allowed && l.State("p") != to:
				t.Errorf("%s -> %s allowed, state is %s", from, to, l.State("p"))
			case !allowed && !errors.Is(err, ErrTransition):
				t.Errorf("%s -> %s is not allowed but err = %v", from, to, err)
			case !allowed && l.State("p") != from:
				t.Errorf("%s -> %s refused but state changed to %s", from, to, l.State("p"))
			}
		}
	}
}

func TestLiveness_PollIntervalGuard(t *testing.T) {
	_, err := NewLiveness(config.LivenessConfig{PollFailureThreshold: 5, PollSuccessThreshold: 2}, nil)
	if err == nil {
		t.Fatal("poll-success-threshold 2 with poll-interval 0 must be refused")
	}
}

func TestLiveness_UnreachableNotSelected(t *testing.T) {
	cfg := testConfig()
	cfg.Liveness.PollFailureThreshold = 2
	s, _ := newSelector(t, cfg, peer("a"), peer("b"))
	s.Liveness().Report("a", false)
	if pk := mustNext(t, s.Plan(Request{WorkType: "sha256"})); pk.Peer != "a" {
		t.Fatalf("one failure below the threshold: got %s, want a", pk.Peer)
	}
	s.Liveness().Report("a", false)
	// No refresh: the state is read live by the request.
	p := s.Plan(Request{WorkType: "sha256"})
	if pk := mustNext(t, p); pk.Peer != "b" {
		t.Fatalf("a is unreachable: got %s, want b", pk.Peer)
	}
	// Dispatch outcomes that could not reach a peer count as failures too.
	p.Report(Pick{Peer: "b"}, Unreachable, 0)
	p2 := s.Plan(Request{WorkType: "sha256"})
	p2.Report(mustNext(t, p2), Unreachable, 0)
	if got := s.Liveness().State("b"); got != StateUnreachable {
		t.Fatalf("two unreachable attempts: state %s, want unreachable", got)
	}
}

// The first polls of new peers are spread over one poll-interval, and two
// nodes (two seeds) poll the same newcomer at different moments: nodes that
// learn of a peer together do not all dial it at once.
func TestLiveness_FirstPollsSpreadOverAnInterval(t *testing.T) {
	const n = 200
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("peer-%d", i)
	}
	firstDue := func(seed uint64) map[string]int {
		l, clk := newLiveness(t, 3, 0)
		l.seed = seed
		l.handles(ids)
		at := map[string]int{} // the 100ms step in which each peer fell due
		for step := range 11 {
			for _, id := range l.Due() {
				if _, ok := at[id]; !ok {
					at[id] = step
				}
			}
			clk.Advance(100 * time.Millisecond)
		}
		return at
	}
	a, b := firstDue(1), firstDue(2)
	if len(a) != n {
		t.Fatalf("%d of %d new peers fell due within one poll-interval", len(a), n)
	}
	perStep := make([]int, 11)
	for _, s := range a {
		perStep[s]++
	}
	for s := 1; s <= 10; s++ {
		// A peer falls due at the first step at or after its offset.
		// Spread evenly, each 100ms step holds about 20; far from it
		// means they are bunched.
		if perStep[s] < 5 || perStep[s] > 45 {
			t.Fatalf("first polls per 100ms step of the interval: %v; want them spread", perStep)
		}
	}
	same := 0
	for _, id := range ids {
		if a[id] == b[id] {
			same++
		}
	}
	if same > n/4 {
		t.Fatalf("two seeds put %d of %d first polls in the same 100ms step", same, n)
	}
}

// An entry removed (its peer expired from the table) stays removed: a poll
// that was in flight when it went, reported after, does not bring it back,
// and nothing polls or redials it again. A poll due for an earlier entry
// does not count against a new one of the same peer either.
func TestLiveness_RemovedEntryStaysRemoved(t *testing.T) {
	l, clk := newLiveness(t, 1, 0)
	l.handles([]string{"gone", "kept"})
	clk.Advance(time.Second)
	due := l.DuePolls()
	if len(due) != 2 {
		t.Fatalf("due %v, want both peers", due)
	}
	l.retain(map[string]struct{}{"kept": {}}) // "gone" expired while its poll ran
	for _, p := range due {
		l.ReportPoll(p, false) // the in-flight polls end, failed
	}
	l.Report("gone", false) // an attempt that could not reach it ends too
	if c := l.Counts(); c[StateUnreachable] != 1 || c[StateAlive]+c[StateProbing] != 0 {
		t.Fatalf("counts %v after the removal, want only kept (unreachable)", c)
	}
	for range 90 {
		clk.Advance(time.Second)
		for _, id := range l.Due() {
			if id == "gone" {
				t.Fatalf("the removed peer is due again at %s", clk.Now())
			}
		}
	}
	// Learned again: a new entry, which the old poll's report does not touch.
	var old Poll
	for _, p := range due {
		if p.Peer == "gone" {
			old = p
		}
	}
	l.handles([]string{"gone", "kept"})
	if _, changed := l.ReportPoll(old, false); changed || l.State("gone") != StateAlive || l.Failures("gone") != 0 {
		t.Fatalf("a poll due for the removed entry changed the new one: state %s, failures %d", l.State("gone"), l.Failures("gone"))
	}
}

// Under AwaitFirstPoll a new peer is not alive before its first good poll:
// it is probing, with the reason "not polled yet", and that poll falls due
// within a quarter of the poll-interval. A good first poll makes it alive at
// once; failed ones count as an alive peer's do, and at
// poll-failure-threshold of them it is unreachable.
func TestLiveness_NewPeerNotAliveBeforeFirstPoll(t *testing.T) {
	l, clk := newLiveness(t, 3, 2)
	l.AwaitFirstPoll()
	l.handles([]string{"good", "bad"})
	for _, id := range []string{"good", "bad"} {
		if got := l.State(id); got != StateProbing {
			t.Fatalf("new peer %s: state %s before any poll, want probing", id, got)
		}
		if got := l.Reason(id); got != reasonFirstPoll {
			t.Fatalf("new peer %s: reason %q, want %q", id, got, reasonFirstPoll)
		}
	}
	clk.Advance(250 * time.Millisecond) // a quarter of the 1s interval
	due := l.DuePolls()
	if len(due) != 2 {
		t.Fatalf("due %v a quarter interval after they were learned, want both", due)
	}
	for _, p := range due {
		tr, changed := l.ReportPoll(p, p.Peer == "good")
		if p.Peer == "good" && (!changed || !tr.First || tr.From != StateProbing) {
			t.Fatalf("first good poll: transition %+v (changed %v), want probing -> alive marked First", tr, changed)
		}
	}
	if got := l.State("good"); got != StateAlive {
		t.Fatalf("after its first good poll: state %s, want alive", got)
	}
	if got, r := l.State("bad"), l.Reason("bad"); got != StateProbing || r != "not polled yet: 1 of 3 polls failed" {
		t.Fatalf("after its first poll failed: state %s (%q), want probing, not polled yet", got, r)
	}
	report(l, "bad", "ff")
	if got, r := l.State("bad"), l.Reason("bad"); got != StateUnreachable || r != "its first 3 polls failed" {
		t.Fatalf("after its first 3 polls failed: state %s (%q), want unreachable", got, r)
	}

	// Without polling nothing would answer: new peers are alive at once.
	off, err := NewLiveness(config.LivenessConfig{PollFailureThreshold: 1}, testkit.NewFakeClock())
	if err != nil {
		t.Fatal(err)
	}
	off.AwaitFirstPoll()
	off.handles([]string{"p"})
	if got := off.State("p"); got != StateAlive {
		t.Fatalf("polling off: state %s, want alive", got)
	}
}

// A peer that accepts work and never answers is cordoned at
// stall-threshold stalls whatever its pings say, with the reason; polls
// take no stall away, answers do; a peer back from its cordon that stalls
// again is cordoned at the first stall, for twice as long.
func TestLiveness_StallCordons(t *testing.T) {
	clk := testkit.NewFakeClock()
	l, err := NewLiveness(config.LivenessConfig{
		PollInterval: time.Second, PollFailureThreshold: 3, PollSuccessThreshold: 2,
		RedialBackoffMin: time.Second, RedialBackoffMax: 8 * time.Second,
		StallThreshold: 2, StallCordon: 10 * time.Second,
	}, clk)
	if err != nil {
		t.Fatal(err)
	}
	l.handles([]string{"staller", "honest"})
	// The honest one times out now and then but answers in between.
	for range 5 {
		l.ReportStall("honest")
		l.ReportAnswer("honest")
	}
	if got := l.State("honest"); got != StateAlive {
		t.Fatalf("honest peer with answers between its stalls: %s, want alive", got)
	}
	l.ReportStall("staller")
	report(l, "staller", "sss") // its pings are fine
	if got := l.State("staller"); got != StateAlive || l.Strikes("staller") != 1 {
		t.Fatalf("one stall: state %s strikes %d, want alive with 1", got, l.Strikes("staller"))
	}
	if _, changed := l.ReportStall("staller"); !changed || l.State("staller") != StateUnreachable {
		t.Fatalf("two stalls: state %s, want unreachable", l.State("staller"))
	}
	if r := l.Reason("staller"); !strings.HasPrefix(r, "stalled:") {
		t.Fatalf("reason %q, want it to say stalled", r)
	}
	cordonedFor := func() time.Duration {
		t.Helper()
		start := clk.Now()
		for range 1000 {
			if slices.Contains(l.Due(), "staller") {
				return clk.Now().Sub(start)
			}
			clk.Advance(100 * time.Millisecond)
		}
		t.Fatal("never due again")
		return 0
	}
	if d := cordonedFor(); d != 10*time.Second {
		t.Fatalf("first cordon %s, want 10s", d)
	}
	report(l, "staller", "sss") // redialed, probed, alive again
	if got := l.State("staller"); got != StateAlive {
		t.Fatalf("after the cordon and good polls: %s, want alive", got)
	}
	l.ReportStall("staller")
	if got := l.State("staller"); got != StateUnreachable {
		t.Fatalf("one more stall after the cordon: %s, want unreachable", got)
	}
	if d := cordonedFor(); d != 20*time.Second {
		t.Fatalf("second cordon %s, want 20s", d)
	}
	report(l, "staller", "sss")
	l.ReportAnswer("staller") // it answers work again: forgiven
	if n := l.Strikes("staller"); n != 0 {
		t.Fatalf("strikes %d after an answer, want 0", n)
	}
}

// A cordon lasts its whole stall-cordon: the stalled peer's pings are
// fine (that is what a stall is), so neither a poll that was in flight
// when it was cordoned, nor one news asked for, nor a failed redial ends
// it sooner; nor do answers to work sent before it, arriving during it,
// make the next cordon the shortest again.
func TestLiveness_CordonIsNotCutShortByPolls(t *testing.T) {
	clk := testkit.NewFakeClock()
	l, err := NewLiveness(config.LivenessConfig{
		PollInterval: time.Second, PollFailureThreshold: 3, PollSuccessThreshold: 2,
		RedialBackoffMin: time.Second, RedialBackoffMax: 8 * time.Second,
		StallThreshold: 1, StallCordon: 10 * time.Second,
	}, clk)
	if err != nil {
		t.Fatal(err)
	}
	l.handles([]string{"staller"})
	l.Report("staller", true)
	inFlight, _ := l.PollFor("staller")
	l.ReportStall("staller")
	start := clk.Now()
	l.ReportPoll(inFlight, true) // sent before the cordon, answered after
	news, _ := l.ProbeFor("staller")
	l.ReportPoll(news, true)
	l.Report("staller", false) // a redial that failed: no earlier redial
	l.ReportAnswer("staller")  // work sent before the cordon, answered late
	for clk.Now().Sub(start) < 10*time.Second {
		if got := l.State("staller"); got != StateUnreachable {
			t.Fatalf("%s into a 10s cordon: %s, want unreachable", clk.Now().Sub(start), got)
		}
		if slices.Contains(l.Due(), "staller") {
			t.Fatalf("due for a redial %s into a 10s cordon", clk.Now().Sub(start))
		}
		l.Report("staller", true)
		clk.Advance(500 * time.Millisecond)
	}
	report(l, "staller", "sss")
	if got := l.State("staller"); got != StateAlive {
		t.Fatalf("after the cordon and good polls: %s, want alive", got)
	}
	l.ReportStall("staller")
	start = clk.Now()
	for clk.Now().Sub(start) < 20*time.Second {
		l.Report("staller", true)
		if got := l.State("staller"); got != StateUnreachable {
			t.Fatalf("%s into the second cordon (20s, doubled): %s, want unreachable", clk.Now().Sub(start), got)
		}
		clk.Advance(time.Second)
	}
}

// TestLiveness_ProbingPeerPolledSooner: a peer that answers its redial is
// polled again after a quarter of poll-interval, not a whole one, until
// its good polls in a row make it alive; alive again, and while new and
// waiting for its first answer, it is polled every poll-interval.
func TestLiveness_ProbingPeerPolledSooner(t *testing.T) {
	l, clk := newLiveness(t, 1, 2) // poll-interval 1s
	report(l, "p", "f")
	if got := l.State("p"); got != StateUnreachable {
		t.Fatalf("state %s, want unreachable", got)
	}
	report(l, "p", "s") // the redial answers
	if got := l.State("p"); got != StateProbing {
		t.Fatalf("after a good redial: state %s, want probing", got)
	}
	due := func() bool { return slices.Contains(l.Due(), "p") }
	clk.Advance(249 * time.Millisecond)
	if due() {
		t.Fatal("probing peer due before a quarter of poll-interval")
	}
	for i := range 2 {
		clk.Advance(time.Millisecond)
		if !due() {
			t.Fatalf("probing peer not due a quarter of poll-interval after good poll %d", i)
		}
		report(l, "p", "s")
		clk.Advance(249 * time.Millisecond)
	}
	if got := l.State("p"); got != StateAlive {
		t.Fatalf("after 2 good polls: state %s, want alive", got)
	}
	clk.Advance(700 * time.Millisecond) // 949ms after the last poll
	if due() {
		t.Fatal("alive peer due before poll-interval")
	}
	clk.Advance(51 * time.Millisecond)
	if !due() {
		t.Fatal("alive peer not due after poll-interval")
	}
}

// TestLiveness_FirstPollsFailed: a new peer awaits its first poll; once a
// poll of it failed it is news-worthy (FirstPollsFailed), until one
// answers and it is alive.
func TestLiveness_FirstPollsFailed(t *testing.T) {
	l, _ := newLiveness(t, 5, 2)
	l.AwaitFirstPoll()
	report(l, "p", "")
	if !l.AwaitsFirstPoll("p") || l.FirstPollsFailed("p") || l.CountFirstPollsFailed() != 0 {
		t.Fatalf("new peer: awaits %v, failed %v, count %d; want true, false, 0", l.AwaitsFirstPoll("p"), l.FirstPollsFailed("p"), l.CountFirstPollsFailed())
	}
	report(l, "p", "f")
	if !l.FirstPollsFailed("p") || l.CountFirstPollsFailed() != 1 {
		t.Fatalf("after a failed first poll: failed %v, count %d; want true, 1", l.FirstPollsFailed("p"), l.CountFirstPollsFailed())
	}
	report(l, "p", "s")
	if got := l.State("p"); got != StateAlive || l.AwaitsFirstPoll("p") || l.FirstPollsFailed("p") || l.CountFirstPollsFailed() != 0 {
		t.Fatalf("after its first good poll: state %s, awaits %v, failed %v", got, l.AwaitsFirstPoll("p"), l.FirstPollsFailed("p"))
	}
}

// TestLiveness_FailedNewsProbeCountsNothing: a probe news asked for
// (ProbeFor) that fails counts nothing against a new peer; its scheduled
// polls do, and a good probe makes it alive.
func TestLiveness_FailedNewsProbeCountsNothing(t *testing.T) {
	l, _ := newLiveness(t, 2, 2)
	l.AwaitFirstPoll()
	report(l, "p", "")
	for range 3 {
		pr, ok := l.ProbeFor("p")
		if !ok {
			t.Fatal("ProbeFor: peer not known")
		}
		l.ReportPoll(pr, false)
	}
	if got := l.State("p"); got != StateProbing || l.FirstPollsFailed("p") {
		t.Fatalf("after 3 failed news probes: state %s, failed %v; want probing, false", got, l.FirstPollsFailed("p"))
	}
	pl, _ := l.PollFor("p")
	l.ReportPoll(pl, false)
	if !l.FirstPollsFailed("p") {
		t.Fatal("a failed scheduled poll did not count")
	}
	pr, _ := l.ProbeFor("p")
	if tr, changed := l.ReportPoll(pr, true); !changed || tr.To != StateAlive {
		t.Fatalf("a good news probe: %+v, %v; want alive", tr, changed)
	}
}

// With more alive peers than poll-budget, each alive peer is polled that
// much less often, so that a poll-interval holds poll-budget polls of
// alive peers; with no more alive than the budget, every poll-interval.
func TestLiveness_PollBudgetSpreadsAlivePolls(t *testing.T) {
	clk := testkit.NewFakeClock()
	l, err := NewLiveness(config.LivenessConfig{
		PollInterval: time.Second, PollFailureThreshold: 1, PollSuccessThreshold: 1,
		RedialBackoffMin: time.Second, RedialBackoffMax: 8 * time.Second, PollBudget: 4,
	}, clk)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	l.handles(ids)
	for _, id := range ids {
		l.Report(id, true) // polled now
	}
	clk.Advance(time.Second)
	if due := l.Due(); len(due) != 0 {
		t.Fatalf("8 alive with poll-budget 4, one poll-interval on: due %v, want none (every 2s)", due)
	}
	clk.Advance(time.Second)
	if due := l.Due(); len(due) != len(ids) {
		t.Fatalf("two poll-intervals on: due %v, want all 8", due)
	}
	for _, id := range ids {
		l.Report(id, true)
	}
	// Four unreachable leave four alive: the budget holds them all again,
	// and the unreachable ones are redialed at their backoff.
	for _, id := range ids[4:] {
		l.Report(id, false)
	}
	clk.Advance(time.Second)
	if due := l.Due(); !slices.Equal(due, ids) {
		t.Fatalf("4 alive, 4 unreachable, one poll-interval on: due %v, want all (alive every 1s, redials after 1s)", due)
	}
}
