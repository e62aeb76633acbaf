package selection

import (
	"testing"
	"time"
)

// TestPlan_HoldOffHonoursRetryAfter: a peer that answered busy with a
// Retry-After for a work type is picked for that type only as a last
// resort until the wait has passed (on the selector's clock); its other
// work types are picked as before.
func TestPlan_HoldOffHonoursRetryAfter(t *testing.T) {
	two := func(id string) Peer {
		return Peer{ID: id, Labels: []string{id}, Types: []TypeInfo{{Name: "enrich"}, {Name: "sha256"}}}
	}
	s, clk := newSelector(t, testConfig(), two("a"), two("b"))
	feed(t, s, "a", Success, time.Millisecond, 5)
	feed(t, s, "b", Success, 20*time.Millisecond, 5) // b is the slower
	s.Refresh()
	p := s.Plan(Request{WorkType: "enrich"})
	pk := mustNext(t, p)
	if pk.Peer != "a" {
		t.Fatalf("first pick %s, want a (the better rated)", pk.Peer)
	}
	p.Report(pk, Busy, time.Millisecond)
	p.HoldOff(pk, 2*time.Second)

	if pk := mustNext(t, s.Plan(Request{WorkType: "enrich"})); pk.Peer != "b" {
		t.Fatalf("enrich while a holds off: picked %s, want b", pk.Peer)
	}
	if pk := mustNext(t, s.Plan(Request{WorkType: "sha256"})); pk.Peer != "a" {
		t.Fatalf("sha256 while a holds off enrich: picked %s, want a (only enrich is held)", pk.Peer)
	}
	// With every other peer taken by this request, the held peer is still
	// the last resort, not nothing.
	if got := walk(t, s.Plan(Request{WorkType: "enrich"}), RetryableError); !eq(got, []string{"b", "a"}) {
		t.Fatalf("walk while a holds off: %v, want [b a]", got)
	}
	clk.Advance(2 * time.Second)
	if pk := mustNext(t, s.Plan(Request{WorkType: "enrich"})); pk.Peer != "a" {
		t.Fatalf("enrich after a's Retry-After passed: picked %s, want a", pk.Peer)
	}
}
