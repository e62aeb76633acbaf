package selection

import (
	"testing"
	"time"
)

func TestBeyondHead_EmptyIsFinal(t *testing.T) {
	cfg := testConfig()
	cfg.Worker.MaxRetries = 5
	cfg.Hedge.MaxCount = 1
	cfg.LabelBalancing = labelBalancing(false, true, "primary", "fallback")
	s, _ := newSelector(t, cfg,
		headPeer("p1", 100, "primary"), headPeer("p2", 100, "primary"),
		headPeer("b1", 99, "fallback"), headPeer("b2", 100, "fallback"))
	p := s.Plan(Request{WorkType: "block", MinHead: 101, HasMinHead: true, Idempotent: true})
	if !p.BeyondHead() || p.FallbackAllowed() {
		t.Fatalf("head+1: BeyondHead %v FallbackAllowed %v, want true, false", p.BeyondHead(), p.FallbackAllowed())
	}
	first := mustNext(t, p)
	if first.Peer != "p1" {
		t.Fatalf("beyond head asks the best candidate: got %s, want p1", first.Peer)
	}
	if h, ok := p.Hedge(); ok {
		t.Fatalf("beyond head must not hedge, got %s", h.Peer)
	}
	if v := p.Report(first, Empty, time.Millisecond); v != Done {
		t.Fatalf("empty beyond every head: verdict %s, want done", v)
	}
	if pk, ok := p.Next(); ok {
		t.Fatalf("after the final empty answer Next offered %s", pk.Peer)
	}
	// An error beyond the head does not start a sweep either.
	p = s.Plan(Request{WorkType: "block", MinHead: 101, HasMinHead: true})
	if v := p.Report(mustNext(t, p), RetryableError, time.Millisecond); v != Exhausted {
		t.Fatalf("error beyond head: verdict %s, want exhausted", v)
	}
	if pk, ok := p.Next(); ok {
		t.Fatalf("beyond head: a second peer %s was offered", pk.Peer)
	}

	// Unknown heads fail open: one peer without a head and the rule is off.
	s2, _ := newSelector(t, cfg, headPeer("p1", 100, "primary"),
		Peer{ID: "p2", Labels: []string{"primary"}, Types: []TypeInfo{{Name: "block"}}})
	p = s2.Plan(Request{WorkType: "block", MinHead: 101, HasMinHead: true})
	if p.BeyondHead() {
		t.Fatal("a candidate with an unknown head must make the rule fail open")
	}
	got := walk(t, p, Empty)
	if want := []string{"p2"}; !eq(got, want) {
		t.Fatalf("fail open: got %v, want %v (p1's head 100 is below 101)", got, want)
	}
}

func TestAtHead_EmptyIsMiss(t *testing.T) {
	cfg := testConfig()
	cfg.Worker.MaxRetries = 5
	cfg.LabelBalancing = labelBalancing(false, true, "primary", "fallback")
	s, _ := newSelector(t, cfg,
		headPeer("p1", 100, "primary"), headPeer("p2", 100, "primary"),
		headPeer("b1", 100, "fallback"), headPeer("b2", 90, "fallback"))
	p := s.Plan(Request{WorkType: "block", MinHead: 100, HasMinHead: true})
	if p.BeyondHead() || !p.FallbackAllowed() {
		t.Fatal("at the head the rule must not apply")
	}
	got := walk(t, p, Empty)
	if want := []string{"p1", "p2", "b1"}; !eq(got, want) {
		t.Fatalf("empty at the head is a miss: got %v, want %v (b2's head 90 is below 100)", got, want)
	}
	x := p.Explain()
	if x.N(ReasonHeadBelow) != 1 || x.N(ReasonTried) != 3 {
		t.Fatalf("explanation %q: want 1 head below, 3 tried", x)
	}
	// The fallback group serves it: the request ends there.
	p = s.Plan(Request{WorkType: "block", MinHead: 100, HasMinHead: true})
	for _, want := range []string{"p1", "p2", "b1"} {
		pk := mustNext(t, p)
		if pk.Peer != want {
			t.Fatalf("got %s, want %s", pk.Peer, want)
		}
		o := Empty
		if want == "b1" {
			o = Success
		}
		if v := p.Report(pk, o, time.Millisecond); (v == Done) != (want == "b1") {
			t.Fatalf("%s: verdict %s", want, v)
		}
	}
}
