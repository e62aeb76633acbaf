package node

import (
	"testing"
	"time"

	"github.com/workmesh/workmesh/node/authority"
	"github.com/workmesh/workmesh/tests/testkit"
)

// TestMembersTable: a table with Members enters only records whose
// certificate verifies for its authority, network and peer; a member stops
// counting at its certificate's expiry (without a new record) and at its
// revocation, and group labels are the attested ones.
func TestMembersTable(t *testing.T) {
	clock := testkit.NewFakeClock()
	auth, err := authority.Generate()
	if err != nil {
		t.Fatal(err)
	}
	other, err := authority.Generate()
	if err != nil {
		t.Fatal(err)
	}
	members, err := NewMembers(auth.Public(), testNetwork)
	if err != nil {
		t.Fatal(err)
	}
	_, self := newKey(t)
	tb := NewPeerTable(PeerTableConfig{Self: self, Network: testNetwork, TTL: testTTL, Clock: clock, Logger: quietLogger(), Members: members})
	now := clock.Now()
	admit := func(a *authority.Authority, network string, p peerKey, labels []string, expires time.Time) []byte {
		c, err := a.Admit(network, p.id, labels, now.Add(-time.Minute), expires)
		if err != nil {
			t.Fatal(err)
		}
		return c.Encode()
	}
	member, short, stranger := newPeerKey(t), newPeerKey(t), newPeerKey(t)
	withCert := func(c []byte, labels ...string) func(*NodeData) {
		return func(nd *NodeData) { nd.Cert, nd.Labels = c, labels }
	}
	refused := []struct {
		name string
		rec  []byte
	}{
		{"no certificate", stranger.record(t, 1)},
		{"another authority's", stranger.record(t, 2, withCert(admit(other, testNetwork, stranger, nil, now.Add(time.Hour))))},
		{"another network's", stranger.record(t, 3, withCert(admit(auth, "elsewhere", stranger, nil, now.Add(time.Hour))))},
		{"another peer's", stranger.record(t, 4, withCert(admit(auth, testNetwork, member, nil, now.Add(time.Hour))))},
		{"garbage", stranger.record(t, 5, withCert([]byte("not a certificate")))},
	}
	for _, c := range refused {
		if _, err := submit(t, tb, c.rec); ReasonOf(err) != RejectNotMember {
			t.Errorf("%s: error %v, want a not_member rejection", c.name, err)
		}
	}
	if got := tb.Rejections()[RejectNotMember]; got != uint64(len(refused)) {
		t.Errorf("not_member rejections %d, want %d", got, len(refused))
	}
	if ok, err := submit(t, tb, member.record(t, 1, withCert(admit(auth, testNetwork, member, []string{"full"}, now.Add(time.Hour)), "full", "staked"))); !ok || err != nil {
		t.Fatalf("member refused: %v", err)
	}
	if ok, err := submit(t, tb, short.record(t, 1, withCert(admit(auth, testNetwork, short, nil, now.Add(time.Second))))); !ok || err != nil {
		t.Fatalf("member refused: %v", err)
	}
	if n := tb.Len(); n != 2 {
		t.Fatalf("%d peers, want 2", n)
	}
	if got := tb.Eligible(sampleNodeData(member.id, 1).WorkTypes[0].Name, []string{"staked"}); len(got) != 0 {
		t.Errorf("a self-declared label made %d peers eligible, want 0", len(got))
	}
	if got := tb.Eligible(sampleNodeData(member.id, 1).WorkTypes[0].Name, []string{"full"}); len(got) != 1 {
		t.Errorf("an attested label made %d peers eligible, want 1", len(got))
	}

	clock.Advance(time.Second)
	if _, ok := tb.Get(short.id); ok {
		t.Error("a member whose certificate expired still counts")
	}
	if n := tb.Len(); n != 1 {
		t.Errorf("%d peers after an expiry, want 1", n)
	}
	if gone := tb.Expire(); gone != 1 {
		t.Errorf("Expire removed %d, want the expired member", gone)
	}

	rev, err := auth.Revoke(testNetwork, member.id, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := members.Revoke(rev, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, ok := tb.Get(member.id); ok {
		t.Error("a revoked member still counts")
	}
	if _, err := submit(t, tb, member.record(t, 2, withCert(admit(auth, testNetwork, member, nil, now.Add(time.Hour))))); ReasonOf(err) != RejectNotMember {
		t.Errorf("a revoked member's new record: %v, want a not_member rejection", err)
	}
	forged, err := other.Revoke(testNetwork, short.id, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := members.Revoke(forged, now.Add(time.Hour)); err == nil {
		t.Error("a revocation by another authority was kept")
	}
}
