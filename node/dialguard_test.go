package node

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

func TestDialGuardVouchesObservedIPsOnly(t *testing.T) {
	g := newDialGuard(2, time.Hour)
	p, relay := newPeerKey(t).id, newPeerKey(t).id
	g.observe(p, ma.StringCast("/ip4/127.0.0.1/udp/40000/quic-v1"))
	g.observe(relay, ma.StringCast("/ip4/10.0.0.9/udp/4001/quic-v1"))
	addrs := []ma.Multiaddr{
		ma.StringCast("/ip4/127.0.0.1/udp/4001/quic-v1"),                                       // seen at that IP, another port
		ma.StringCast("/ip4/127.0.0.77/udp/4001/quic-v1"),                                      // never seen there
		ma.StringCast("/ip4/10.0.0.9/udp/4001/quic-v1/p2p/" + relay.String() + "/p2p-circuit"), // through a relay seen there
		ma.StringCast("/ip4/10.0.0.8/udp/4001/quic-v1/p2p/" + relay.String() + "/p2p-circuit"), // the relay never seen there
		ma.StringCast("/dns4/example.invalid/udp/4001/quic-v1"),                                // no IP to judge
	}
	ok, rest := g.vouched(p, addrs)
	if len(ok) != 2 || !ok[0].Equal(addrs[0]) || !ok[1].Equal(addrs[2]) {
		t.Errorf("vouched %v, want %v and %v", ok, addrs[0], addrs[2])
	}
	if len(rest) != 3 {
		t.Errorf("unvouched %v, want 3", rest)
	}
	if ok, _ := g.vouched(peer.ID("someone else"), addrs[:1]); len(ok) != 0 {
		t.Errorf("another peer's observation vouched for %v", ok)
	}
	for i := range 2 {
		if !g.spend() {
			t.Fatalf("newcomer dial %d refused within a budget of 2", i+1)
		}
	}
	if g.spend() {
		t.Error("a third newcomer dial allowed within a budget of 2")
	}
	if newDialGuard(0, time.Second).spend() {
		t.Error("a newcomer dial allowed with no budget")
	}
}

func TestPeerTableCapEvictsOnlyForConnectedPeers(t *testing.T) {
	tb := NewPeerTable(PeerTableConfig{Self: "self", Network: testNetwork, TTL: time.Minute, Cap: 2})
	a, b, c := newPeerKey(t), newPeerKey(t), newPeerKey(t)
	for _, k := range []peerKey{a, b} {
		if _, err := tb.Submit(k.record(t, 1), "", SourceGossip); err != nil {
			t.Fatal(err)
		}
	}
	tb.SetConnected(a.id, true)
	if _, err := tb.Submit(c.record(t, 1), "", SourceGossip); ReasonOf(err) != RejectTableFull {
		t.Fatalf("a third peer in a table of cap 2: %v, want table-full", err)
	}
	tb.SetConnected(c.id, true)
	if ok, err := tb.Submit(c.record(t, 1), "", SourceGossip); !ok || err != nil {
		t.Fatalf("a connected third peer: %t %v, want it entered", ok, err)
	}
	if _, ok := tb.Get(b.id); ok {
		t.Error("the unconnected peer was kept; want it evicted for the connected one")
	}
	if _, ok := tb.Get(a.id); !ok {
		t.Error("a connected peer was evicted")
	}
}
