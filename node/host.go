package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/libp2p/go-libp2p"
	libp2pconfig "github.com/libp2p/go-libp2p/config"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/sec"
	bhost "github.com/libp2p/go-libp2p/p2p/host/basic"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	"github.com/libp2p/go-libp2p/p2p/host/observedaddrs"
	"github.com/libp2p/go-libp2p/p2p/host/peerstore/pstoremem"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/libp2p/go-libp2p/p2p/net/upgrader"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	tls "github.com/libp2p/go-libp2p/p2p/security/tls"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/quicreuse"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	msmux "github.com/multiformats/go-multistream"
	quicgo "github.com/quic-go/quic-go"
	"github.com/workmesh/workmesh/config"
)

// Resource-manager service names of workmesh's own protocols.
const (
	healthService   = "workmesh.health"
	nodedataService = "workmesh.nodedata"
)

// Stream limits of workmesh's own protocols. Health pings are frequent and
// tiny; a nodedata sync moves up to a whole table, so few run at once.
var (
	healthLimit       = rcmgr.BaseLimit{StreamsInbound: 256, StreamsOutbound: 256, Streams: 512, Memory: 8 << 20}
	healthPeerLimit   = rcmgr.BaseLimit{StreamsInbound: 8, StreamsOutbound: 8, Streams: 16, Memory: 1 << 20}
	nodedataLimit     = rcmgr.BaseLimit{StreamsInbound: 32, StreamsOutbound: 32, Streams: 64, Memory: 32 << 20}
	nodedataPeerLimit = rcmgr.BaseLimit{StreamsInbound: 2, StreamsOutbound: 2, Streams: 4, Memory: 4 << 20}
)

// newResourceManager returns libp2p's default limits plus explicit ones for
// the health and nodedata protocols. Its metrics are off: with them on, the
// resource manager's stats reporter formats timestamps on every scope
// change, a measured 16-19% of CPU under load.
func newResourceManager(netName string) (network.ResourceManager, error) {
	limits := rcmgr.DefaultLimits
	// DefaultLimits is a package variable whose maps the Add* methods
	// write into; clone them so that nodes built concurrently in one
	// process never share (and race on) them.
	limits.ServiceLimits = maps.Clone(limits.ServiceLimits)
	limits.ServicePeerLimits = maps.Clone(limits.ServicePeerLimits)
	limits.ProtocolLimits = maps.Clone(limits.ProtocolLimits)
	limits.ProtocolPeerLimits = maps.Clone(limits.ProtocolPeerLimits)
	limits.PeerLimits = maps.Clone(limits.PeerLimits)
	libp2p.SetDefaultServiceLimits(&limits)

	for _, l := range []struct {
		svc        string
		proto      protocol.ID
		all, perPr rcmgr.BaseLimit
	}{
		{healthService, HealthProtocol(netName), healthLimit, healthPeerLimit},
		{nodedataService, NodeDataProtocol(netName), nodedataLimit, nodedataPeerLimit},
	} {
		limits.AddServiceLimit(l.svc, l.all, rcmgr.BaseLimitIncrease{})
		limits.AddServicePeerLimit(l.svc, l.perPr, rcmgr.BaseLimitIncrease{})
		limits.AddProtocolLimit(l.proto, l.all, rcmgr.BaseLimitIncrease{})
		limits.AddProtocolPeerLimit(l.proto, l.perPr, rcmgr.BaseLimitIncrease{})
	}
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits.AutoScale()), rcmgr.WithMetricsDisabled())
	if err != nil {
		return nil, fmt.Errorf("resource manager: %w", err)
	}
	return rm, nil
}

