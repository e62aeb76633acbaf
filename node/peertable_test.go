package node

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/sirupsen/logrus"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/tests/testkit"
)

func quietLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

const testTTL = 30 * time.Second

func newTestTable(t testing.TB, clock selection.Clock) (*PeerTable, peer.ID) {
	_, self := newKey(t)
	return NewPeerTable(PeerTableConfig{Self: self, Network: testNetwork, TTL: testTTL, Clock: clock, Logger: quietLogger()}), self
}

// peerKey is a test peer that signs its own records.
type peerKey struct {
	key crypto.PrivKey
	id  peer.ID
}

func newPeerKey(t testing.TB) peerKey {
	key, id := newKey(t)
	return peerKey{key, id}
}

func (p peerKey) record(t testing.TB, seq uint64, edit ...func(*NodeData)) []byte {
	t.Helper()
	nd := sampleNodeData(p.id, seq)
	for _, e := range edit {
		e(&nd)
	}
	b, err := SignNodeData(nd, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func submit(t testing.TB, tb *PeerTable, data []byte) (bool, error) {
	t.Helper()
	return tb.Submit(data, "", SourceGossip)
}

func TestPeerTableNewestWins(t *testing.T) {
	tb, _ := newTestTable(t, testkit.NewFakeClock())
	a := newPeerKey(t)
	for _, seq := range []uint64{10, 20} {
		if ok, err := submit(t, tb, a.record(t, seq)); !ok || err != nil {
			t.Fatalf("sequence %d: entered=%v err=%v", seq, ok, err)
		}
	}
	if p, _ := tb.Get(a.id); p.Data.Sequence != 20 {
		t.Fatalf("sequence %d, want 20", p.Data.Sequence)
	}

	// An older record is a replay: refused, counted, and it does not
	// displace the newer one.
	old := a.record(t, 15, func(nd *NodeData) { nd.WorkTypes = []WorkType{{Name: "stale"}} })
	ok, err := submit(t, tb, old)
	if ok || ReasonOf(err) != RejectReplay {
		t.Fatalf("older record: entered=%v err=%v, want a replay rejection", ok, err)
	}
	p, _ := tb.Get(a.id)
	if p.Data.Sequence != 20 || p.Data.Serves("stale") {
		t.Errorf("older record displaced the newer one: %+v", p.Data)
	}
	if n := tb.Rejections()[RejectReplay]; n != 1 {
		t.Errorf("replay count %d, want 1", n)
	}

	// The same record again is a harmless duplicate, not a replay.
	if ok, err := submit(t, tb, a.record(t, 20)); ok || err != nil {
		t.Errorf("duplicate: entered=%v err=%v", ok, err)
	}
	if n := tb.Rejections()[RejectReplay]; n != 1 {
		t.Errorf("replay count %d after a duplicate, want still 1", n)
	}
}

func TestPeerTableRejectsBadRecordsWithoutDisplacingGood(t *testing.T) {
	tb, _ := newTestTable(t, testkit.NewFakeClock())
	a, b := newPeerKey(t), newPeerKey(t)
	if ok, err := submit(t, tb, a.record(t, 10)); !ok || err != nil {
		t.Fatal(err)
	}
	// B signs a newer record that claims to be A.
	nd := sampleNodeData(a.id, 11)
	nd.WorkTypes = []WorkType{{Name: "evil"}}
	forged := signRaw(t, &nodeDataRecord{nd}, b.key)

	bad := []struct {
		data []byte
		want RejectReason
	}{
		{forged, RejectForged},
		{make([]byte, MaxRecordSize+1), RejectOversized},
		{[]byte("junk"), RejectMalformed},
		{a.record(t, 12, func(nd *NodeData) { nd.Network = "elsewhere" }), RejectWrongNetwork},
	}
	for _, tc := range bad {
		if ok, err := submit(t, tb, tc.data); ok || ReasonOf(err) != tc.want {
			t.Errorf("entered=%v err=%v, want %s", ok, err, tc.want)
		}
	}
	p, _ := tb.Get(a.id)
	if p.Data.Sequence != 10 || p.Data.Serves("evil") {
		t.Errorf("bad record displaced the good one: %+v", p.Data)
	}
	got := tb.Rejections()
	for _, tc := range bad {
		if got[tc.want] != 1 {
			t.Errorf("count of %s = %d, want 1", tc.want, got[tc.want])
		}
	}
}

func TestPeerTableIgnoresSelf(t *testing.T) {
	me := newPeerKey(t)
	tb := NewPeerTable(PeerTableConfig{Self: me.id, Network: testNetwork, TTL: testTTL, Clock: testkit.NewFakeClock(), Logger: quietLogger()})
	if ok, err := submit(t, tb, me.record(t, 1)); ok || err != nil {
		t.Fatalf("own record: entered=%v err=%v", ok, err)
	}
	if tb.Len() != 0 {
		t.Error("own record is in the table")
	}
}

func TestPeerTableExpiresAfterTTL(t *testing.T) {
	clock := testkit.NewFakeClock()
	tb, _ := newTestTable(t, clock)
	a, b := newPeerKey(t), newPeerKey(t)
	submit(t, tb, a.record(t, 1))
	clock.Advance(testTTL / 2)
	submit(t, tb, b.record(t, 1))

	clock.Advance(testTTL/2 - time.Nanosecond)
	if tb.Len() != 2 {
		t.Fatalf("%d fresh peers just before A's TTL, want 2", tb.Len())
	}
	clock.Advance(time.Nanosecond)
	if _, ok := tb.Get(a.id); ok {
		t.Error("A is still fresh at its TTL")
	}
	if _, ok := tb.Get(b.id); !ok {
		t.Error("B expired early")
	}
	if n := tb.Expire(); n != 1 {
		t.Errorf("Expire removed %d, want 1", n)
	}

	// A newer record refreshes; the old one relayed by someone else must
	// not bring A back.
	if ok, _ := submit(t, tb, a.record(t, 1)); ok {
		t.Error("A's expired record revived it")
	}
	if ok, err := submit(t, tb, a.record(t, 2)); !ok || err != nil {
		t.Errorf("A's newer record: entered=%v err=%v", ok, err)
	}

	// Refreshing B keeps it fresh past its first TTL.
	clock.Advance(testTTL / 2)
	submit(t, tb, b.record(t, 2))
	clock.Advance(testTTL - time.Second)
	if _, ok := tb.Get(b.id); !ok {
		t.Error("refreshed B expired")
	}
}

func TestPeerTableEligible(t *testing.T) {
	clock := testkit.NewFakeClock()
	tb, _ := newTestTable(t, clock)
	labelled := func(types []string, labels ...string) func(*NodeData) {
		return func(nd *NodeData) {
			nd.WorkTypes = nil
			for _, wt := range types {
				nd.WorkTypes = append(nd.WorkTypes, WorkType{Name: wt})
			}
			nd.Labels = labels
		}
	}
	a, b, c, stale := newPeerKey(t), newPeerKey(t), newPeerKey(t), newPeerKey(t)
	submit(t, tb, stale.record(t, 1, labelled([]string{"sha256"}, "full")))
	clock.Advance(testTTL)
	submit(t, tb, a.record(t, 1, labelled([]string{"sha256", "echo"}, "full", "eu")))
	submit(t, tb, b.record(t, 1, labelled([]string{"sha256"}, "archive")))
	submit(t, tb, c.record(t, 1, labelled([]string{"echo"}, "full")))

	ids := func(ps []PeerInfo) map[peer.ID]bool {
		m := map[peer.ID]bool{}
		for _, p := range ps {
			m[p.Data.PeerID] = true
		}
		return m
	}
	cases := []struct {
		workType string
		labels   []string
		want     []peer.ID
	}{
		{"sha256", nil, []peer.ID{a.id, b.id}},
		{"sha256", []string{"full"}, []peer.ID{a.id}},
		{"sha256", []string{"full", "eu"}, []peer.ID{a.id}},
		{"echo", []string{"archive"}, nil},
		{"unknown", nil, nil},
	}
	for _, tc := range cases {
		got := ids(tb.Eligible(tc.workType, tc.labels))
		if len(got) != len(tc.want) {
			t.Errorf("Eligible(%s, %v) = %v, want %v", tc.workType, tc.labels, got, tc.want)
			continue
		}
		for _, id := range tc.want {
			if !got[id] {
				t.Errorf("Eligible(%s, %v) misses %s", tc.workType, tc.labels, id)
			}
		}
	}
}

func TestPeerTableConnectedAndChanged(t *testing.T) {
	tb, _ := newTestTable(t, testkit.NewFakeClock())
	a := newPeerKey(t)
	tb.SetConnected(a.id, true) // connected before its record arrives
	ch := tb.Changed()
	submit(t, tb, a.record(t, 1))
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed by a new record")
	}
	if p, _ := tb.Get(a.id); !p.Connected {
		t.Error("peer connected before its record is not shown connected")
	}
	ch = tb.Changed()
	tb.SetConnected(a.id, false)
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed by a disconnect")
	}
	if p, _ := tb.Get(a.id); p.Connected {
		t.Error("disconnected peer shown connected")
	}
}

