package selection

import (
	"strings"
	"testing"
	"time"
)

// Three-tier fixture: full {f1, f2}, archive {a1, a2}, unlabeled {u1}.
func tiers() []Peer {
	return []Peer{peer("f1", "full"), peer("f2", "full"), peer("a1", "archive"), peer("a2", "archive"), peer("u1")}
}

func TestLabelGroups_ExhaustGroupBeforeAdvancing(t *testing.T) {
	cfg := testConfig()
	cfg.LabelBalancing = labelBalancing(false, true, "full", "archive")
	s, _ := newSelector(t, cfg, tiers()...)
	got := walk(t, s.Plan(Request{WorkType: "sha256"}), RetryableError)
	want := []string{"f1", "f2", "a1", "a2", "u1"}
	if !eq(got, want) {
		t.Fatalf("pass-on-error false must retry inside a group before the next: got %v, want %v", got, want)
	}
}

func TestLabelGroups_DeadGroupFallsThrough(t *testing.T) {
	for _, passOnError := range []bool{false, true} {
		cfg := testConfig()
		cfg.Liveness.PollFailureThreshold = 1
		cfg.LabelBalancing = labelBalancing(passOnError, true, "full", "archive")
		s, _ := newSelector(t, cfg, tiers()...)
		s.Liveness().Report("f1", false)
		s.Liveness().Report("f2", false)
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		if pk.Peer != "a1" || pk.Group != "archive" {
			t.Fatalf("pass-on-error %v: a dead group must fall through: got %s in group %q, want a1 in archive", passOnError, pk.Peer, pk.Group)
		}
	}
}

func TestLabelGroups_PassOnErrorJumpsGroup(t *testing.T) {
	cfg := testConfig()
	cfg.LabelBalancing = labelBalancing(true, true, "full", "archive")
	s, _ := newSelector(t, cfg, tiers()...)
	got := walk(t, s.Plan(Request{WorkType: "sha256"}), RetryableError)
	want := []string{"f1", "a1", "u1"}
	if !eq(got, want) {
		t.Fatalf("pass-on-error true must jump to the next group after an error: got %v, want %v", got, want)
	}
	// A success does not move the cursor: nothing to jump from.
	p := s.Plan(Request{WorkType: "sha256"})
	if v := p.Report(mustNext(t, p), Success, time.Millisecond); v != Done {
		t.Fatalf("success verdict = %s, want done", v)
	}
}

func TestLabelGroups_HedgeDoesNotAdvanceCursor(t *testing.T) {
	cfg := testConfig()
	cfg.Hedge.MaxCount = 2
	cfg.LabelBalancing = labelBalancing(true, true, "full", "archive")
	s, _ := newSelector(t, cfg, tiers()...)
	p := s.Plan(Request{WorkType: "sha256", Idempotent: true})

	first := mustNext(t, p)
	hedge, ok := p.Hedge()
	if !ok {
		t.Fatal("Hedge: nothing offered")
	}
	if first.Peer != "f1" || hedge.Peer != "f2" || hedge.Group != "full" {
		t.Fatalf("a hedge is not an error and must stay in the current group: first %s, hedge %s (group %q), want f1 then f2 in full",
			first.Peer, hedge.Peer, hedge.Group)
	}
	// The first attempt fails: pass-on-error moves past "full".
	if v := p.Report(first, RetryableError, time.Millisecond); v != Retry {
		t.Fatalf("verdict = %s, want retry", v)
	}
	// The hedge, from the same group, fails late: the cursor must not move
	// past archive because of it.
	p.Report(hedge, RetryableError, time.Millisecond)
	next := mustNext(t, p)
	if next.Peer != "a1" {
		t.Fatalf("after errors in full, next = %s, want a1 (a late hedge error must not skip archive)", next.Peer)
	}
}

func TestLabelGroups_SelectedOnceAcrossOverlappingGroups(t *testing.T) {
	cfg := testConfig()
	cfg.LabelBalancing = labelBalancing(false, true, "full", "archive")
	s, _ := newSelector(t, cfg, peer("both", "full", "archive"), peer("f1", "full"), peer("a1", "archive"))
	p := s.Plan(Request{WorkType: "sha256", Idempotent: true})
	got := walk(t, p, RetryableError)
	want := []string{"both", "f1", "a1"}
	if !eq(got, want) {
		t.Fatalf("a peer in two groups must be tried once: got %v, want %v", got, want)
	}
	if x := p.Explain(); x.N(ReasonTried) != 3 {
		t.Fatalf("explanation %q: want 3 already tried", x)
	}
}

func TestLabelGroups_IncludeDefaultFalse(t *testing.T) {
	cfg := testConfig()
	cfg.LabelBalancing = labelBalancing(false, false, "full", "archive")
	s, _ := newSelector(t, cfg, tiers()...)
	p := s.Plan(Request{WorkType: "sha256"})
	got := walk(t, p, RetryableError)
	if want := []string{"f1", "f2", "a1", "a2"}; !eq(got, want) {
		t.Fatalf("include-default false must leave unlabeled peers out: got %v, want %v", got, want)
	}
	if x := p.Explain(); x.N(ReasonNotInGroup) != 1 {
		t.Fatalf("explanation %q: want 1 not in any group", x)
	}
	// The same peers with include-default true: u1 is the last group.
	cfg.LabelBalancing = labelBalancing(false, true, "full", "archive")
	s, _ = newSelector(t, cfg, tiers()...)
	if got := walk(t, s.Plan(Request{WorkType: "sha256"}), RetryableError); got[len(got)-1] != "u1" {
		t.Fatalf("include-default true: got %v, want u1 last", got)
	}
}

func TestLabelGroups_SingleGroupPassOnError(t *testing.T) {
	cfg := testConfig()
	cfg.LabelBalancing = labelBalancing(true, false, "full")
	s, _ := newSelector(t, cfg, tiers()...)
	p := s.Plan(Request{WorkType: "sha256"})
	got := walk(t, p, RetryableError)
	if want := []string{"f1"}; !eq(got, want) {
		t.Fatalf("pass-on-error with one group: a retryable error has nowhere to go, got %v, want %v", got, want)
	}
	x := p.Explain()
	if x.N(ReasonPassedOver) != 1 || !strings.Contains(x.String(), "passed over by pass-on-error") {
		t.Fatalf("explanation %q: want f2 counted as passed over by pass-on-error", x)
	}
}
