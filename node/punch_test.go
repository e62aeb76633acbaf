package node

import (
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// TestPunchSchedule_BacksOffAndForgets: a peer that stays relayed is due a
// punch first after the first delay, then at twice the last delay up to
// the bound; one no longer relayed is forgotten and starts over.
func TestPunchSchedule_BacksOffAndForgets(t *testing.T) {
	const a, b = peer.ID("a"), peer.ID("b")
	s := newPunchSchedule(20*time.Second, 80*time.Second)
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration, relayed ...peer.ID) []peer.ID { return s.due(t0.Add(d), relayed) }
	steps := []struct {
		at      time.Duration
		relayed []peer.ID
		want    []peer.ID
	}{
		{0, []peer.ID{a}, nil}, // a seen: due at 20s
		{19 * time.Second, []peer.ID{a}, nil},
		{20 * time.Second, []peer.ID{a, b}, []peer.ID{a}}, // a due; next at 60s; b seen: due at 40s
		{40 * time.Second, []peer.ID{a, b}, []peer.ID{b}},
		{59 * time.Second, []peer.ID{a, b}, nil},
		{60 * time.Second, []peer.ID{a, b}, []peer.ID{a}},  // next at 140s: 80s, the bound
		{100 * time.Second, []peer.ID{a}, nil},             // b no longer relayed: forgotten
		{140 * time.Second, []peer.ID{a, b}, []peer.ID{a}}, // a at the bound again (220s); b starts over (160s)
		{159 * time.Second, []peer.ID{a, b}, nil},
		{160 * time.Second, []peer.ID{a, b}, []peer.ID{b}},
		{220 * time.Second, []peer.ID{a, b}, []peer.ID{a, b}}, // b after 40s
	}
	for _, st := range steps {
		if got := at(st.at, st.relayed...); !slices.Equal(got, st.want) {
			t.Fatalf("at %s with %v relayed: due %v, want %v", st.at, st.relayed, got, st.want)
		}
	}
	if len(s.peers) != 2 {
		t.Errorf("schedule holds %d peers, want 2", len(s.peers))
	}
	if got := at(300 * time.Second); len(got) != 0 || len(s.peers) != 0 {
		t.Errorf("none relayed: due %v, %d held; want none", got, len(s.peers))
	}
}