func TestPeerTableGossipedFlag(t *testing.T) {
	tb, _ := newTestTable(t, testkit.NewFakeClock())
	a := newPeerKey(t)
	rec := a.record(t, 1)
	if _, err := tb.Submit(rec, "", SourceSync); err != nil {
		t.Fatal(err)
	}
	if tb.HoldsGossiped(a.id, rec) {
		t.Fatal("a synced record counts as already gossiped")
	}
	sd, err := OpenNodeData(rec, testNetwork)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := tb.Offer(sd, "", SourceGossip); ok || err != nil {
		t.Fatalf("gossip copy of a held record: entered=%v err=%v", ok, err)
	}
	if !tb.HoldsGossiped(a.id, rec) {
		t.Error("gossip copy did not mark the record gossiped")
	}
}

// TestPeerTableHolds: only the very bytes held count as held, so a copy
// that differs in anything (here its signature) is checked in full.
func TestPeerTableHolds(t *testing.T) {
	tb, _ := newTestTable(t, testkit.NewFakeClock())
	a := newPeerKey(t)
	rec := a.record(t, 1)
	if tb.Holds(a.id, rec) {
		t.Fatal("an empty table holds a record")
	}
	if _, err := tb.Submit(rec, "", SourceSync); err != nil {
		t.Fatal(err)
	}
	if !tb.Holds(a.id, rec) {
		t.Error("the record entered is not held")
	}
	if tb.Holds(a.id, withBadSignature(rec)) || tb.Holds(a.id, a.record(t, 1, func(nd *NodeData) { nd.Labels = []string{"other"} })) {
		t.Error("another envelope of the same peer counts as held")
	}
}

