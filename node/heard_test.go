package node

import (
	"testing"

	"github.com/workmesh/workmesh/tests/testkit"
)

// TestPeerTableHeardKeepsAPeerKnown: a peer that keeps naming the sequence of
// the record held in its health answers stays fresh past the record TTL
// without re-announcing; the entry is renewed at most once per half TTL; a
// newer sequence is reported for fetching; a peer that stops answering
// expires a TTL after it was last heard.
func TestPeerTableHeardKeepsAPeerKnown(t *testing.T) {
	clock := testkit.NewFakeClock()
	tb, _ := newTestTable(t, clock)
	p := newPeerKey(t)
	if ok, err := submit(t, tb, p.record(t, 5)); !ok || err != nil {
		t.Fatalf("submit: %t %v", ok, err)
	}
	adds := tb.Changed()
	if tb.Heard(p.id, 5) {
		t.Error("the sequence held reported as newer")
	}
	select {
	case <-adds:
		t.Error("an answer right after the record changed the table")
	default:
	}
	for range 4 { // four TTLs of answers and no record
		clock.Advance(testTTL * 6 / 10)
		if tb.Heard(p.id, 5) {
			t.Fatal("the sequence held reported as newer")
		}
		if _, ok := tb.Get(p.id); !ok {
			t.Fatalf("a peer answering every %s expired", testTTL*6/10)
		}
	}
	if !tb.Heard(p.id, 6) || !tb.Heard(newPeerKey(t).id, 1) {
		t.Error("a newer sequence, or a peer not held, not reported for fetching")
	}
	clock.Advance(testTTL)
	if _, ok := tb.Get(p.id); ok {
		t.Error("a peer that stopped answering is still fresh a TTL later")
	}
}
