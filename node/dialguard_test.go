package node

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

func TestDialGuardVouchesObservedIPsOnly(t *testing.T) {
	g := newDialGuard(2, time.Hour)
	p, relay := newPeerKey(t).id, newPeerKey(t).id
	g.observe(p, ma.StringCast("/ip4/127.0.0.1/udp/40000/quic-v1"), false)
	g.observe(relay, ma.StringCast("/ip4/10.0.0.9/udp/4001/quic-v1"), true)
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
	// A context that has ended: spend must not wait.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 2 {
		if !g.spend(ended) {
			t.Fatalf("newcomer dial %d refused within a budget of 2", i+1)
		}
	}
	if g.spend(ended) {
		t.Error("a third newcomer dial allowed within a budget of 2")
	}
	if newDialGuard(0, time.Second).spend(context.Background()) {
		t.Error("a newcomer dial allowed with no budget")
	}
}

// TestDialBudgetBoundsFailedDialsNotConnectedOnes: a newcomer dial that
// connected gives its unit back, and a dial waiting for the spent budget
// takes the unit given back at once; one that failed does not.
func TestDialBudgetBoundsFailedDialsNotConnectedOnes(t *testing.T) {
	clock := time.Unix(1_000_000, 0)
	b := newDialBudget(2, time.Hour, func() time.Time { return clock })
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 2 {
		if !b.take(ended) {
			t.Fatalf("dial %d refused within a budget of 2", i+1)
		}
	}
	if b.take(ended) {
		t.Fatal("a third dial allowed with the budget spent")
	}
	// 100 dials in a row that each connect spend nothing in the end.
	for i := range 100 {
		b.give()
		if !b.take(ended) {
			t.Fatalf("dial %d after one that connected refused", i+1)
		}
	}
	got := make(chan bool)
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	go func() { got <- b.take(ctx) }()
	b.give() // the waiting dial may run now (or took the unit before it waited)
	if !<-got {
		t.Fatal("a dial waiting for the budget was not woken by a unit given back")
	}
	// The budget grows by one per interval, up to its size.
	clock = clock.Add(90 * time.Minute)
	if !b.take(ended) || b.take(ended) {
		t.Error("after an hour and a half, want exactly one more dial")
	}
	clock = clock.Add(10 * time.Hour)
	n := 0
	for b.take(ended) {
		n++
	}
	if n != 2 {
		t.Errorf("after ten hours, %d dials allowed, want the budget's 2", n)
	}
}