// newHost builds the libp2p host: QUIC always, TCP only when a listen or
// bootstrap address uses it, no relay, no NAT port mapping, no AutoNAT, no
// metrics, and go-libp2p's default connection manager (160 to 192
// connections) and identify with observed-address discovery.
//
// It assembles the host from go-libp2p's parts (peerstore, event bus,
// swarm, transports, basic host) as libp2p.New would with these options,
// but without libp2p.New's dependency-injection container: building that
// graph cost about 3ms of CPU per host, more than half of a node's start,
// which sits on the path of every join (bench/README.md, "Building the host"). Without
// libp2p.New the event bus also carries no metrics tracer, which
// libp2p.New attaches even with metrics disabled.
func newHost(key crypto.PrivKey, netName, version string, listen []ma.Multiaddr, tcpWanted bool) (_ host.Host, err error) {
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
	sw, err := swarm.NewSwarm(pid, ps, bus,
		swarm.WithResourceManager(rm),
		// QUIC is the transport workmesh relies on; a "UDP black hole"
		// verdict after a few failed dials would cut a node off entirely.
		swarm.WithUDPBlackHoleSuccessCounter(nil))
	if err != nil {
		return nil, fmt.Errorf("libp2p host: swarm: %w", err)
	}
	closers = append(closers, sw.Close)
	qt, err := quic.NewTransport(key, reuse, nil, nil, rm)
	if err != nil {
		return nil, fmt.Errorf("libp2p host: quic: %w", err)
	}
	if err := sw.AddTransport(qt); err != nil {
		return nil, fmt.Errorf("libp2p host: quic: %w", err)
	}
	if tcpWanted {
		tt, err := newTCPTransport(key, rm)
		if err != nil {
			return nil, fmt.Errorf("libp2p host: tcp: %w", err)
		}
		if err := sw.AddTransport(tt); err != nil {
			return nil, fmt.Errorf("libp2p host: tcp: %w", err)
		}
	}
	observed, err := observedaddrs.NewManager(bus, sw)
	if err != nil {
		return nil, fmt.Errorf("libp2p host: observed addresses: %w", err)
	}
	closers = append(closers, observed.Close)
	cm, err := connmgr.NewConnManager(160, 192)
	if err != nil {
		return nil, fmt.Errorf("libp2p host: connection manager: %w", err)
	}
	closers = append(closers, cm.Close)
	bh, err := bhost.NewHost(sw, &bhost.HostOpts{
		EventBus:             bus,
		ConnManager:          cm,
		UserAgent:            "workmesh/" + version,
		ObservedAddrsManager: observed,
		// No ping service: the health protocol is workmesh's ping.
	})
	if err != nil {
		return nil, fmt.Errorf("libp2p host: %w", err)
	}
	h := &ownedHost{BasicHost: bh, after: []func() error{observed.Close, reuse.Close}}
	closers = []func() error{h.Close}
	if err := sw.Listen(listen...); err != nil {
		return nil, fmt.Errorf("libp2p host: listen: %w", err)
	}
	observed.Start(sw)
	bh.Start()
	return h, nil
}

// ownedHost is a basic host together with the parts it does not close
// itself.
type ownedHost struct {
	*bhost.BasicHost
	after []func() error // closed after the host, in order
}

// Close closes the host (its swarm, connections, peerstore, resource and
// connection managers), then the observed-address manager and the QUIC
// sockets.
func (h *ownedHost) Close() error {
	err := h.BasicHost.Close()
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

// newTCPTransport returns a TCP transport upgraded as libp2p.New's default
// would: TLS, then Noise, for security, and yamux for streams.
func newTCPTransport(key crypto.PrivKey, rm network.ResourceManager) (*tcp.TcpTransport, error) {
	muxers := []upgrader.StreamMuxer{{ID: yamux.ID, Muxer: yamux.DefaultTransport}}
	tlsSec, err := tls.New(tls.ID, key, muxers)
	if err != nil {
		return nil, err
	}
	noiseSec, err := noise.New(noise.ID, key, muxers)
	if err != nil {
		return nil, err
	}
	up, err := upgrader.New([]sec.SecureTransport{tlsSec, noiseSec}, muxers, nil, rm, nil)
	if err != nil {
		return nil, err
	}
	return tcp.NewTCPTransport(up, rm, nil)
}

// usesTCP reports whether any of the multiaddrs is a TCP address.
func usesTCP(addrs ...[]ma.Multiaddr) bool {
	for _, list := range addrs {
		for _, a := range list {
			if _, err := a.ValueForProtocol(ma.P_TCP); err == nil {
				return true
			}
		}
	}
	return false
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
// serves already, or builds the node's own: listening on listen, with TCP
// when a listen or bootstrap address uses it.
func openHost(key crypto.PrivKey, o *options, network string, listen []ma.Multiaddr, bootstrap []peer.AddrInfo) (*nodeHost, error) {
	if o.host != nil {
		return &nodeHost{Host: o.host, before: o.host.Mux().Protocols()}, nil
	}
	var bsAddrs []ma.Multiaddr
	for _, ai := range bootstrap {
		bsAddrs = append(bsAddrs, ai.Addrs...)
	}
	h, err := newHost(key, network, o.version, listen, usesTCP(listen, bsAddrs))
	if err != nil {
		return nil, err
	}
	return &nodeHost{Host: h, owned: true}, nil
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
		return nil
	}
	if err := h.Host.Close(); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	return nil
}

// ParseListen parses listen multiaddrs.
func ParseListen(addrs []string) ([]ma.Multiaddr, error) {
	if len(addrs) == 0 {
		return nil, errors.New("no listen address")
	}
	out := make([]ma.Multiaddr, 0, len(addrs))
	for _, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("listen address %q: %w", s, err)
		}
		out = append(out, a)
	}
	return out, nil
}
