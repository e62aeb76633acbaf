package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	libp2pconfig "github.com/libp2p/go-libp2p/config"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/sec"
	"github.com/libp2p/go-libp2p/core/transport"
	"github.com/libp2p/go-libp2p/p2p/host/autonat"
	"github.com/libp2p/go-libp2p/p2p/host/autorelay"
	bhost "github.com/libp2p/go-libp2p/p2p/host/basic"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	"github.com/libp2p/go-libp2p/p2p/host/observedaddrs"
	"github.com/libp2p/go-libp2p/p2p/host/peerstore/pstoremem"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/libp2p/go-libp2p/p2p/net/upgrader"
	"github.com/libp2p/go-libp2p/p2p/protocol/autonatv2"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	tls "github.com/libp2p/go-libp2p/p2p/security/tls"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/quicreuse"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	msmux "github.com/multiformats/go-multistream"
	quicgo "github.com/quic-go/quic-go"
	"github.com/workmesh/workmesh/config"
)

// ConnLowWater and ConnHighWater are the connection manager's bounds: past
// the high water mark it closes the least useful connections (the peers
// it was told to protect kept) until the low water mark is reached.
const (
	ConnLowWater  = 160
	ConnHighWater = 192
)

// newHost builds a plain libp2p host, without the NAT services (AutoNAT,
// relays, hole punching): for tests that need a bare host.
func newHost(key crypto.PrivKey, netName, version string, listen []ma.Multiaddr, _ bool) (host.Host, error) {
	return newNodeHost(key, netName, version, listen, natSettings{}, &natState{})
}

