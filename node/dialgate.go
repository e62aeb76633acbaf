package node

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"
	madns "github.com/multiformats/go-multiaddr-dns"
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
//     bootstrap peers the operator configured (at the IPs and ports given,
//     a name at those it resolves to when the node dials it);
//   - else within the gate's own newcomer budget (the size and rate of the
//     newcomer-dials settings): each address (IP and port) a dial may use
//     takes a unit. The units of the addresses at the IP the node then
//     reaches the peer at, by a connection it dialed, go back; the others
//     stay spent, and once gateSettle passed they close their IPs to
//     newcomer dials for failedIPHold, as a failed DialInfo dial does. A
//     connection the peer opens gives nothing back: whoever holds a made-up
//     identity's key could otherwise recycle the units of the addresses it
//     named. The gate never waits: with the budget spent, the address is
//     refused (the DHT query counts the peer unreachable and goes on).

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

// permit clears one address (IP and port) of a peer for dials until grant,
// and is judged at settle. units are the gate's budget units its dials
// hold, given back when the node reaches the peer at its IP; at settle, a
// permit still holding units closes its IP to newcomer dials. DialInfo's
// permits hold none: its own budget pays for its dial.
type permit struct {
	grant, settle time.Time
	units         int
}

// trust clears the given addresses of the bootstrap peers, the operator's
// word, for good, by IP and port. An address given by a name is cleared at
// the addresses it resolves to, when the node dials it (membership).
func (g *dialGuard) trust(peers []peer.AddrInfo) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, ai := range peers {
		for _, a := range ai.Addrs {
			if ap, ok := addrPort(a); ok && !isRelayAddr(a) && !slices.Contains(g.trusted[ai.ID], ap) {
				g.trusted[ai.ID] = append(g.trusted[ai.ID], ap)
			}
		}
	}
}

// trustNames resolves the names among a bootstrap peer's configured
// addresses and clears the addresses they resolve to now, as trust cleared
// the configured IP addresses at start (membership calls it before each
// dial of a bootstrap peer): the host resolves a name before the gate sees
// the address, and trusting any address of a peer configured by a name
// would let a DHT answer naming that peer aim the node's dials anywhere.
func (g *dialGuard) trustNames(ctx context.Context, ai peer.AddrInfo) {
	var resolved []ma.Multiaddr
	for _, a := range ai.Addrs {
		if _, ok := addrIP(a); ok || !madns.Matches(a) {
			continue
		}
		if rs, err := madns.DefaultResolver.Resolve(ctx, a); err == nil {
			resolved = append(resolved, rs...)
		} // else the dial fails on the same name, and says so
	}
	if len(resolved) > 0 {
		g.trust([]peer.AddrInfo{{ID: ai.ID, Addrs: resolved}})
	}
}

// addrPort returns the IP and port of a's first IP and TCP or UDP
// components.
func addrPort(a ma.Multiaddr) (netip.AddrPort, bool) {
	ip, ok := addrIP(a)
	if !ok {
		return netip.AddrPort{}, false
	}
	for _, c := range a {
		switch c.Protocol().Code {
		case ma.P_TCP, ma.P_UDP:
			port, err := strconv.ParseUint(c.Value(), 10, 16)
			if err != nil {
				return netip.AddrPort{}, false
			}
			return netip.AddrPortFrom(ip, uint16(port)), true
		}
	}
	return netip.AddrPort{}, false
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
	ap, ok := addrPort(a)
	if !ok {
		return false // not an IP address and port: nothing the gate can judge
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	g.sweepLocked(now)
	if !isCircuit && slices.Contains(g.trusted[id], ap) {
		return true
	}
	pm, held := g.permits[id][ap]
	if held && now.Before(pm.grant) {
		return true
	}
	if until, closed := g.failed[ap.Addr()]; closed && now.Before(until) {
		return false
	}
	if g.gate == nil || !held && g.countPermitsLocked() >= maxPermits || !g.gate.tryTake() {
		return false
	}
	pm.units++
	pm.grant, pm.settle = now.Add(gateGrant), now.Add(gateSettle)
	g.permitLocked(id, ap, pm)
	return true
}

// clear clears addrs for id's newcomer dial that DialInfo runs within its
// own budget, until revoke, so that the gate does not take a second unit
// for it.
func (g *dialGuard) clear(id peer.ID, addrs []ma.Multiaddr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	until := g.now().Add(gateSettle)
	for _, a := range addrs {
		if ap, ok := addrPort(a); ok {
			pm := g.permits[id][ap]
			pm.grant = until
			if pm.settle.Before(until) {
				pm.settle = until
			}
			g.permitLocked(id, ap, pm)
		}
	}
}

// revoke ends the clearances clear gave.
func (g *dialGuard) revoke(id peer.ID, addrs []ma.Multiaddr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, a := range addrs {
		if ap, ok := addrPort(a); ok {
			if pm, held := g.permits[id][ap]; held && pm.units == 0 {
				delete(g.permits[id], ap)
			}
		}
	}
	if len(g.permits[id]) == 0 {
		delete(g.permits, id)
	}
}

func (g *dialGuard) permitLocked(id peer.ID, ap netip.AddrPort, pm permit) {
	m := g.permits[id]
	if m == nil {
		m = make(map[netip.AddrPort]permit)
		g.permits[id] = m
	}
	m[ap] = pm
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

// reachedLocked settles id's permits at ip once a connection the node
// dialed reached the peer there: the units they held go back to the gate's
// budget.
func (g *dialGuard) reachedLocked(id peer.ID, ip netip.Addr) {
	m, ok := g.permits[id]
	if !ok {
		return
	}
	for ap, pm := range m {
		if pm.units > 0 && ap.Addr() == ip {
			for range pm.units {
				g.gate.give()
			}
			delete(m, ap)
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
		for ap, pm := range m {
			switch {
			case now.Before(pm.settle):
				if g.sweepAt.IsZero() || pm.settle.Before(g.sweepAt) {
					g.sweepAt = pm.settle
				}
			case pm.units > 0:
				failed = append(failed, ap.Addr())
				delete(m, ap)
			default:
				delete(m, ap)
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
