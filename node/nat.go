package node

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	blankhost "github.com/libp2p/go-libp2p/p2p/host/blank"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	"github.com/libp2p/go-libp2p/p2p/host/peerstore/pstoremem"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/workmesh/workmesh/config"
)

// Connection states of a peer, as GET /v1/peers/selection and
// `workmesh peers` show them.
const (
	ConnDirect  = "direct"
	ConnRelayed = "relayed"
	ConnNone    = "none"
)

// natSettings are the NAT-related parts of a node's own host.
type natSettings struct {
	// services turns on AutoNAT, the relay client and service and hole
	// punching; off, the host is as plain as before (tests' bare hosts).
	services     bool
	reachability string
	announce     []ma.Multiaddr
	noAnnounce   []ma.Multiaddr
	staticRelays []peer.AddrInfo
	relayService bool
	relayLimit   relayLimits
	holePunching bool
}

// relayLimits are the resources the relay service hands out.
type relayLimits struct {
	reservations, circuits int
	bytes                  int64
	duration               time.Duration
}

// natSettingsOf parses the NAT settings of cfg.
func natSettingsOf(cfg config.NodeConfig) (natSettings, error) {
	s := natSettings{
		services:     true,
		reachability: cmpOr(cfg.Reachability, config.ReachabilityAuto),
		relayService: cfg.RelayService,
		holePunching: cfg.HolePunching,
		relayLimit: relayLimits{reservations: cfg.RelayMaxReservations, circuits: cfg.RelayMaxCircuits,
			bytes: int64(cfg.RelayLimitBytes), duration: cfg.RelayLimitDuration},
	}
	var err error
	if s.announce, err = parseAddrList("announce", cfg.Announce); err != nil {
		return s, err
	}
	if s.noAnnounce, err = parseAddrList("no-announce", cfg.NoAnnounce); err != nil {
		return s, err
	}
	if len(cfg.Relays) > 0 {
		if s.staticRelays, err = ParseBootstrap(cfg.Relays); err != nil {
			return s, fmt.Errorf("relay: %w", err)
		}
	}
	if err := applyPublicRanges(cfg.PublicRanges); err != nil {
		return s, err
	}
	return s, nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func parseAddrList(key string, list []string) ([]ma.Multiaddr, error) {
	out := make([]ma.Multiaddr, 0, len(list))
	for i, s := range list {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("%s entry %d %q: %w", key, i+1, s, err)
		}
		out = append(out, a)
	}
	return out, nil
}

var publicRangesMu sync.Mutex

// applyPublicRanges removes the given documentation ranges from the ranges
// go-multiaddr (and so every part of libp2p) counts as unroutable, so that
// a lab built on them behaves as the internet does. It changes the whole
// process: public-ranges is for lab nodes, one per process.
func applyPublicRanges(ranges []string) error {
	if len(ranges) == 0 {
		return nil
	}
	publicRangesMu.Lock()
	defer publicRangesMu.Unlock()
	for _, r := range ranges {
		_, want, err := net.ParseCIDR(r)
		if err != nil {
			return fmt.Errorf("public-ranges %q: %w", r, err)
		}
		manet.Unroutable4 = slices.DeleteFunc(manet.Unroutable4, func(n *net.IPNet) bool {
			return n.String() == want.String()
		})
	}
	return nil
}

// addrsFactory returns what the host advertises: the announce addresses
// instead of its own direct ones when set (relay addresses kept), without
// those no-announce names.
func (s natSettings) addrsFactory() func([]ma.Multiaddr) []ma.Multiaddr {
	if len(s.announce) == 0 && len(s.noAnnounce) == 0 {
		return nil
	}
	return func(addrs []ma.Multiaddr) []ma.Multiaddr {
		out := make([]ma.Multiaddr, 0, len(addrs)+len(s.announce))
		if len(s.announce) > 0 {
			out = append(out, s.announce...)
			for _, a := range addrs {
				if isRelayAddr(a) {
					out = append(out, a)
				}
			}
		} else {
			out = append(out, addrs...)
		}
		return slices.DeleteFunc(out, func(a ma.Multiaddr) bool {
			return slices.ContainsFunc(s.noAnnounce, func(n ma.Multiaddr) bool { return addrMatches(a, n) })
		})
	}
}