// newNodeHost builds the libp2p host: QUIC and TCP (dialing both, listening
// where listen says), no NAT port mapping, no metrics, go-libp2p's default
// connection manager (160 to 192 connections), identify with
// observed-address discovery, and with nat.services: AutoNAT v1 and v2
// (client and service, dialing back from a host of their own), the circuit
// relay v2 transport and, while public, service (bounded by
// nat.relayLimit), a relay finder fed from st.relayCandidates while not
// public, and hole punching (DCUtR). Every dial passes st's address gater.
//
// It assembles the host from go-libp2p's parts (peerstore, event bus,
// swarm, transports, basic host) as libp2p.New would with these options,
// but without libp2p.New's dependency-injection container: building that
// graph cost about 3ms of CPU per host, more than half of a node's start,
// which sits on the path of every join (bench/README.md, "Building the host"). Without
// libp2p.New the event bus also carries no metrics tracer, which
// libp2p.New attaches even with metrics disabled.
func newNodeHost(key crypto.PrivKey, netName, version string, listen []ma.Multiaddr, nat natSettings, st *natState) (_ host.Host, err error) {
	// closers undo, in reverse, what was built when a later step fails;
	// once the basic host exists, its Close takes over the parts it owns.
	var closers []func() error
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				_ = closers[i]()
			}
		}
	}()
	rm, err := newResourceManager(netName)
	if err != nil {
		return nil, err
	}
	closers = append(closers, rm.Close)
	pid, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("libp2p host: peer ID: %w", err)
	}
	ps, err := pstoremem.NewPeerstore()
	if err != nil {
		return nil, fmt.Errorf("libp2p host: peerstore: %w", err)
	}
	closers = append(closers, ps.Close)
	if err := ps.AddPrivKey(pid, key); err != nil {
		return nil, fmt.Errorf("libp2p host: peerstore: %w", err)
	}
	if err := ps.AddPubKey(pid, key.GetPublic()); err != nil {
		return nil, fmt.Errorf("libp2p host: peerstore: %w", err)
	}
	bus := eventbus.NewBus()

	reuse, err := newQUICConnManager(key, rm)
	if err != nil {
		return nil, fmt.Errorf("libp2p host: quic: %w", err)
	}
	closers = append(closers, reuse.Close)
	gater := newAddrGater(st)
	sw, err := swarm.NewSwarm(pid, ps, bus,
		swarm.WithResourceManager(rm),
		swarm.WithConnectionGater(gater),
		// QUIC is the transport workmesh prefers; a "UDP black hole"
		// verdict after a few failed dials would cut a node off from it.
		swarm.WithUDPBlackHoleSuccessCounter(nil))
	if err != nil {
		return nil, fmt.Errorf("libp2p host: swarm: %w", err)
	}
	closers = append(closers, sw.Close)
	gater.connected = func(p peer.ID) bool {
		c := sw.Connectedness(p)
		return c == network.Connected || c == network.Limited
	}
	qt, err := quic.NewTransport(key, reuse, nil, nil, rm)
	if err != nil {
		return nil, fmt.Errorf("libp2p host: quic: %w", err)
	}
	if err := sw.AddTransport(qt); err != nil {
		return nil, fmt.Errorf("libp2p host: quic: %w", err)
	}
	// TCP always dials, so that a node reaches peers (and a site whose
	// router drops UDP reaches anyone) on TCP; it listens where listen says.
	up, err := newUpgrader(key, rm)
	if err != nil {
		return nil, fmt.Errorf("libp2p host: tcp: %w", err)
	}
	tt, err := tcp.NewTCPTransport(up, rm, nil)
	if err != nil {
		return nil, fmt.Errorf("libp2p host: tcp: %w", err)
	}
	if err := sw.AddTransport(tt); err != nil {
		return nil, fmt.Errorf("libp2p host: tcp: %w", err)
	}
	observed, err := observedaddrs.NewManager(bus, sw)
	if err != nil {
		return nil, fmt.Errorf("libp2p host: observed addresses: %w", err)
	}
	closers = append(closers, observed.Close)
	cm, err := connmgr.NewConnManager(ConnLowWater, ConnHighWater)
	if err != nil {
		return nil, fmt.Errorf("libp2p host: connection manager: %w", err)
	}
	closers = append(closers, cm.Close)
	opts := &bhost.HostOpts{
		EventBus:             bus,
		ConnManager:          cm,
		UserAgent:            "workmesh/" + version,
		ObservedAddrsManager: observed,
		AddrsFactory:         nat.addrsFactory(),
		// No ping service: the health protocol is workmesh's ping.
	}
	var (
		dialer      host.Host
		closeDialer func() error
	)
	if nat.services {
		if dialer, closeDialer, err = newDialerHost(rm); err != nil {
			return nil, fmt.Errorf("libp2p host: autonat dialer: %w", err)
		}
		closers = append(closers, closeDialer)
		if opts.AutoNATv2, err = autonatv2.New(dialer); err != nil {
			return nil, fmt.Errorf("libp2p host: autonat v2: %w", err)
		}
		opts.EnableRelayService = nat.relayService
		opts.RelayServiceOpts = []relayv2.Option{relayv2.WithResources(relayResources(nat.relayLimit))}
		// Hole punching is the punch retrier's (newPunchRetrier).
	}
	bh, err := bhost.NewHost(sw, opts)
	if err != nil {
		return nil, fmt.Errorf("libp2p host: %w", err)
	}
	h := &ownedHost{BasicHost: bh, after: []func() error{observed.Close, reuse.Close}}
	if closeDialer != nil {
		h.after = append(h.after, closeDialer)
	}
	// A basic host that fails before Start (a listen address in use)
	// is started to be closed: AutoNAT's server, among its parts, learns
	// its host only in Start, and its Close would panic without it.
	started := false
	closers = []func() error{func() error {
		if !started {
			bh.Start()
		}
		return h.Close()
	}}
	if nat.services {
		if err := client.AddTransport(bh, up); err != nil {
			return nil, fmt.Errorf("libp2p host: relay transport: %w", err)
		}
	}
	if err := sw.Listen(listen...); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrListen, err)
	}
	observed.Start(sw)
	if err := st.watch(bh); err != nil {
		return nil, err
	}
	h.before = append(h.before, st.Close)
	if nat.services && nat.holePunching {
		own := bh.AllAddrs
		if f := nat.addrsFactory(); f != nil {
			own = func() []ma.Multiaddr { return f(bh.AllAddrs()) }
		}
		punch, err := newPunchRetrier(bh, bh.IDService(), publicAddrs(own, observed.Addrs), st)
		if err != nil {
			return nil, fmt.Errorf("libp2p host: hole punching: %w", err)
		}
		h.before = append(h.before, punch.Close)
		punch.start()
	}
	bh.Start()
	started = true
	if !nat.services {
		return h, nil
	}
	if err := startAutoNAT(bh, dialer, nat.reachability); err != nil {
		return nil, err
	}
	if nat.reachability == config.ReachabilityAuto && !gater.onPublicNet {
		if err := st.assumePrivate(bh); err != nil {
			return nil, err
		}
	}
	if nat.reachability != config.ReachabilityPublic {
		st.staticRelays = nat.staticRelays
		ar, err := autorelay.NewAutoRelay(bh,
			autorelay.WithPeerSource(st.relayCandidates),
			autorelay.WithBootDelay(0),
			autorelay.WithMinCandidates(1),
			autorelay.WithNumRelays(2),
			autorelay.WithMinInterval(time.Second),
			autorelay.WithBackoff(10*time.Second))
		if err != nil {
			return nil, fmt.Errorf("libp2p host: relay finder: %w", err)
		}
		ar.Start()
		h.before = append([]func() error{func() error { return closeAutoRelay(ar) }}, h.before...)
	}
	return h, nil
}