func TestRejectErrorUnwraps(t *testing.T) {
	inner := errors.New("detail")
	err := error(reject(RejectForged, inner))
	if !errors.Is(err, ErrRejected) || !errors.Is(err, inner) {
		t.Errorf("%v does not unwrap to both ErrRejected and its detail", err)
	}
}

// TestPeerTableAdditions: Additions counts peers entering the table: not a
// newer record, a connection change or a refused record, but a peer that
// comes back after expiring.
func TestPeerTableAdditions(t *testing.T) {
	clock := testkit.NewFakeClock()
	tb, _ := newTestTable(t, clock)
	a, b := newPeerKey(t), newPeerKey(t)
	want := func(n uint64, after string) {
		t.Helper()
		if got := tb.Additions(); got != n {
			t.Errorf("after %s: Additions %d, want %d", after, got, n)
		}
	}
	want(0, "nothing")
	submit(t, tb, a.record(t, 1))
	want(1, "A entered")
	submit(t, tb, a.record(t, 2))
	tb.SetConnected(a.id, true)
	submit(t, tb, a.record(t, 1))
	want(1, "A's newer record, connection and replayed record")
	submit(t, tb, b.record(t, 1))
	want(2, "B entered")
	clock.Advance(testTTL)
	if n := tb.Expire(); n != 2 {
		t.Fatalf("Expire removed %d, want 2", n)
	}
	want(2, "both expired")
	submit(t, tb, a.record(t, 3))
	want(3, "A came back")
}
