package node

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/workmesh/workmesh/node/scrape"
)

// Metric descriptions of the peer table. They are read from the table at
// scrape time, so nothing on the record path pays for them.
var (
	descPeersKnown = prometheus.NewDesc("workmesh_peers_known",
		"Peers in the peer table, fresh or past their record TTL but not yet expired.", nil, nil)
	descPeersFresh = prometheus.NewDesc("workmesh_peers_fresh",
		"Peers whose NodeData record is within its TTL: the candidates of dispatch.", nil, nil)
	descPeersConnected = prometheus.NewDesc("workmesh_peers_connected",
		"Fresh peers this node has a connection to.", nil, nil)
	descRejections = prometheus.NewDesc("workmesh_nodedata_rejections_total",
		"NodeData records refused, by how they arrived (gossip, dht, sync) and why.", []string{"source", "reason"}, nil)
	descGossipDropped = prometheus.NewDesc("workmesh_gossip_dropped_total",
		"Gossip messages dropped under load: validation_queue (received, not checked), peer_queue (not sent to a peer, its queue full) or no_stream (not sent to a peer gossipsub had no stream to yet).", []string{"queue"}, nil)
	descGossipLeftOut = prometheus.NewDesc("workmesh_gossip_left_out_total",
		"Publications of this node's own that gossipsub had no send queue for a topic peer to put in (not counted as dropped): such a peer has this node's record pushed to it once its stream opens.", nil, nil)
)

// Collector returns a Prometheus collector of the node: its peer table
// (peers known, fresh and connected, and NodeData records refused by source
// and reason) and the gossip messages dropped for full queues. Register it
// in the node's own registry; it reads the counts at scrape time.
func (n *Node) Collector() prometheus.Collector {
	return scrape.Collector(n.collect, []*prometheus.Desc{descGossipDropped, descGossipLeftOut}, n.table.Collector(),
		scrape.Collector(n.collectNAT, []*prometheus.Desc{descHolePunches, descHolePunchRetries, descRelayReservations, descDialsSkipped, descDialsGated, descRelayedWork, descReachability}))
}

// collect sends the gossip drops counted so far, and the publications
// left out for peers without a stream.
func (n *Node) collect(ch chan<- prometheus.Metric) {
	validation, outbound := n.gossip.ann.Dropped()
	noStream := n.gossip.ann.DroppedNoStream()
	ch <- prometheus.MustNewConstMetric(descGossipDropped, prometheus.CounterValue, float64(validation), "validation_queue")
	ch <- prometheus.MustNewConstMetric(descGossipDropped, prometheus.CounterValue, float64(outbound-noStream), "peer_queue")
	ch <- prometheus.MustNewConstMetric(descGossipDropped, prometheus.CounterValue, float64(noStream), "no_stream")
	ch <- prometheus.MustNewConstMetric(descGossipLeftOut, prometheus.CounterValue, float64(n.gossip.ann.LeftOut()))
}

// Collector returns a Prometheus collector of the table (see
// (*Node).Collector).
func (t *PeerTable) Collector() prometheus.Collector {
	return scrape.Collector(t.collect, []*prometheus.Desc{descPeersKnown, descPeersFresh, descPeersConnected, descRejections})
}

// Known returns the number of peers in the table, fresh or not yet expired.
func (t *PeerTable) Known() int { return len(t.view().byID) }

// RejectionsBySource returns how many records were refused, by the source
// they arrived from and by reason. Rejections whose source was not said
// (Reject rather than RejectVia) are under source 0.
func (t *PeerTable) RejectionsBySource() map[Source]map[RejectReason]uint64 {
	out := make(map[Source]map[RejectReason]uint64, numSources)
	for src := range Source(numSources) {
		m := make(map[RejectReason]uint64, len(rejectNames))
		for _, r := range RejectReasons() {
			m[r] = t.rejectsBy[src][r].Load()
		}
		out[src] = m
	}
	return out
}

// sourceLabel names a source in metrics; "other" for a source not said.
func sourceLabel(s Source) string {
	if s <= 0 || int(s) >= numSources {
		return "other"
	}
	return s.String()
}

// collect sends the table's counts now.
func (t *PeerTable) collect(ch chan<- prometheus.Metric) {
	st := t.view()
	now := t.clock.Now()
	fresh, connected := 0, 0
	for _, e := range st.byID {
		if t.fresh(e, now) {
			fresh++
			if e.Connected {
				connected++
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(descPeersKnown, prometheus.GaugeValue, float64(len(st.byID)))
	ch <- prometheus.MustNewConstMetric(descPeersFresh, prometheus.GaugeValue, float64(fresh))
	ch <- prometheus.MustNewConstMetric(descPeersConnected, prometheus.GaugeValue, float64(connected))
	for src := range Source(numSources) {
		for _, r := range RejectReasons() {
			n := t.rejectsBy[src][r].Load()
			if n == 0 && src == 0 {
				continue // the unsaid source only shows once it counts
			}
			ch <- prometheus.MustNewConstMetric(descRejections, prometheus.CounterValue, float64(n), sourceLabel(src), r.String())
		}
	}
}