// closeAutoRelay closes ar twice. go-libp2p's AutoRelay.Close cancels its
// event loop, stops the relay finder, then waits for the loop; a
// reachability event the loop takes in between starts the finder again,
// and nothing stops it (TestHost_CloseReleasesEverything found its four
// goroutines left after Close, once in a few hundred hosts). The second
// Close, with the loop gone, stops a finder started so.
func closeAutoRelay(ar *autorelay.AutoRelay) error {
	err := ar.Close()
	_ = ar.Close()
	return err
}

// startAutoNAT starts AutoNAT v1 on h: answering others' dial-back
// requests from dialer, and, with reachability auto, asking public peers
// to dial this host back (at once, then every few seconds until sure);
// public or private is taken as said. Its verdict drives the relay
// finder and the relay service.
func startAutoNAT(h *bhost.BasicHost, dialer host.Host, reachability string) error {
	opts := []autonat.Option{
		autonat.EnableService(dialer.Network()),
		autonat.UsingAddresses(func() []ma.Multiaddr {
			return slices.DeleteFunc(h.AllAddrs(), func(a ma.Multiaddr) bool { return !manet.IsPublicAddr(a) })
		}),
	}
	switch reachability {
	case config.ReachabilityPublic:
		opts = append(opts, autonat.WithReachability(network.ReachabilityPublic))
	case config.ReachabilityPrivate:
		opts = append(opts, autonat.WithReachability(network.ReachabilityPrivate))
	default:
		opts = append(opts, autonat.WithoutStartupDelay(), autonat.WithSchedule(2*time.Second, 5*time.Minute))
	}
	an, err := autonat.New(h, opts...)
	if err != nil {
		return fmt.Errorf("libp2p host: autonat: %w", err)
	}
	h.SetAutoNat(an)
	return nil
}

// relayResources are libp2p's relay v2 defaults with the node's bounds.
func relayResources(l relayLimits) relayv2.Resources {
	rc := relayv2.DefaultResources()
	if l.reservations > 0 {
		rc.MaxReservations = l.reservations
	}
	if l.circuits > 0 {
		rc.MaxCircuits = l.circuits
	}
	rc.Limit = &relayv2.RelayLimit{Duration: l.duration, Data: l.bytes}
	if rc.Limit.Duration <= 0 {
		rc.Limit.Duration = relayv2.DefaultLimit().Duration
	}
	if rc.Limit.Data <= 0 {
		rc.Limit.Data = relayv2.DefaultLimit().Data
	}
	return rc
}

// ownedHost is a basic host together with the parts it does not close
// itself.
type ownedHost struct {
	*bhost.BasicHost
	before []func() error // closed before the host, in order
	after  []func() error // closed after the host, in order
}

// Close stops the parts that use the host (the relay finder, the event
// watcher), closes the host (its swarm, connections, peerstore, resource
// and connection managers, AutoNAT, relay service, hole punching), then the
// observed-address manager, the QUIC sockets and the AutoNAT dialer.
func (h *ownedHost) Close() error {
	var err error
	for _, c := range h.before {
		err = errors.Join(err, c())
	}
	err = errors.Join(err, h.BasicHost.Close())
	for _, c := range h.after {
		err = errors.Join(err, c())
	}
	return err
}

