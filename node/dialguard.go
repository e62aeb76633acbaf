package node

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"golang.org/x/time/rate"
)

// ErrNewcomerBudget is wrapped by DialInfo's error when a peer's record
// names only addresses at which the peer was never observed, and the
// node's budget for dialing such addresses is spent for now.
var ErrNewcomerBudget = errors.New("newcomer dial budget spent")

// Bounds of what the dial guard remembers.
const (
	// maxObservedIPs bounds the IPs remembered per peer.
	maxObservedIPs = 8
	// maxObservedPeers bounds the peers whose IPs are remembered; at the
	// bound the oldest observation makes room.
	maxObservedPeers = 16384
)

// dialGuard decides which advertised addresses of a peer the node may dial.
// A record's addresses are the word of whoever signed it: a peer nobody
// connected to can advertise any address, and every node that dials it
// sends packets there. So an address is dialed freely only when its IP is
// one the peer itself was observed at (a connection to or from it came from
// there); the addresses of a peer never observed there are dialed only
// within a small budget per node (newcomer-dials, one more every
// newcomer-dial-interval), which a newcomer needs and a flood of invented
// peers soon spends.
type dialGuard struct {
	budget *rate.Limiter // nil: no budget at all

	mu       sync.Mutex
	observed map[peer.ID]*observation
}

type observation struct {
	ips  []netip.Addr
	last time.Time
}

func newDialGuard(dials int, every time.Duration) *dialGuard {
	g := &dialGuard{observed: make(map[peer.ID]*observation)}
	if dials > 0 {
		lim := rate.Inf
		if every > 0 {
			lim = rate.Every(every)
		}
		g.budget = rate.NewLimiter(lim, dials)
	}
	return g
}

// notifiee observes the remote IP of every connection the host makes or
// takes.
func (g *dialGuard) notifiee() network.Notifiee {
	return &network.NotifyBundle{ConnectedF: func(_ network.Network, c network.Conn) {
		g.observe(c.RemotePeer(), c.RemoteMultiaddr())
	}}
}

// observe remembers that id was reached at (or came from) addr.
func (g *dialGuard) observe(id peer.ID, addr ma.Multiaddr) {
	ip, ok := addrIP(addr)
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	o := g.observed[id]
	if o == nil {
		if len(g.observed) >= maxObservedPeers {
			g.evictOldestLocked()
		}
		o = &observation{}
		g.observed[id] = o
	}
	o.last = time.Now()
	for _, have := range o.ips {
		if have == ip {
			return
		}
	}
	if len(o.ips) >= maxObservedIPs {
		o.ips = o.ips[1:]
	}
	o.ips = append(o.ips, ip)
}

func (g *dialGuard) evictOldestLocked() {
	var oldest peer.ID
	var at time.Time
	for id, o := range g.observed {
		if oldest == "" || o.last.Before(at) {
			oldest, at = id, o.last
		}
	}
	delete(g.observed, oldest)
}

// seenAt reports whether id was observed at ip.
func (g *dialGuard) seenAt(id peer.ID, ip netip.Addr) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if o := g.observed[id]; o != nil {
		for _, have := range o.ips {
			if have == ip {
				return true
			}
		}
	}
	return false
}

// vouched splits the addresses of id into those the node may dial freely:
// at an IP where the peer (or, for a relayed address, its relay) was
// observed; the rest are returned as unvouched.
func (g *dialGuard) vouched(id peer.ID, addrs []ma.Multiaddr) (ok, unvouched []ma.Multiaddr) {
	for _, a := range addrs {
		who := id
		if relay, isCircuit := circuitRelay(a); isCircuit {
			who = relay
		}
		if ip, has := addrIP(a); has && who != "" && g.seenAt(who, ip) {
			ok = append(ok, a)
		} else {
			unvouched = append(unvouched, a)
		}
	}
	return ok, unvouched
}

// spend takes one newcomer dial from the budget.
func (g *dialGuard) spend() bool { return g.budget != nil && g.budget.Allow() }

// addrIP returns the IP of the first IP component of a.
func addrIP(a ma.Multiaddr) (netip.Addr, bool) {
	if a == nil {
		return netip.Addr{}, false
	}
	nip, err := manet.ToIP(a)
	if err != nil {
		// ToIP wants the address to start with the IP; a relayed
		// address does, so this covers every address with an IP.
		return netip.Addr{}, false
	}
	ip, ok := netip.AddrFromSlice(nip)
	return ip.Unmap(), ok
}

// circuitRelay returns the relay of a /p2p-circuit address.
func circuitRelay(a ma.Multiaddr) (peer.ID, bool) {
	circuit := false
	var relay peer.ID
	for _, c := range a {
		switch c.Protocol().Code {
		case ma.P_CIRCUIT:
			circuit = true
		case ma.P_P2P:
			if !circuit {
				if id, err := peer.IDFromBytes(c.RawValue()); err == nil {
					relay = id
				}
			}
		}
	}
	return relay, circuit
}

// DialInfo returns the addresses the node may dial id at now: those of its
// record (and of the host's peerstore, which holds what connections and
// identify learned) at an IP the peer was observed at. When the record
// names no such address, its other addresses are returned within the
// newcomer budget; once that is spent the error wraps ErrNewcomerBudget.
// A peer the host is connected to needs no dial (no addresses, no error).
func (n *Node) DialInfo(id peer.ID) (peer.AddrInfo, error) {
	info := peer.AddrInfo{ID: id}
	if n.host.Network().Connectedness(id) == network.Connected {
		return info, nil
	}
	var advertised []ma.Multiaddr
	if pi, ok := n.table.Get(id); ok {
		advertised = pi.Data.Multiaddrs()
	}
	ok, unvouched := n.guard.vouched(id, advertised)
	known, _ := n.guard.vouched(id, n.host.Peerstore().Addrs(id))
	info.Addrs = append(ok, known...)
	if len(info.Addrs) > 0 || len(unvouched) == 0 {
		return info, nil
	}
	if !n.guard.spend() {
		return info, fmt.Errorf("%w: %s was never observed at any address its record names (%d); dialing it waits for the budget (newcomer-dials %d, one more every %s)",
			ErrNewcomerBudget, id, len(unvouched), n.cfg.NewcomerDials, n.cfg.NewcomerDialInterval)
	}
	info.Addrs = unvouched
	return info, nil
}
