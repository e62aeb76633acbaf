package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

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

// TestClosedNetworkNodes runs three nodes on loopback: two members of a
// closed network (one with a certificate that expires in a second or two)
// and a stranger without a certificate. The members know each other; the
// stranger's record is refused (not_member) and its health ping reset;
// the expiring member leaves the other's table at its expiry without a
// restart or a new record.
func TestClosedNetworkNodes(t *testing.T) {
	auth, err := authority.Generate()
	if err != nil {
		t.Fatal(err)
	}
	member := func(expires time.Duration) (*Node, peer.ID) {
		key, id := newKey(t)
		now := time.Now()
		c, err := auth.Admit(testNetwork, id, nil, now.Add(-time.Minute), now.Add(expires))
		if err != nil {
			t.Fatal(err)
		}
		return startTestNode(t, testConfig(t), WithIdentity(key), WithMembership(auth.Public(), c)), id
	}
	a, _ := member(time.Hour)
	b, bID := member(2 * time.Second)
	stranger := startTestNode(t, testConfig(t))
	connect(t, b, a)
	connect(t, stranger, a)
	waitKnows(t, a, bID, 5*time.Second)
	testkit.WaitFor(t, 5*time.Second, "the stranger's record refused", func() error {
		if n := a.Peers().Rejections()[RejectNotMember]; n == 0 {
			return errors.New("no not_member rejection yet")
		}
		return nil
	})
	if _, ok := a.Peers().Get(stranger.ID()); ok {
		t.Error("the member holds the stranger's record")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := stranger.Ping(ctx, a.ID()); err == nil {
		t.Error("the stranger's health ping was answered")
	}
	if a.StrangerStreams() == 0 {
		t.Error("no stranger stream counted")
	}
	if _, _, err := b.Ping(ctx, a.ID()); err != nil {
		t.Errorf("a member's health ping: %v", err)
	}
	testkit.WaitFor(t, 5*time.Second, "the expired member leaves the table", func() error {
		if _, ok := a.Peers().entry(bID); ok {
			return errors.New("still held")
		}
		return nil
	}, a.Peers().Changed)
	if a.IsMember(bID) {
		t.Error("the expired member still counts as one")
	}
}

// TestRevocationReachesLateMember: a revocation published before a member
// joined reaches it in its first sync, and the revoked peer's record is
// refused there.
func TestRevocationReachesLateMember(t *testing.T) {
	auth, err := authority.Generate()
	if err != nil {
		t.Fatal(err)
	}
	cert := func(id peer.ID) *authority.Certificate {
		now := time.Now()
		c, err := auth.Admit(testNetwork, id, nil, now.Add(-time.Minute), now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	start := func() (*Node, peer.ID) {
		key, id := newKey(t)
		return startTestNode(t, testConfig(t), WithIdentity(key), WithMembership(auth.Public(), cert(id))), id
	}
	a, _ := start()
	revoked, revokedID := start()
	connect(t, revoked, a)
	waitKnows(t, a, revokedID, 5*time.Second)
	rev, err := auth.Revoke(testNetwork, revokedID, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if changed, err := a.PublishRevocation(ctx, rev.Encode()); err != nil || !changed {
		t.Fatalf("publish: changed %v, %v", changed, err)
	}
	if a.IsMember(revokedID) {
		t.Fatal("the publishing member still counts the revoked peer")
	}
	late, _ := start()
	connect(t, late, a)
	testkit.WaitFor(t, 5*time.Second, "the late member keeps the revocation", func() error {
		if n := late.Members().Revocations(); n != 1 {
			return errors.New("no revocation kept")
		}
		return nil
	})
	connect(t, revoked, late)
	testkit.WaitFor(t, 5*time.Second, "the revoked peer's record is refused by the late member", func() error {
		if late.Peers().Rejections()[RejectNotMember] == 0 {
			return errors.New("no not_member rejection yet")
		}
		return nil
	})
	if late.IsMember(revokedID) {
		t.Error("the late member counts the revoked peer")
	}
}
