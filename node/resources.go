package node

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/x/rate"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// Resource-manager service names of workmesh's own protocols.
const (
	healthService   = "workmesh.health"
	nodedataService = "workmesh.nodedata"
)

// Stream limits of workmesh's own protocols. Health pings are frequent and
// tiny; a nodedata sync moves up to a whole table, so few run at once. The
// limits of the whole protocol are many times one peer's, and a request
// must arrive within requestReadTimeout: peers that open streams and send
// nothing hold at most their own share, for a second at a time, and cannot
// take every slot from the dispatchers polling the node (32 identities
// holding 8 streams each did, with 256 for the protocol).
var (
	healthLimit       = rcmgr.BaseLimit{StreamsInbound: 1024, StreamsOutbound: 1024, Streams: 2048, Memory: 16 << 20}
	healthPeerLimit   = rcmgr.BaseLimit{StreamsInbound: 4, StreamsOutbound: 8, Streams: 12, Memory: 1 << 20}
	nodedataLimit     = rcmgr.BaseLimit{StreamsInbound: 128, StreamsOutbound: 32, Streams: 160, Memory: 64 << 20}
	nodedataPeerLimit = rcmgr.BaseLimit{StreamsInbound: 2, StreamsOutbound: 2, Streams: 4, Memory: 4 << 20}
	// A dispatcher keeps up to 32 idle work streams to a worker beside
	// those its requests use, and a burst puts a request on each of
	// hundreds at once: libp2p's default of 64 inbound streams per peer
	// and protocol (plus 4 per GiB of memory) refused streams of a burst
	// of 256 at two workers. The worker's own limits (its pool, the
	// per-peer limiter, local-reserve) bound the work; an idle stream
	// costs no memory of the scope.
	workPeerLimit = rcmgr.BaseLimit{StreamsInbound: 1024, StreamsOutbound: 1024, Streams: 2048, Memory: 64 << 20}
	// The work protocol in all: libp2p's default (512 inbound streams
	// and 256 more per GiB of the limits' memory) with four times the
	// inbound base, for the streams dispatchers keep open to a worker
	// between requests (the work server bounds those that wait to half
	// of what is allowed, WorkStreamBudget). The memory is the default's.
	workLimit         = rcmgr.BaseLimit{StreamsInbound: 2048, StreamsOutbound: 2048, Streams: 4096, Memory: 64 << 20}
	workLimitIncrease = rcmgr.BaseLimitIncrease{StreamsInbound: 256, StreamsOutbound: 512, Streams: 512, Memory: 164 << 20}
)

// WorkProtocol is the ID of the work protocol of network
// (/workmesh/<network>/work/1.0.0, the ID workers/protocol serves), for the
// host's stream limits.
func WorkProtocol(network string) protocol.ID {
	return protocol.ID("/workmesh/" + network + "/work/1.0.0")
}

// WorkStreamBudget returns how many inbound streams of netName's work
// protocol h's resource manager allows (at most its inbound streams in
// all), or 0 when it does not say.
func WorkStreamBudget(h host.Host, netName string) int {
	rm := h.Network().ResourceManager()
	inbound := func(s any) (int, bool) {
		l, ok := s.(rcmgr.ResourceScopeLimiter)
		if !ok {
			return 0, false
		}
		return l.Limit().GetStreamLimit(network.DirInbound), true
	}
	budget := 0
	_ = rm.ViewSystem(func(s network.ResourceScope) error {
		budget, _ = inbound(s)
		return nil
	})
	_ = rm.ViewProtocol(WorkProtocol(netName), func(s network.ProtocolScope) error {
		if n, ok := inbound(s); ok {
			budget = min(budget, n)
		}
		return nil
	})
	return budget
}

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
	limits.AddProtocolLimit(WorkProtocol(netName), workLimit, workLimitIncrease)
	limits.AddProtocolPeerLimit(WorkProtocol(netName), workPeerLimit, rcmgr.BaseLimitIncrease{})
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits.AutoScale()), rcmgr.WithMetricsDisabled(),
		rcmgr.WithConnRateLimiters(unlimitedConnRate()))
	if err != nil {
		return nil, fmt.Errorf("resource manager: %w", err)
	}
	cl, err := newConnLimits(rm)
	if err != nil {
		rm.Close()
		return nil, fmt.Errorf("resource manager: %w", err)
	}
	return cl, nil
}