// newQUICConnManager returns the QUIC socket manager, set up as libp2p.New
// sets it up: the stateless-reset and token keys derive from the host key,
// and each inbound connection is admitted by the resource manager before
// its handshake.
func newQUICConnManager(key crypto.PrivKey, rm network.ResourceManager) (*quicreuse.ConnManager, error) {
	resetKey, err := libp2pconfig.PrivKeyToStatelessResetKey(key)
	if err != nil {
		return nil, err
	}
	tokenKey, err := libp2pconfig.PrivKeyToTokenGeneratorKey(key)
	if err != nil {
		return nil, err
	}
	return quicreuse.NewConnManager(resetKey, tokenKey,
		quicreuse.ConnContext(func(ctx context.Context, ci *quicgo.ClientInfo) (context.Context, error) {
			// The resource manager decides about a connection whose
			// address does not convert, too.
			addr, err := quicreuse.ToQuicMultiaddr(ci.RemoteAddr, quicgo.Version1)
			if err != nil {
				addr = nil
			}
			scope, err := rm.OpenConnection(network.DirInbound, false, addr)
			if err != nil {
				return ctx, err
			}
			ctx = network.WithConnManagementScope(ctx, scope)
			context.AfterFunc(ctx, scope.Done)
			return ctx, nil
		}),
		quicreuse.VerifySourceAddress(rm.VerifySourceAddress))
}

// newUpgrader returns the upgrader of TCP and relayed connections, as
// libp2p.New's default: TLS, then Noise, for security, and yamux for streams.
func newUpgrader(key crypto.PrivKey, rm network.ResourceManager) (transport.Upgrader, error) {
	muxers := []upgrader.StreamMuxer{{ID: yamux.ID, Muxer: yamux.DefaultTransport}}
	tlsSec, err := tls.New(tls.ID, key, muxers)
	if err != nil {
		return nil, err
	}
	noiseSec, err := noise.New(noise.ID, key, muxers)
	if err != nil {
		return nil, err
	}
	return upgrader.New([]sec.SecureTransport{tlsSec, noiseSec}, muxers, nil, rm, nil)
}

// newTCPTransport returns a TCP transport upgraded by newUpgrader.
func newTCPTransport(key crypto.PrivKey, rm network.ResourceManager) (*tcp.TcpTransport, error) {
	up, err := newUpgrader(key, rm)
	if err != nil {
		return nil, err
	}
	return tcp.NewTCPTransport(up, rm, nil)
}

// newStreamEager opens a stream for proto to p over an existing connection
// without waiting for identify, which NewStream does to learn what p speaks:
// the protocol is named optimistically (multistream's lazy select) and a
// peer that does not speak it fails the first read. It is for the one
// exchange where identify's round trip sits on the critical path: a joining
// node's push to its bootstrap peer, which serves the protocol unless it is
// not a workmesh node of this network at all.
func newStreamEager(ctx context.Context, h host.Host, p peer.ID, proto protocol.ID) (network.Stream, error) {
	s, err := h.Network().NewStream(network.WithNoDial(ctx, "connected"), p)
	if err != nil {
		return nil, err
	}
	if err := s.SetProtocol(proto); err != nil {
		s.Reset()
		return nil, err
	}
	return &eagerStream{Stream: s, rw: msmux.NewMSSelect(s, proto)}, nil
}

// eagerStream reads and writes through multistream's lazy select, as
// go-libp2p's host does for a protocol it knows the peer speaks.
type eagerStream struct {
	network.Stream
	rw io.ReadWriteCloser
}

func (s *eagerStream) Read(b []byte) (int, error)  { return s.rw.Read(b) }
func (s *eagerStream) Write(b []byte) (int, error) { return s.rw.Write(b) }
func (s *eagerStream) Close() error                { return s.rw.Close() }

// CloseWrite sends the select handshake first if nothing was written yet.
func (s *eagerStream) CloseWrite() error {
	if f, ok := s.rw.(interface{ Flush() error }); ok {
		_ = f.Flush()
	}
	return s.Stream.CloseWrite()
}

// nodeHost is the libp2p host a node runs on, its own or one given with
// WithHost, together with what Close must do with it: close a host of its
// own; on a borrowed one, remove only the protocol handlers the node added.
type nodeHost struct {
	host.Host
	owned bool
	// before are the protocols a borrowed host served before the node
	// started on it; added are those the node added (see claim).
	before []protocol.ID
	added  []protocol.ID
	// nat follows the host's reachability and addresses.
	nat *natState
}

