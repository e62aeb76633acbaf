package node

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/x/rate"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

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
