package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
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
// there). The addresses of a peer never observed there are dialed within a
// budget per node (newcomer-dials at once, one more every
// newcomer-dial-interval) that bounds the dials that fail, not those that
// succeed: a newcomer dial holds one unit of the budget while it runs and
// gives it back when it connects, so that a node learning many honest peers
// at once (its own start, a join storm) dials them all, while a flood of
// invented peers soon spends it. A newcomer dial that fails also closes its
// IPs to newcomer dials for failedIPHold (unless a peer was observed
// there): invented peers at one address cost the few dials that ran at
// once per node, however many there are.
type dialGuard struct {
	budget *dialBudget // nil: no budget at all
	// gate is the budget of the newcomer dials that the host's gater lets
	// through (dialgate.go): addresses no part of the node cleared, from
	// DHT answers, LAN discovery and the like. It is apart from budget, so
	// that a peer feeding the DHT made-up peers cannot spend the dials the
	// dispatcher needs for workers, nor the reverse. nil: none.
	gate *dialBudget
	// listens returns the addresses a peer signed as its own (identify's
	// signed peer record, in the host's peerstore); nil: none known.
	listens func(peer.ID) []ma.Multiaddr

	mu       sync.Mutex
	observed map[peer.ID]*observation
	failed   map[netip.Addr]time.Time // IPs closed to newcomer dials, until
	// permits are the addresses cleared for dialing although their peer
	// was never observed at their IP (dialgate.go); sweepAt is when the
	// first of them runs out.
	permits map[peer.ID]map[netip.AddrPort]permit
	sweepAt time.Time
	// trusted are the bootstrap peers' addresses: the operator's word.
	trusted map[peer.ID][]netip.AddrPort
	now     func() time.Time
}

// failedIPHold is how long an IP at which a newcomer dial failed gets no
// other newcomer dial; maxFailedIPs bounds the IPs held (at the bound the
// one held longest makes room).
const (
	failedIPHold = time.Minute
	maxFailedIPs = 4096
)

type observation struct {
	ips []netip.Addr
	// addrs are the exact transport addresses (IP, transport, port) the
	// peer was observed at, for judging a relay's part of a relayed
	// address (vouches).
	addrs []ma.Multiaddr
	last  time.Time
}

func newDialGuard(dials int, every time.Duration) *dialGuard {
	g := &dialGuard{observed: make(map[peer.ID]*observation), failed: make(map[netip.Addr]time.Time),
		permits: make(map[peer.ID]map[netip.AddrPort]permit), trusted: make(map[peer.ID][]netip.AddrPort), now: time.Now}
	if dials > 0 {
		// The budgets' clock reads g.now when it is read, so that a test
		// that sets g.now moves them too.
		clock := func() time.Time { return g.now() }
		g.budget = newDialBudget(dials, every, clock)
		g.gate = newDialBudget(dials, every, clock)
	}
	return g
}

// notifiee observes the remote IP of every connection the host makes or
// takes.
func (g *dialGuard) notifiee() network.Notifiee {
	return &network.NotifyBundle{ConnectedF: func(_ network.Network, c network.Conn) {
		g.observe(c.RemotePeer(), c.RemoteMultiaddr(), c.Stat().Direction == network.DirOutbound)
	}}
}

