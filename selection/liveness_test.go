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

// report feeds a sequence of poll results ("f" fail, "s" succeed).
func report(l *Liveness, id, seq string) {
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
