package selection

import "testing"

// Changed is closed when a new ranking is published, and a fresh channel
// waits for the next one.
func TestSelector_ChangedOnNewRanking(t *testing.T) {
	s, _ := newSelector(t, testConfig(), peer("a"))
	ch := s.Changed()
	select {
	case <-ch:
		t.Fatal("Changed closed before any new ranking")
	default:
	}
	s.SetPeers([]Peer{peer("a"), peer("b")})
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed by SetPeers' new ranking")
	}
	next := s.Changed()
	select {
	case <-next:
		t.Fatal("the next Changed channel is closed already")
	default:
	}
	s.Refresh()
	select {
	case <-next:
	default:
		t.Fatal("Changed not closed by Refresh")
	}
}