// hostIdentity returns the key the node signs with, the addresses its own
// host will listen on (none on a borrowed host, which keeps its own) and,
// when the key comes from the data dir, the lock the node holds on that dir
// while it runs (see lockDataDir): a borrowed host's key, which WithIdentity
// must match, else the key given with WithIdentity, else the one in the
// data dir (made on first start).
func hostIdentity(cfg config.NodeConfig, o *options) (crypto.PrivKey, []ma.Multiaddr, *dirLock, error) {
	key, h := o.key, o.host
	if h != nil {
		hk := h.Peerstore().PrivKey(h.ID())
		if hk == nil {
			return nil, nil, nil, fmt.Errorf("the given host's peerstore holds no private key for %s", h.ID())
		}
		if key != nil && !key.Equals(hk) {
			return nil, nil, nil, fmt.Errorf("the identity key is not the given host's (%s)", h.ID())
		}
		return hk, nil, nil, nil
	}
	listen, err := ParseListen(cfg.Listen)
	if err != nil {
		return nil, nil, nil, err
	}
	if key != nil {
		return key, listen, nil, nil
	}
	dir, err := DataDir(cfg.DataDir)
	if err != nil {
		return nil, nil, nil, err
	}
	// The lock comes first: a second process on the dir stops here, before
	// it could race the first one over a new key.
	lock, err := lockDataDir(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	if key, err = LoadOrCreateIdentity(dir); err != nil {
		lock.Close()
		return nil, nil, nil, err
	}
	return key, listen, lock, nil
}

// openHost returns the host given with WithHost, noting the protocols it
// serves already, or builds the node's own: listening on listen, with the
// NAT services cfg asks for. Either way the node watches the host's
// reachability and addresses.
func openHost(key crypto.PrivKey, o *options, cfg config.NodeConfig, listen []ma.Multiaddr) (*nodeHost, error) {
	st := &natState{}
	if o.host != nil {
		if err := st.watch(o.host); err != nil {
			return nil, err
		}
		return &nodeHost{Host: o.host, before: o.host.Mux().Protocols(), nat: st}, nil
	}
	nat, err := natSettingsOf(cfg)
	if err != nil {
		return nil, err
	}
	h, err := newNodeHost(key, cfg.Network, o.version, listen, nat, st)
	if err != nil {
		return nil, err
	}
	return &nodeHost{Host: h, owned: true, nat: st}, nil
}

// claim records, on a borrowed host, the protocols the node (with its DHT
// and gossipsub) added to those the host served before, for Close to
// remove. Handlers added later, by other parts of the process, are theirs.
func (h *nodeHost) claim() {
	if h.owned {
		return
	}
	h.added = h.added[:0]
	for _, p := range h.Mux().Protocols() {
		if !slices.Contains(h.before, p) {
			h.added = append(h.added, p)
		}
	}
}

// Close closes a host of the node's own; a borrowed host stays open,
// without the node's protocol handlers.
func (h *nodeHost) Close() error {
	if !h.owned {
		for _, p := range h.added {
			h.RemoveStreamHandler(p)
		}
		return h.nat.Close()
	}
	if err := h.Host.Close(); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	return nil
}

// ErrListen means the node could not listen on its listen addresses: a
// port another process holds, an address not of this machine.
var ErrListen = errors.New("cannot listen on the listen addresses")

// ParseListen parses listen multiaddrs.
func ParseListen(addrs []string) ([]ma.Multiaddr, error) {
	if len(addrs) == 0 {
		return nil, errors.New("no listen address")
	}
	out := make([]ma.Multiaddr, 0, len(addrs))
	seen := map[string]int{}
	for i, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("listen address %q: %w", s, err)
		}
		if !listenable(a) {
			return nil, fmt.Errorf("listen address %q: a node listens on /ip4/<address>/udp/<port>/quic-v1 or /ip4/<address>/tcp/<port> (or /ip6/...)", s)
		}
		if j, dup := seen[a.String()]; dup {
			return nil, fmt.Errorf("listen address %q is given twice (entries %d and %d)", s, j+1, i+1)
		}
		seen[a.String()] = i
		out = append(out, a)
	}
	return out, nil
}

// listenable reports whether a is an address the node's transports listen
// on: QUIC over UDP or TCP, on an IP address.
func listenable(a ma.Multiaddr) bool {
	var codes []int
	for _, c := range a {
		codes = append(codes, c.Code())
	}
	if len(codes) < 2 || codes[0] != ma.P_IP4 && codes[0] != ma.P_IP6 {
		return false
	}
	return slices.Equal(codes[1:], []int{ma.P_TCP}) || slices.Equal(codes[1:], []int{ma.P_UDP, ma.P_QUIC_V1})
}