// addrMatches reports whether a is named by pattern: equal to it, starting
// with it (an /ip4/<addr> alone names every port there), or, for an
// /ip4/<net>/ipcidr/<bits> pattern, on an IP inside that network.
func addrMatches(a, pattern ma.Multiaddr) bool {
	ps := pattern.String()
	if strings.HasPrefix(a.String(), ps) {
		rest := strings.TrimPrefix(a.String(), ps)
		return rest == "" || strings.HasPrefix(rest, "/")
	}
	bits, err := pattern.ValueForProtocol(ma.P_IPCIDR)
	if err != nil {
		return false
	}
	ip, err := manet.ToIP(pattern)
	if err != nil {
		return false
	}
	_, network, err := net.ParseCIDR(ip.String() + "/" + bits)
	if err != nil {
		return false
	}
	aip, err := manet.ToIP(a)
	return err == nil && network.Contains(aip)
}

// isRelayAddr reports whether a goes through a relay (/p2p-circuit).
func isRelayAddr(a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_CIRCUIT)
	return err == nil
}

// addrGater keeps the host from dialing addresses it cannot reach: a node
// with no private address of its own (a public host) never dials another
// site's private address that a record or identify carried. Loopback,
// public and relay addresses are always dialed. Once the node set its dial
// guard in st, every address must also pass the guard's gate (dialgate.go).
type addrGater struct {
	onPrivateNet bool
	// onPublicNet: some interface address of the host is public.
	onPublicNet bool
	skipped     *atomic.Uint64
	// st holds the node's dial guard (nil: none, a bare host) and the
	// gate's refusals.
	st *natState
	// connected reports whether the host holds a connection (a relayed
	// one too) to a peer; set once the swarm exists.
	connected func(peer.ID) bool
}

// newAddrGater looks at the host's interface addresses once.
func newAddrGater(st *natState) *addrGater {
	g := &addrGater{skipped: &st.dialsSkipped, st: st}
	ifaddrs, err := manet.InterfaceMultiaddrs()
	if err != nil {
		g.onPrivateNet = true // unknown: dial as before
		return g
	}
	for _, a := range ifaddrs {
		switch {
		case manet.IsIPLoopback(a), manet.IsIP6LinkLocal(a):
		case manet.IsPublicAddr(a):
			g.onPublicNet = true
		default:
			g.onPrivateNet = true
		}
	}
	return g
}

// usable reports whether the host may dial a.
func (g *addrGater) usable(a ma.Multiaddr) bool {
	if g.onPrivateNet || isRelayAddr(a) || manet.IsIPLoopback(a) || manet.IsPublicAddr(a) {
		return true
	}
	if _, err := manet.ToIP(a); err != nil {
		return true // not an IP address (DNS and the like): not judged here
	}
	return false
}

func (g *addrGater) InterceptPeerDial(peer.ID) bool { return true }
func (g *addrGater) InterceptAddrDial(p peer.ID, a ma.Multiaddr) bool {
	if !g.usable(a) {
		g.skipped.Add(1)
		return false
	}
	if g.st == nil || g.connected == nil {
		return true
	}
	if guard := g.st.guard.Load(); guard == nil || guard.admitDial(p, a, g.connected) {
		return true
	}
	g.st.dialsGated.Add(1)
	return false
}
func (g *addrGater) InterceptAccept(network.ConnMultiaddrs) bool { return true }
func (g *addrGater) InterceptSecured(network.Direction, peer.ID, network.ConnMultiaddrs) bool {
	return true
}
func (g *addrGater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) {
	return true, 0
}

var _ connmgr.ConnectionGater = (*addrGater)(nil)