// TestDialGuardFailedNewcomerDialClosesItsIP: once a newcomer dial to an
// IP failed, the addresses of other never-observed peers at that IP are
// not dialed for failedIPHold, so that invented peers sharing a victim's
// address cost one failed dial however many there are.
func TestDialGuardFailedNewcomerDialClosesItsIP(t *testing.T) {
	g := newDialGuard(8, time.Second)
	clock := time.Unix(1_000_000, 0)
	g.now = func() time.Time { return clock }
	victim := ma.StringCast("/ip4/127.0.0.77/udp/4001/quic-v1")
	victimTCP := ma.StringCast("/ip4/127.0.0.77/tcp/4001")
	other := ma.StringCast("/ip4/127.0.0.78/udp/4001/quic-v1")
	if got := g.open([]ma.Multiaddr{victim, other}); len(got) != 2 {
		t.Fatalf("before any failure open = %v, want both", got)
	}
	g.fail([]ma.Multiaddr{victim})
	got := g.open([]ma.Multiaddr{victim, victimTCP, other})
	if len(got) != 1 || !got[0].Equal(other) {
		t.Fatalf("after a failed dial to 127.0.0.77 open = %v, want only %v", got, other)
	}
	clock = clock.Add(failedIPHold - time.Second)
	if got := g.open([]ma.Multiaddr{victim}); len(got) != 0 {
		t.Errorf("within the hold: open = %v, want none", got)
	}
	clock = clock.Add(2 * time.Second)
	if got := g.open([]ma.Multiaddr{victim}); len(got) != 1 {
		t.Errorf("after the hold: open = %v, want the address again", got)
	}
	// A failed dial at an IP where a peer was observed closes nothing.
	g.observe(newPeerKey(t).id, ma.StringCast("/ip4/127.0.0.1/udp/5000/quic-v1"), false)
	seen := ma.StringCast("/ip4/127.0.0.1/udp/4001/quic-v1")
	g.fail([]ma.Multiaddr{seen})
	if got := g.open([]ma.Multiaddr{seen}); len(got) != 1 {
		t.Errorf("a failed dial at an observed peer's IP closed it: open = %v", got)
	}
	for i := range maxFailedIPs + 10 {
		g.fail([]ma.Multiaddr{ma.StringCast(fmt.Sprintf("/ip4/10.%d.%d.1/udp/1/quic-v1", i/256, i%256))})
	}
	if n := len(g.failed); n > maxFailedIPs {
		t.Errorf("%d failed IPs held, want at most %d", n, maxFailedIPs)
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

// TestDialGateBoundsDialsNoPartCleared: the host's gate lets an address
// through freely only for a connected peer, at an IP its peer was observed
// at, at the operator's bootstrap addresses and for DialInfo's own newcomer
// dials; any other address (a DHT answer's) takes a unit of the gate's
// budget per address (IP and port), given back when a connection the node
// dialed reaches the peer at that IP (not when the peer connects in); a
// unit whose peer was never reached there closes its IP to newcomer dials.
func TestDialGateBoundsDialsNoPartCleared(t *testing.T) {
	g := newDialGuard(3, time.Hour)
	clock := time.Unix(1_000_000, 0)
	g.now = func() time.Time { return clock }
	none := func(peer.ID) bool { return false }
	at := func(ip string, port int) ma.Multiaddr {
		return ma.StringCast(fmt.Sprintf("/ip4/%s/udp/%d/quic-v1", ip, port))
	}
	ids := make([]peer.ID, 8)
	for i := range ids {
		ids[i] = newPeerKey(t).id
	}
	seen, f1, f2, f3, f4, boot, relay, cleared := ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[7]
	g.observe(seen, at("10.0.0.1", 4001), false)
	for i := range 10 {
		if !g.admitDial(seen, at("10.0.0.1", 5000+i), none) {
			t.Fatalf("dial %d of a peer at an IP it was observed at refused", i)
		}
	}
	// Three units: two addresses of f1, one of f2.
	for i := range 2 { // the second within the first's grant, on its unit
		if !g.admitDial(f1, at("10.9.9.9", 1), none) {
			t.Fatalf("a newcomer dial within the budget refused (%d)", i+1)
		}
	}
	if !g.admitDial(f1, at("10.9.9.9", 2), none) || !g.admitDial(f2, at("10.9.9.8", 1), none) {
		t.Fatal("a second and third newcomer address within a budget of 3 refused")
	}
	if g.admitDial(f1, at("10.9.9.9", 3), none) || g.admitDial(f3, at("10.9.9.7", 1), none) {
		t.Fatal("a fourth newcomer address allowed with a budget of 3: one unit opened other ports")
	}
	if !g.admitDial(f3, at("10.9.9.7", 1), func(p peer.ID) bool { return p == f3 }) {
		t.Fatal("a dial of a connected peer (a hole punch) refused")
	}
	clock = clock.Add(gateGrant + time.Millisecond)
	if g.admitDial(f1, at("10.9.9.9", 1), none) {
		t.Fatal("a later dial of the same newcomer address allowed without a unit")
	}
	g.observe(f2, at("10.1.2.3", 9), false) // f2 connects in from elsewhere: no unit back
	if g.admitDial(f3, at("10.9.9.7", 1), none) {
		t.Fatal("a unit given back by a connection the peer opened")
	}
	g.observe(f2, at("10.9.9.8", 1), true) // reached where it was dialed: its unit comes back
	if !g.admitDial(f3, at("10.9.9.7", 1), none) {
		t.Fatal("a newcomer dial refused after another newcomer was reached and gave its unit back")
	}
	// f1's and f3's dials never reached them: their IPs close, units stay spent.
	clock = clock.Add(gateSettle)
	g.observe(f2, at("10.9.9.8", 1), true) // nothing to give back twice
	for _, ip := range []string{"10.9.9.9", "10.9.9.7"} {
		if _, closed := g.failed[netip.MustParseAddr(ip)]; !closed {
			t.Errorf("%s not closed after a newcomer dial there never connected", ip)
		}
	}
	if g.admitDial(f4, at("10.9.9.6", 1), none) {
		t.Fatal("a newcomer dial allowed after dials that never reached their peers spent the budget")
	}
	// DialInfo's newcomer dial runs on its own budget.
	g.clear(cleared, []ma.Multiaddr{at("10.9.9.5", 1)})
	if !g.admitDial(cleared, at("10.9.9.5", 1), none) {
		t.Fatal("an address DialInfo cleared refused")
	}
	g.revoke(cleared, []ma.Multiaddr{at("10.9.9.5", 1)})
	if g.admitDial(cleared, at("10.9.9.5", 1), none) {
		t.Fatal("an address allowed after DialInfo's dial ended, with the budget spent")
	}
	// The operator's bootstrap peers, at the addresses configured; a name
	// clears nothing by itself (membership trusts what it resolves to).
	g.trust([]peer.AddrInfo{{ID: boot, Addrs: []ma.Multiaddr{at("10.1.1.1", 4001), ma.StringCast("/dns4/boot.invalid/udp/4001/quic-v1")}}})
	if !g.admitDial(boot, at("10.1.1.1", 4001), none) {
		t.Fatal("a bootstrap peer refused at its configured address")
	}
	if g.admitDial(boot, at("10.1.1.1", 4002), none) || g.admitDial(boot, at("10.9.9.4", 1), none) {
		t.Fatal("a bootstrap peer allowed at an address not configured")
	}
	// Relayed: through a connected relay, or one observed at exactly
	// the relay part; another port of the relay's IP is a newcomer.
	circuit := func(a ma.Multiaddr) ma.Multiaddr {
		return ma.StringCast(a.String() + "/p2p/" + relay.String() + "/p2p-circuit")
	}
	if !g.admitDial(f4, circuit(at("10.2.2.2", 9)), func(p peer.ID) bool { return p == relay }) {
		t.Fatal("a relayed address through a connected relay refused")
	}
	g.observe(relay, at("10.2.2.2", 4001), true)
	if !g.admitDial(f4, circuit(at("10.2.2.2", 4001)), none) {
		t.Fatal("a relayed address through a relay observed there refused")
	}
	if g.admitDial(f4, circuit(at("10.2.2.2", 22)), none) {
		t.Fatal("a relayed address at another port of the relay's IP allowed with the budget spent")
	}
	g.listens = func(p peer.ID) []ma.Multiaddr {
		if p == relay {
			return []ma.Multiaddr{at("10.2.2.2", 22)}
		}
		return nil
	}
	if !g.admitDial(f4, circuit(at("10.2.2.2", 22)), none) {
		t.Fatal("a relayed address at an address the relay signed refused")
	}
	// A connection through a relay says where the relay is, not the peer.
	g.observe(f4, circuit(at("10.2.2.2", 4001)), true)
	if g.admitDial(f4, at("10.2.2.2", 4001), none) {
		t.Fatal("a direct address at the relay's IP allowed for a peer seen only through the relay")
	}
	if newDialGuard(0, time.Second).admitDial(f4, at("10.9.9.3", 1), none) {
		t.Fatal("a newcomer dial allowed with no budget")
	}
}
