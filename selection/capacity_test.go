package selection

import (
	"testing"
	"time"
)

// withRoom gives p an advertised capacity (running and queued) and how
// much of it is taken.
func withRoom(p Peer, capacity, used int) Peer {
	p.Capacity, p.Used, p.Concurrency = capacity, used, 1
	return p
}

// TestPick_WeighsFreeCapacity: a peer without free capacity, by what it
// advertised taken or by the attempts this node has in flight there, is
// passed over while another has room, rated or not; when none has room the
// least full is picked rather than nothing.
func TestPick_WeighsFreeCapacity(t *testing.T) {
	// Advertised: a, best in rank order, says it is full.
	s, _ := newSelector(t, testConfig(), withRoom(peer("a", "a"), 10, 10), withRoom(peer("b", "b"), 10, 3))
	if pk := mustNext(t, s.Plan(Request{WorkType: "sha256"})); pk.Peer != "b" {
		t.Fatalf("unrated: picked %s, want b (a advertises no free capacity)", pk.Peer)
	}
	feed(t, s, "a", Success, time.Millisecond, 5)
	feed(t, s, "b", Success, 20*time.Millisecond, 5) // b is much the slower
	s.Refresh()
	if r := s.Ranking("sha256"); r[0].Peer != "a" {
		t.Fatalf("ranking %v, want a first", r)
	}
	if pk := mustNext(t, s.Plan(Request{WorkType: "sha256"})); pk.Peer != "b" {
		t.Fatalf("rated: picked %s, want b (a, the better rated, is full)", pk.Peer)
	}

	// This node's own attempts in flight: a and b take 3 each, c's capacity
	// is unknown (never full) but it is the worst rated.
	s, _ = newSelector(t, testConfig(), withRoom(peer("a", "a"), 3, 0), withRoom(peer("b", "b"), 3, 0), peer("c", "c"))
	feed(t, s, "a", Success, time.Millisecond, 5)
	feed(t, s, "b", Success, time.Millisecond, 5)
	feed(t, s, "c", Success, time.Millisecond, 3)
	feed(t, s, "c", RetryableError, time.Millisecond, 3)
	s.Refresh()
	count := map[string]int{}
	var open []*Plan
	var picks []Pick
	for range 9 {
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		open, picks = append(open, p), append(picks, pk)
		count[pk.Peer]++
	}
	if count["a"] != 3 || count["b"] != 3 || count["c"] != 3 {
		t.Fatalf("9 concurrent picks: %v; want a and b filled to their capacity of 3, then c", count)
	}
	// One attempt on a ends: a has room again and is preferred to c.
	open[0].Report(picks[0], Success, time.Millisecond)
	if pk := mustNext(t, s.Plan(Request{WorkType: "sha256"})); pk.Peer != picks[0].Peer {
		t.Fatalf("after an attempt on %s ended: picked %s, want %s", picks[0].Peer, pk.Peer, picks[0].Peer)
	}

	// Every peer full: the least full one, not nothing.
	s, _ = newSelector(t, testConfig(), withRoom(peer("a", "a"), 10, 12), withRoom(peer("b", "b"), 10, 10))
	if pk, ok := s.Plan(Request{WorkType: "sha256"}).Next(); !ok || pk.Peer != "b" {
		t.Fatalf("all full: picked %v (%v), want b, the least full", pk.Peer, ok)
	}
}