// natState is what the node knows about its place in the network: its
// reachability, hole punches, and the peers it may use as relays. It
// watches the host's event bus from start to Close.
type natState struct {
	reach        atomic.Int32 // network.Reachability
	hpTried      atomic.Uint64
	hpSucceeded  atomic.Uint64
	hpFailed     atomic.Uint64
	hpRetries    atomic.Uint64
	dialsSkipped atomic.Uint64
	// dialsGated counts the addresses the dial guard's gate refused.
	dialsGated  atomic.Uint64
	relayedWork atomic.Uint64
	// guard is the node's dial guard, which the host's gater consults
	// (set by the node once it exists).
	guard        atomic.Pointer[dialGuard]
	hpLastError  atomic.Pointer[string]
	staticRelays []peer.AddrInfo
	// tablePeers lists the peers of the node's table (set once the table
	// exists), candidates for a relay slot.
	tablePeers atomic.Pointer[func() []peer.AddrInfo]
	// onAddrs is called when the host's addresses change (set by the node
	// to re-sign its record).
	onAddrs atomic.Pointer[func()]

	h       host.Host
	sub     event.Subscription
	emitter event.Emitter // see assumePrivate
	done    chan struct{}
}

// Trace counts hole punches (holepunch.EventTracer).
func (s *natState) Trace(evt *holepunch.Event) {
	switch e := evt.Evt.(type) {
	case *holepunch.StartHolePunchEvt:
		s.hpTried.Add(1)
	case *holepunch.EndHolePunchEvt:
		if e.Success {
			s.hpSucceeded.Add(1)
		} else {
			s.hpFailed.Add(1)
			s.hpLastError.Store(&e.Error)
		}
	case *holepunch.ProtocolErrorEvt:
		// The punch did not start: the peer's service did not answer
		// (it knows no public address of its own yet) or broke off.
		msg := "hole punch protocol: " + e.Error
		s.hpLastError.Store(&msg)
	}
}

// watch starts following h's reachability and address events.
func (s *natState) watch(h host.Host) error {
	sub, err := h.EventBus().Subscribe([]any{new(event.EvtLocalReachabilityChanged), new(event.EvtLocalAddressesUpdated)},
		eventbus.Name("workmesh nat"))
	if err != nil {
		return fmt.Errorf("nat events: %w", err)
	}
	s.h, s.sub, s.done = h, sub, make(chan struct{})
	go func() {
		defer close(s.done)
		for ev := range sub.Out() {
			switch e := ev.(type) {
			case event.EvtLocalReachabilityChanged:
				s.reach.Store(int32(e.Reachability))
			case event.EvtLocalAddressesUpdated:
				if f := s.onAddrs.Load(); f != nil {
					(*f)()
				}
			}
		}
	}()
	return nil
}

// assumePrivate says the host is private until AutoNAT says otherwise:
// for a host with no public interface address, which sits behind NAT
// unless a port is forwarded to it. It then reserves a relay slot at once
// instead of waiting out AutoNAT's first dial back, which answers a failure
// only after 15s; a dial back that succeeds makes it public.
func (s *natState) assumePrivate(h host.Host) error {
	em, err := h.EventBus().Emitter(new(event.EvtLocalReachabilityChanged), eventbus.Stateful)
	if err != nil {
		return fmt.Errorf("reachability emitter: %w", err)
	}
	s.emitter = em
	return em.Emit(event.EvtLocalReachabilityChanged{Reachability: network.ReachabilityPrivate})
}

// Close stops watching.
func (s *natState) Close() error {
	if s.emitter != nil {
		s.emitter.Close()
	}
	if s.sub != nil {
		s.sub.Close()
		<-s.done
	}
	return nil
}

// Reachability names the node's reachability: public, private or unknown.
func (s *natState) Reachability() string {
	switch network.Reachability(s.reach.Load()) {
	case network.ReachabilityPublic:
		return config.ReachabilityPublic
	case network.ReachabilityPrivate:
		return config.ReachabilityPrivate
	}
	return "unknown"
}

