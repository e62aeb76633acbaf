package node

import (
	"context"
	"fmt"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/workmesh/workmesh/node/apiv1"
)

// watchNAT feeds the host's relay finder with the peers of the table and
// re-signs the record when the host's addresses change (a relay slot
// gained or lost, an observed address confirmed).
func (n *Node) watchNAT() {
	st := n.host.nat
	peers := func() []peer.AddrInfo {
		infos := n.table.Peers()
		out := make([]peer.AddrInfo, 0, len(infos))
		for _, pi := range infos {
			out = append(out, peer.AddrInfo{ID: pi.Data.PeerID, Addrs: pi.Data.Multiaddrs()})
		}
		return out
	}
	st.tablePeers.Store(&peers)
	kick := n.records.announceAddrs
	st.onAddrs.Store(&kick)
}

// Reachability is public, private or unknown: AutoNAT's verdict on
// whether hosts anywhere can dial this node, or the reachability setting.
func (n *Node) Reachability() string { return n.host.nat.Reachability() }

// AdvertisedAddrs returns the addresses in the node's signed record.
func (n *Node) AdvertisedAddrs() []string {
	return append([]string(nil), n.NodeData().Data.Addrs...)
}

// RelayAddrs returns the advertised addresses that go through a relay.
func (n *Node) RelayAddrs() []string {
	var out []string
	for _, s := range n.NodeData().Data.Addrs {
		if a, err := ma.NewMultiaddr(s); err == nil && isRelayAddr(a) {
			out = append(out, s)
		}
	}
	return out
}

// Connection says how the node is connected to p: ConnDirect, ConnRelayed
// or ConnNone.
func (n *Node) Connection(p peer.ID) string { return connState(n.host, p) }

// NATStats counts hole punches, relay slots and dials not made.
func (n *Node) NATStats() apiv1.NATStats {
	st := n.host.nat
	s := apiv1.NATStats{
		HolePunchesTried:     st.hpTried.Load(),
		HolePunchesSucceeded: st.hpSucceeded.Load(),
		HolePunchesFailed:    st.hpFailed.Load(),
		HolePunchRetries:     st.hpRetries.Load(),
		RelayReservations:    relayReservations(n.host),
		DialsSkipped:         st.dialsSkipped.Load(),
		DialsGated:           st.dialsGated.Load(),
		RelayedWork:          st.relayedWork.Load(),
	}
	if e := st.hpLastError.Load(); e != nil {
		s.LastHolePunchError = *e
	}
	return s
}

// SetNATStatus fills the NAT part of a status view.
func (n *Node) SetNATStatus(v *apiv1.StatusView) {
	v.Reachability = n.Reachability()
	v.AdvertisedAddrs = n.AdvertisedAddrs()
	v.RelayAddrs = n.RelayAddrs()
	s := n.NATStats()
	v.NAT = &s
}

var (
	descHolePunches = prometheus.NewDesc("workmesh_hole_punches_total",
		"Hole punch attempts (DCUtR) this node made, by result: tried (started), succeeded, failed.", []string{"result"}, nil)
	descHolePunchRetries = prometheus.NewDesc("workmesh_hole_punch_retries_total",
		"Hole punches this node asked for again, to peers it stayed connected to only through a relay.", nil, nil)
	descRelayReservations = prometheus.NewDesc("workmesh_relay_reservations",
		"Relays this node holds a slot on now.", nil, nil)
	descReachability = prometheus.NewDesc("workmesh_reachability",
		"1 for this node's reachability (public, private or unknown), 0 for the others.", []string{"reachability"}, nil)
	descRelayedWork = prometheus.NewDesc("workmesh_relayed_work_total",
		"Work requests this node sent to peers over a relayed connection (before a hole punch, or behind a NAT that cannot be punched).", nil, nil)
	descDialsSkipped = prometheus.NewDesc("workmesh_dials_skipped_total",
		"Dials to addresses this node cannot reach (another site's private address) not made.", nil, nil)
	descDialsGated = prometheus.NewDesc("workmesh_dials_gated_total",
		"Dials to addresses another peer named (a DHT answer, a record) at an IP their peer was never seen at, refused by the dial guard: newcomer budget spent or the IP closed by a failed dial.", nil, nil)
)

// collectNAT sends the NAT counts.
func (n *Node) collectNAT(ch chan<- prometheus.Metric) {
	s := n.NATStats()
	ch <- prometheus.MustNewConstMetric(descHolePunches, prometheus.CounterValue, float64(s.HolePunchesTried), "tried")
	ch <- prometheus.MustNewConstMetric(descHolePunches, prometheus.CounterValue, float64(s.HolePunchesSucceeded), "succeeded")
	ch <- prometheus.MustNewConstMetric(descHolePunches, prometheus.CounterValue, float64(s.HolePunchesFailed), "failed")
	ch <- prometheus.MustNewConstMetric(descHolePunchRetries, prometheus.CounterValue, float64(s.HolePunchRetries))
	ch <- prometheus.MustNewConstMetric(descRelayReservations, prometheus.GaugeValue, float64(s.RelayReservations))
	ch <- prometheus.MustNewConstMetric(descDialsSkipped, prometheus.CounterValue, float64(s.DialsSkipped))
	ch <- prometheus.MustNewConstMetric(descDialsGated, prometheus.CounterValue, float64(s.DialsGated))
	ch <- prometheus.MustNewConstMetric(descRelayedWork, prometheus.CounterValue, float64(s.RelayedWork))
	r := n.Reachability()
	for _, name := range []string{"public", "private", "unknown"} {
		v := 0.0
		if name == r {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descReachability, prometheus.GaugeValue, v, name)
	}
}

// relayFraming is the room kept in a relayed connection's data limit for
// what goes with a payload (the work protocol's frames, the streams'
// handshakes, health pings).
const relayFraming = 8 << 10

// defaultRelayLimit is relay v2's data limit per relayed connection.
const defaultRelayLimit = 1 << 17

// RelayedWorkLimit is the largest payload sent over a relayed connection:
// relay-limit-bytes (the limit a relay gives each relayed connection, the
// same across a network) less room for framing.
func (n *Node) RelayedWorkLimit() int {
	limit := n.cfg.RelayLimitBytes
	if limit <= 0 {
		limit = defaultRelayLimit
	}
	return max(0, limit-relayFraming)
}

// OverRelay says whether work with a payload of size bytes may go to p.
// While p is connected through a relay only (no hole punch yet, or a NAT
// that cannot be punched), work that fits the relay's limit may use that
// connection: the context returned allows it, and the work is counted as
// sent over a relayed connection. Larger work is refused with an error that
// says so. Over a direct connection, or none, ctx comes back as it was.
func (n *Node) OverRelay(ctx context.Context, p peer.ID, size int) (context.Context, error) {
	if connState(n.host, p) != ConnRelayed {
		return ctx, nil
	}
	if limit := n.RelayedWorkLimit(); size > limit {
		return ctx, fmt.Errorf("payload of %d bytes does not fit a relayed connection (at most %d bytes: relay-limit-bytes less framing); no direct connection to %s yet", size, limit, p)
	}
	n.host.nat.relayedWork.Add(1)
	return network.WithAllowLimitedConn(ctx, "workmesh work within the relay's limit"), nil
}
