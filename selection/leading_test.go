package selection

import (
	"testing"
	"time"
)

// Leading takes the first n of every work type's order as a request walks
// it, group by group, each peer once and at most limit in all, and leaves
// out unreachable peers.
func TestLeading_FirstOfEveryTypeOnceWithinTheLimit(t *testing.T) {
	cfg := testConfig()
	cfg.LabelBalancing = labelBalancing(true, true, "fast")
	peers := []Peer{
		peer("a"), peer("b"), peer("c", "fast"), peer("d", "fast"),
		{ID: "e", Types: []TypeInfo{{Name: "block"}}},
		{ID: "f", Types: []TypeInfo{{Name: "block"}, {Name: "sha256"}}},
	}
	s, clk := newSelector(t, cfg, peers...)
	s.Refresh()
	// block: e and f in ID order (unrated); sha256: the "fast" group (c, d)
	// first, then the rest.
	if got := s.Leading(2, 10); !eq(got, []string{"e", "f", "c", "d"}) {
		t.Errorf("Leading(2, 10) = %v, want [e f c d]", got)
	}
	if got := s.Leading(2, 3); !eq(got, []string{"e", "f", "c"}) {
		t.Errorf("Leading(2, 3) = %v, want [e f c]", got)
	}
	// A peer unreachable now is not led to.
	for range cfg.Liveness.PollFailureThreshold {
		s.Liveness().Report("c", false)
		clk.Advance(time.Millisecond)
	}
	s.Refresh()
	if got := s.Leading(2, 10); !eq(got, []string{"e", "f", "d", "a"}) {
		t.Errorf("Leading(2, 10) with c unreachable = %v, want [e f d a]", got)
	}
	if got := s.Leading(0, 10); len(got) != 0 {
		t.Errorf("Leading(0, 10) = %v, want none", got)
	}
}