// relayCandidates is the relay finder's peer source: the given relays
// first, then peers the node is connected to or knows from its table that
// have a public address. Which of them offer the relay service the finder
// learns by asking.
func (s *natState) relayCandidates(_ context.Context, num int) <-chan peer.AddrInfo {
	var cands []peer.AddrInfo
	cands = append(cands, s.staticRelays...)
	if f := s.tablePeers.Load(); f != nil {
		cands = append(cands, (*f)()...)
	}
	if s.h != nil {
		for _, p := range s.h.Network().Peers() {
			cands = append(cands, peer.AddrInfo{ID: p, Addrs: s.h.Peerstore().Addrs(p)})
		}
	}
	out := make(chan peer.AddrInfo, max(0, min(num, len(cands))))
	seen := map[peer.ID]bool{}
	for _, c := range cands {
		if len(out) == cap(out) {
			break
		}
		if seen[c.ID] || (s.h != nil && c.ID == s.h.ID()) {
			continue
		}
		var public []ma.Multiaddr
		for _, a := range c.Addrs {
			if !isRelayAddr(a) && manet.IsPublicAddr(a) {
				public = append(public, a)
			}
		}
		if len(public) == 0 {
			continue
		}
		seen[c.ID] = true
		out <- peer.AddrInfo{ID: c.ID, Addrs: public}
	}
	close(out)
	return out
}

// relayReservations counts the relays the host holds a slot on: the
// distinct relays in its own /p2p-circuit addresses.
func relayReservations(h host.Host) int {
	relays := map[string]bool{}
	for _, a := range h.Addrs() {
		if !isRelayAddr(a) {
			continue
		}
		relay, _ := ma.SplitFunc(a, func(c ma.Component) bool { return c.Code() == ma.P_CIRCUIT })
		relays[relay.String()] = true
	}
	return len(relays)
}

// connState says how the host is connected to p: direct when some
// connection to it is not relayed, relayed when only relayed (limited)
// ones are, none without a connection.
func connState(h host.Host, p peer.ID) string {
	conns := h.Network().ConnsToPeer(p)
	if len(conns) == 0 {
		return ConnNone
	}
	for _, c := range conns {
		if !c.Stat().Limited && !isRelayAddr(c.RemoteMultiaddr()) {
			return ConnDirect
		}
	}
	return ConnRelayed
}

// dialBackTimeout bounds one AutoNAT dial back.
const dialBackTimeout = 3 * time.Second

// newDialerHost returns the host AutoNAT dials back from: its own key and
// sockets, so that a dial back proves an address is reachable by anyone,
// not only by a peer the node already talks to.
func newDialerHost(rm network.ResourceManager) (_ host.Host, closeAll func() error, err error) {
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	pid, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	ps, err := pstoremem.NewPeerstore()
	if err != nil {
		return nil, nil, err
	}
	_ = ps.AddPrivKey(pid, key)
	_ = ps.AddPubKey(pid, key.GetPublic())
	reuse, err := newQUICConnManager(key, rm)
	if err != nil {
		ps.Close()
		return nil, nil, err
	}
	sw, err := swarm.NewSwarm(pid, ps, eventbus.NewBus(),
		swarm.WithResourceManager(rm),
		// A dial back answers "not reachable" once this passes (AutoNAT
		// v1 would wait 15s): what a node behind NAT waits to learn it
		// is, before it reserves a relay slot.
		swarm.WithDialTimeout(dialBackTimeout),
		swarm.WithReadOnlyBlackHoleDetector(),
		swarm.WithDialRanker(swarm.NoDelayDialRanker))
	if err != nil {
		reuse.Close()
		ps.Close()
		return nil, nil, err
	}
	closeAll = func() error {
		err := sw.Close()
		reuse.Close()
		ps.Close()
		return err
	}
	qt, err := quic.NewTransport(key, reuse, nil, nil, rm)
	if err == nil {
		err = sw.AddTransport(qt)
	}
	if err == nil {
		t, terr := newTCPTransport(key, rm)
		if err = terr; err == nil {
			err = sw.AddTransport(t)
		}
	}
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return blankhost.NewBlankHost(sw), closeAll, nil
}