// The resource manager's limits per remote IP (new connections: a burst of
// 16, then one every 5s; 8 open at once) are there to bound what one host
// can make this node accept. go-libp2p applies them to the connections the
// node dials as well, and takes a relayed connection's IP to be its
// relay's: a gateway polling the NAT'd peers that left, through their relay
// (each poll a relayed dial that the relay refuses), spent the relay IP's
// budget, and the dial of a NAT'd worker that had just joined through the
// same relay was refused ("rate limit exceeded"), then held back by the
// swarm's dial backoff: its first work waited 9s, and failed, from the fifth
// pair of NAT'd nodes on in the network lab. Ten workers behind one NAT
// could not all be dialed at once either. So connLimits keeps the limits for
// the connections others open, and none per IP for those the node dials
// (where it dials is the dial guard's to judge).
type connLimits struct {
	network.ResourceManager
	noIP noIPOpener
	// inbound limits the rate of new inbound connections per IP, as the
	// resource manager's own limiter did for all of them.
	inbound *rate.Limiter
}

// noIPOpener opens a connection scope without the per-IP limits (the
// resource manager of go-libp2p v0.52 has it; it is marked deprecated
// there, in favour of the per-IP limits this file keeps off dials).
type noIPOpener interface {
	OpenConnectionNoIP(dir network.Direction, usefd bool, endpoint ma.Multiaddr) (network.ConnManagementScope, error)
}

// errInboundRate is an inbound connection over its IP's rate.
var errInboundRate = errors.New("rate limit exceeded")

// unlimitedConnRate is the resource manager's own connection rate limiter:
// none, since connLimits applies the rate per IP to inbound connections.
func unlimitedConnRate() *rate.Limiter { return &rate.Limiter{} }

// inboundConnRate is go-libp2p's default rate of new connections per IP
// (v0.52 rcmgr's conn_rate_limiter.go), loopback exempt.
func inboundConnRate() *rate.Limiter {
	return &rate.Limiter{
		NetworkPrefixLimits: []rate.PrefixLimit{
			{Prefix: netip.MustParsePrefix("127.0.0.0/8"), Limit: rate.Limit{}},
			{Prefix: netip.MustParsePrefix("::1/128"), Limit: rate.Limit{}},
		},
		SubnetRateLimiter: rate.SubnetLimiter{
			IPv4SubnetLimits: []rate.SubnetLimit{{PrefixLength: 32, Limit: rate.Limit{RPS: 0.2, Burst: 16}}},
			IPv6SubnetLimits: []rate.SubnetLimit{
				{PrefixLength: 56, Limit: rate.Limit{RPS: 0.2, Burst: 16}},
				{PrefixLength: 48, Limit: rate.Limit{RPS: 0.5, Burst: 80}},
			},
			GracePeriod: time.Minute,
		},
	}
}

func newConnLimits(rm network.ResourceManager) (*connLimits, error) {
	noIP, ok := rm.(noIPOpener)
	if !ok {
		return nil, fmt.Errorf("resource manager %T cannot open a connection without its per-IP limits", rm)
	}
	return &connLimits{ResourceManager: rm, noIP: noIP, inbound: inboundConnRate()}, nil
}

// OpenConnection opens the scope of a new connection: one the node dials
// without limits per remote IP, one it accepts within them.
func (c *connLimits) OpenConnection(dir network.Direction, usefd bool, endpoint ma.Multiaddr) (network.ConnManagementScope, error) {
	if dir == network.DirOutbound {
		return c.noIP.OpenConnectionNoIP(dir, usefd, endpoint)
	}
	if endpoint != nil {
		if nip, err := manet.ToIP(endpoint); err == nil {
			if ip, ok := netip.AddrFromSlice(nip); ok && !c.inbound.Allow(ip.Unmap()) {
				return nil, errInboundRate
			}
		}
	}
	return c.ResourceManager.OpenConnection(dir, usefd, endpoint)
}
