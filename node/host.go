package node

import (
	"context"
	"fmt"
	"io"
	"maps"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	msmux "github.com/multiformats/go-multistream"
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
// change, a measured 16-19% of CPU under load, and libp2p.DisableMetrics
// does not reach a resource manager built outside libp2p.New.
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
// bootstrap address uses it, no relay, no NAT port mapping, no metrics.
func newHost(key crypto.PrivKey, netName, version string, listen []ma.Multiaddr, tcpWanted bool) (host.Host, error) {
	rm, err := newResourceManager(netName)
	if err != nil {
		return nil, err
	}
	opts := []libp2p.Option{
		libp2p.Identity(key),
		libp2p.ListenAddrs(listen...),
		libp2p.Transport(quic.NewTransport),
		libp2p.ResourceManager(rm),
		libp2p.DisableMetrics(),
		libp2p.DisableRelay(),
		libp2p.Ping(false), // the health protocol is workmesh's ping
		libp2p.UserAgent("workmesh/" + version),
		// QUIC is the transport workmesh relies on; a "UDP black hole"
		// verdict after a few failed dials would cut a node off entirely.
		libp2p.UDPBlackHoleSuccessCounter(nil),
	}
	if tcpWanted {
		opts = append(opts, libp2p.Transport(tcp.NewTCPTransport))
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		rm.Close()
		return nil, fmt.Errorf("libp2p host: %w", err)
	}
	return h, nil
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