// observe remembers that id was reached at (dialed: the node dialed the
// connection) or came from addr; a connection the node dialed also gives
// back the gate's newcomer units of the addresses at that IP
// (dialgate.go). A relayed connection says where the relay is, not the
// peer: it is not remembered as the peer's.
func (g *dialGuard) observe(id peer.ID, addr ma.Multiaddr, dialed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ip, ok := addrIP(addr)
	if ok && dialed {
		g.reachedLocked(id, ip)
	}
	g.sweepLocked(g.now())
	if !ok || isRelayAddr(addr) {
		return
	}
	o := g.observed[id]
	if o == nil {
		if len(g.observed) >= maxObservedPeers {
			g.evictOldestLocked()
		}
		o = &observation{}
		g.observed[id] = o
	}
	o.last = time.Now()
	if !slices.ContainsFunc(o.addrs, addr.Equal) {
		if len(o.addrs) >= maxObservedIPs {
			o.addrs = o.addrs[1:]
		}
		o.addrs = append(o.addrs, addr)
	}
	if slices.Contains(o.ips, ip) {
		return
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

// seenAtLocked reports whether id was observed at ip.
func (g *dialGuard) seenAtLocked(id peer.ID, ip netip.Addr) bool {
	o := g.observed[id]
	return o != nil && slices.Contains(o.ips, ip)
}

// vouches reports whether the node may dial a, an address of id, freely:
// a direct address at an IP the peer was observed at; a relayed address
// whose relay part is an address the relay was observed at exactly (IP,
// transport and port) or signed as its own (identify). A relay's IP is
// not enough: a record could then aim every dialer's attempts at other
// ports of an honest relay's host.
func (g *dialGuard) vouches(id peer.ID, a ma.Multiaddr) bool {
	relay, relayAddr, isCircuit := circuitParts(a)
	if !isCircuit {
		ip, ok := addrIP(a)
		if !ok {
			return false
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.seenAtLocked(id, ip)
	}
	if relay == "" || relayAddr == nil {
		return false
	}
	g.mu.Lock()
	o := g.observed[relay]
	seen := o != nil && slices.ContainsFunc(o.addrs, relayAddr.Equal)
	g.mu.Unlock()
	return seen || g.listens != nil && slices.ContainsFunc(g.listens(relay), relayAddr.Equal)
}

// vouched splits the addresses of id into those the node may dial freely
// (vouches) and the rest, returned as unvouched.
func (g *dialGuard) vouched(id peer.ID, addrs []ma.Multiaddr) (ok, unvouched []ma.Multiaddr) {
	for _, a := range addrs {
		if g.vouches(id, a) {
			ok = append(ok, a)
		} else {
			unvouched = append(unvouched, a)
		}
	}
	return ok, unvouched
}

// open drops the addresses at an IP closed to newcomer dials by a failed
// one (see failedIPHold).
func (g *dialGuard) open(addrs []ma.Multiaddr) []ma.Multiaddr {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	var out []ma.Multiaddr
	for _, a := range addrs {
		if ip, ok := addrIP(a); ok {
			if until, held := g.failed[ip]; held {
				if now.Before(until) {
					continue
				}
				delete(g.failed, ip)
			}
		}
		out = append(out, a)
	}
	return out
}

// fail closes the IPs of addrs to newcomer dials for failedIPHold, but
// not an IP some peer was observed at: a host there runs libp2p, and a
// dial to it that failed (a handshake or identify that timed out on a
// loaded host, a peer that just left) says nothing of the address's use
// as a mirror. Its failed dials stay bounded by the budget.
func (g *dialGuard) fail(addrs []ma.Multiaddr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	for _, a := range addrs {
		if ip, ok := addrIP(a); ok {
			g.failIPLocked(ip, now)
		}
	}
}

// failIPLocked closes ip to newcomer dials for failedIPHold from now (see
// fail).
func (g *dialGuard) failIPLocked(ip netip.Addr, now time.Time) {
	if g.anyObservedAtLocked(ip) {
		return
	}
	if _, held := g.failed[ip]; !held && len(g.failed) >= maxFailedIPs {
		var oldest netip.Addr
		var at time.Time
		for k, t := range g.failed {
			if !oldest.IsValid() || t.Before(at) {
				oldest, at = k, t
			}
		}
		delete(g.failed, oldest)
	}
	g.failed[ip] = now.Add(failedIPHold)
}

// anyObservedAtLocked reports whether some peer was observed at ip.
func (g *dialGuard) anyObservedAtLocked(ip netip.Addr) bool {
	for _, o := range g.observed {
		for _, have := range o.ips {
			if have == ip {
				return true
			}
		}
	}
	return false
}

// spend takes one newcomer dial from the budget, waiting for one within
// ctx while the budget is spent (a running newcomer dial that connects
// gives its unit back).
func (g *dialGuard) spend(ctx context.Context) bool {
	return g.budget != nil && g.budget.take(ctx)
}

// dialBudget is a token bucket whose tokens can be given back: a newcomer
// dial takes one, and returns it when it connected.
type dialBudget struct {
	mu     sync.Mutex
	tokens float64
	max    float64
	every  time.Duration // one more token each; <= 0: never short
	last   time.Time
	now    func() time.Time
	// more is closed (and replaced) when a token is given back.
	more chan struct{}
}

func newDialBudget(n int, every time.Duration, now func() time.Time) *dialBudget {
	return &dialBudget{tokens: float64(n), max: float64(n), every: every, last: now(), now: now, more: make(chan struct{})}
}

// take takes a token, waiting within ctx for one to grow or be given back;
// false when ctx ended first.
func (b *dialBudget) take(ctx context.Context) bool {
	for {
		b.mu.Lock()
		if b.every <= 0 {
			b.mu.Unlock()
			return true
		}
		b.refillLocked()
		if b.tokens >= 1 {
			b.tokens--
			b.mu.Unlock()
			return true
		}
		wait := time.Duration((1 - b.tokens) * float64(b.every))
		more := b.more
		b.mu.Unlock()
		if ctx.Err() != nil || ctx.Done() == nil {
			return false // no time to wait
		}
		t := time.NewTimer(wait)
		select {
		case <-more:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
		t.Stop()
	}
}

// refillLocked adds the tokens grown since the last look (none while the
// clock went back).
func (b *dialBudget) refillLocked() {
	now := b.now()
	if now.After(b.last) {
		b.tokens = min(b.max, b.tokens+float64(now.Sub(b.last))/float64(b.every))
	}
	b.last = now
}

// tryTake takes a token if there is one now, without waiting.
func (b *dialBudget) tryTake() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.every <= 0 {
		return true
	}
	b.refillLocked()
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// give returns a token taken by take.
func (b *dialBudget) give() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.max, b.tokens+1)
	close(b.more)
	b.more = make(chan struct{})
}

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

// circuitParts splits a /p2p-circuit address: its relay and the relay's
// transport address before the relay's /p2p (nil when it has none).
func circuitParts(a ma.Multiaddr) (relay peer.ID, relayAddr ma.Multiaddr, circuit bool) {
	for i, c := range a {
		switch c.Protocol().Code {
		case ma.P_CIRCUIT:
			return relay, relayAddr, true
		case ma.P_P2P:
			if id, err := peer.IDFromBytes(c.RawValue()); err == nil {
				relay = id
				if i > 0 {
					relayAddr = a[:i]
				}
			}
		}
	}
	return "", nil, false
}

// DialInfo returns the addresses the node may dial id at now: those of its
// record (and of the host's peerstore, which holds what connections and
// identify learned) at an IP the peer was observed at. When the record
// names no such address, its other addresses (less those at an IP where a
// newcomer dial failed lately) are returned within the newcomer budget,
// waiting within ctx while the budget is spent; when it stays spent, or no
// address is left, the error wraps ErrNewcomerBudget. The caller dials and
// then calls done with the dial's result (done is never nil): a newcomer
// dial that connected gives its budget back, one that failed closes its
// IPs to newcomer dials for a while. A peer the host is connected to needs
// no dial (no addresses, no error).
func (n *Node) DialInfo(ctx context.Context, id peer.ID) (info peer.AddrInfo, done func(error), err error) {
	info = peer.AddrInfo{ID: id}
	done = func(error) {}
	if n.host.Network().Connectedness(id) == network.Connected {
		return info, done, nil
	}
	var advertised []ma.Multiaddr
	if pi, ok := n.table.Get(id); ok {
		advertised = pi.Data.Multiaddrs()
	}
	ok, unvouched := n.guard.vouched(id, advertised)
	known, _ := n.guard.vouched(id, n.host.Peerstore().Addrs(id))
	info.Addrs = append(ok, known...)
	if len(info.Addrs) > 0 || len(unvouched) == 0 {
		return info, done, nil
	}
	open := n.guard.open(unvouched)
	if len(open) == 0 {
		return info, done, fmt.Errorf("%w: %s was never observed at any address its record names (%d), and a dial of another never-observed peer there failed within %s",
			ErrNewcomerBudget, id, len(unvouched), failedIPHold)
	}
	if !n.guard.spend(ctx) {
		return info, done, fmt.Errorf("%w: %s was never observed at any address its record names (%d); dialing it waits for the budget (newcomer-dials %d, one more every %s, given back by each newcomer dial that connects)",
			ErrNewcomerBudget, id, len(unvouched), n.cfg.NewcomerDials, n.cfg.NewcomerDialInterval)
	}
	info.Addrs = open
	n.guard.clear(id, open)
	var once sync.Once
	done = func(err error) {
		once.Do(func() {
			n.guard.revoke(id, open)
			switch {
			case err == nil:
				n.guard.budget.give()
			case errors.Is(err, context.Canceled):
				// Given up by the caller: nothing learnt of the address.
			default:
				n.guard.fail(open)
			}
		})
	}
	return info, done, nil
}
