package node

import (
	"net/netip"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"
)

// The dial gate: the dial guard's judgement applied to every dial the host
// makes, in its connection gater (addrGater.InterceptAddrDial). DialInfo
// judges a record's addresses before the dispatcher dials, but the host's
// peerstore is filled from other sources too: the DHT adds the addresses
// that FIND_NODE and provider answers carry (any DHT peer's word, under
// any peer ID) and dials them during its queries, and every later dial of
// that peer tries them as well. So the gate lets an address through only
//
//   - for a peer the host is connected to (a relayed connection included:
//     hole punching dials the addresses the peer itself sent over it);
//   - at an IP the peer was observed at (for a relayed address, through a
//     relay the host is connected to or whose part vouches allows);
//   - when a part of the node cleared it: DialInfo's newcomer dials, the
//     bootstrap peers the operator configured;
//   - else within the gate's own newcomer budget (the size and rate of the
//     newcomer-dials settings): the dial takes a unit, which it gives back
//     when the peer connects; one whose peer did not connect within
//     gateSettle keeps its unit and closes its IP to newcomer dials for
//     failedIPHold, as a failed DialInfo dial does. The gate never waits:
//     with the budget spent, the address is refused (the DHT query counts
//     the peer unreachable and goes on).

// A newcomer dial the gate lets through may use its address for
// gateGrant (the swarm judges all of a dial's addresses at once, and
// requests that join the dial under way judge them again); a later dial
// takes a unit of its own. The dial's outcome is judged gateSettle after
// it began: longer than a dial takes (go-libp2p's transport dial timeout
// is 10s), so that a peer that connects late is not taken for a failure.
const (
	gateGrant  = 2 * time.Second
	gateSettle = 15 * time.Second
)

// maxPermits bounds the addresses cleared at once; past it the gate
// clears no more until some run out.
const maxPermits = 4096

// permit clears one IP of a peer for dials until grant, and is judged at
// settle. units are the gate's budget units its dials hold, given back
// when the peer connects; at settle, a permit still holding units closes
// its IP to newcomer dials. DialInfo's permits hold none: its own budget
// pays for its dial.
type permit struct {
	grant, settle time.Time
	units         int
}

// trust clears the addresses of the bootstrap peers, the operator's word,
// for good: an address by its IP, and any address of a peer configured
// by a name (the host resolves it before the gate sees it).
func (g *dialGuard) trust(peers []peer.AddrInfo) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, ai := range peers {
		g.trusted[ai.ID] = append(g.trusted[ai.ID], ai.Addrs...)
	}
}

// trustedLocked reports whether a is an address of id the operator gave.
func (g *dialGuard) trustedLocked(id peer.ID, ip netip.Addr) bool {
	for _, t := range g.trusted[id] {
		tip, ok := addrIP(t)
		if !ok || tip == ip {
			return true
		}
	}
	return false
}

// admitDial is the gate's judgement of a, one address of a dial of id;
// connected reports whether the host holds a connection to a peer.
func (g *dialGuard) admitDial(id peer.ID, a ma.Multiaddr, connected func(peer.ID) bool) bool {
	if connected(id) {
		return true
	}
	relay, _, isCircuit := circuitParts(a)
	if isCircuit && (relay == "" || connected(relay)) {
		// No relay to dial (the relay transport refuses it), or one the
		// host is connected to: no packet goes to a new address.
		return true
	}
	if g.vouches(id, a) {
		return true
	}
	ip, ok := addrIP(a)
	if !ok {
		return false // not an IP address: nothing the gate can judge
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	g.sweepLocked(now)
	if !isCircuit && g.trustedLocked(id, ip) {
		return true
	}
	pm, held := g.permits[id][ip]
	if held && now.Before(pm.grant) {
		return true
	}
	if until, closed := g.failed[ip]; closed && now.Before(until) {
		return false
	}
	if g.gate == nil || !held && g.countPermitsLocked() >= maxPermits || !g.gate.tryTake() {
		return false
	}
	pm.units++
	pm.grant, pm.settle = now.Add(gateGrant), now.Add(gateSettle)
	g.permitLocked(id, ip, pm)
	return true
}

// clear clears the IPs of addrs for id's newcomer dial that DialInfo runs
// within its own budget, until revoke, so that the gate does not take a
// second unit for it.
func (g *dialGuard) clear(id peer.ID, addrs []ma.Multiaddr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	until := g.now().Add(gateSettle)
	for _, a := range addrs {
		if ip, ok := addrIP(a); ok {
			pm := g.permits[id][ip]
			pm.grant = until
			if pm.settle.Before(until) {
				pm.settle = until
			}
			g.permitLocked(id, ip, pm)
		}
	}
}

// revoke ends the clearances clear gave.
func (g *dialGuard) revoke(id peer.ID, addrs []ma.Multiaddr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, a := range addrs {
		if ip, ok := addrIP(a); ok {
			if pm, held := g.permits[id][ip]; held && pm.units == 0 {
				delete(g.permits[id], ip)
			}
		}
	}
	if len(g.permits[id]) == 0 {
		delete(g.permits, id)
	}
}

func (g *dialGuard) permitLocked(id peer.ID, ip netip.Addr, pm permit) {
	m := g.permits[id]
	if m == nil {
		m = make(map[netip.Addr]permit)
		g.permits[id] = m
	}
	m[ip] = pm
	if g.sweepAt.IsZero() || pm.settle.Before(g.sweepAt) {
		g.sweepAt = pm.settle
	}
}

func (g *dialGuard) countPermitsLocked() int {
	n := 0
	for _, m := range g.permits {
		n += len(m)
	}
	return n
}

// connectedLocked settles id's permits once it connected: the units its
// newcomer dials held go back to the gate's budget.
func (g *dialGuard) connectedLocked(id peer.ID) {
	m, ok := g.permits[id]
	if !ok {
		return
	}
	for ip, pm := range m {
		if pm.units > 0 {
			for range pm.units {
				g.gate.give()
			}
			delete(m, ip)
		}
	}
	if len(m) == 0 {
		delete(g.permits, id)
	}
}

// sweepLocked drops the permits past their settle time: the IP of a
// newcomer dial whose peer never connected is closed to newcomer dials
// (fail), and its units stay spent.
func (g *dialGuard) sweepLocked(now time.Time) {
	if g.sweepAt.IsZero() || now.Before(g.sweepAt) {
		return
	}
	g.sweepAt = time.Time{}
	var failed []netip.Addr
	for id, m := range g.permits {
		for ip, pm := range m {
			switch {
			case now.Before(pm.settle):
				if g.sweepAt.IsZero() || pm.settle.Before(g.sweepAt) {
					g.sweepAt = pm.settle
				}
			case pm.units > 0:
				failed = append(failed, ip)
				delete(m, ip)
			default:
				delete(m, ip)
			}
		}
		if len(m) == 0 {
			delete(g.permits, id)
		}
	}
	for _, ip := range slices.Compact(failed) {
		g.failIPLocked(ip, now)
	}
}

// signedAddrs returns the addresses p signed as its own in the peer record
// identify received (nil when there is none).
func signedAddrs(ps peerstore.Peerstore, p peer.ID) []ma.Multiaddr {
	cab, ok := peerstore.GetCertifiedAddrBook(ps)
	if !ok {
		return nil
	}
	env := cab.GetPeerRecord(p)
	if env == nil {
		return nil
	}
	rec, err := env.Record()
	if err != nil {
		return nil
	}
	if pr, ok := rec.(*peer.PeerRecord); ok && pr.PeerID == p {
		return pr.Addrs
	}
	return nil
}
