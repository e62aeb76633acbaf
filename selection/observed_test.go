package selection

import (
	"testing"
	"time"
)

// scoreOf returns the ranking score of id for work type "sha256".
func scoreOf(t *testing.T, s *Selector, id string) float64 {
	t.Helper()
	for _, r := range s.Ranking("sha256") {
		if r.Peer == id {
			return r.Score
		}
	}
	t.Fatalf("%s is not ranked", id)
	return 0
}

// TestObservedLoadReachesRating: the load a peer's answer carried
// (ObserveLoad) replaces the load its record advertised in the rating at the
// next refresh, until a newer record with a load of its own arrives or the
// observation grows old.
func TestObservedLoadReachesRating(t *testing.T) {
	mk := func(id string, used int) Peer {
		p := peer(id)
		p.Capacity, p.Concurrency, p.Used = 10, 10, used
		p.Load = float64(used) / 10
		return p
	}
	s, clk := newSelector(t, testConfig(), mk("a", 0), mk("b", 0))
	idle := scoreOf(t, s, "a")
	if scoreOf(t, s, "b") != idle {
		t.Fatal("equal peers score differently")
	}

	s.ObserveLoad("a", 8) // a health or work answer: a has 8 of 10 taken
	s.ObserveLoad("nobody", 3)
	clk.Advance(time.Second)
	if !s.MaybeRefresh() {
		t.Fatal("an observed load change did not make the ranking due")
	}
	busy := scoreOf(t, s, "a")
	if busy >= idle || scoreOf(t, s, "b") != idle {
		t.Fatalf("a observed at 8/10 scores %v, b %v; idle was %v: want a below b", busy, scoreOf(t, s, "b"), idle)
	}
	// The same load again changes nothing.
	s.ObserveLoad("a", 8)
	clk.Advance(time.Second)
	if s.MaybeRefresh() {
		t.Error("the same observed load made the ranking due")
	}

	// A newer record advertising a load of its own wins over the answer.
	s.SetPeers([]Peer{mk("a", 2), mk("b", 0)})
	if got := scoreOf(t, s, "a"); got <= busy || got >= idle {
		t.Errorf("a's new record at 2/10 scores %v, want between %v and %v", got, busy, idle)
	}
	// An old observation gives way to the record.
	s.ObserveLoad("b", 9)
	clk.Advance(observedLoadAge + time.Second)
	s.Refresh()
	if got := scoreOf(t, s, "b"); got != idle {
		t.Errorf("b observed at 9/10 long ago scores %v, want its record's idle %v", got, idle)
	}
}

// TestObservedLoadInSteps: rating weighs an observed load in steps of an
// eighth of the capacity, so that one request more at a peer that takes
// dozens does not reorder it among equals; a step more does.
func TestObservedLoadInSteps(t *testing.T) {
	mk := func(id string) Peer {
		p := peer(id)
		p.Capacity, p.Concurrency = 64, 64
		return p
	}
	s, clk := newSelector(t, testConfig(), mk("a"), mk("b"))
	idle := scoreOf(t, s, "a")
	s.ObserveLoad("a", 7) // below one step of 8
	clk.Advance(time.Second)
	s.Refresh()
	if got := scoreOf(t, s, "a"); got != idle {
		t.Errorf("a with 7 of 64 taken scores %v, want the idle %v", got, idle)
	}
	s.ObserveLoad("a", 8)
	clk.Advance(time.Second)
	s.Refresh()
	if got := scoreOf(t, s, "a"); got >= idle {
		t.Errorf("a with 8 of 64 taken scores %v, want below the idle %v", got, idle)
	}
}
