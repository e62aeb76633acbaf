package dispatch

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/quic-go/quic-go"

	"github.com/workmesh/workmesh/selection"
)

// The waits that bound a peer's answer, the accept frame of a work request
// and the health ping, start from the peer's measured round trip: a worker
// far away answers later than a near one without being any less alive. A
// wait is rtt-factor round trips plus rtt-margin, never below the setting
// that bounds a near peer's answer and never above peer-wait-max. The
// round trip is the last good health ping's (the dispatcher's own
// metrics), or before the first one what the connection measured: QUIC's
// smoothed round trip on the connection to the peer, else the peerstore's
// latency (connect records how long its dial took, libp2p's ping records
// what it measures).

// peerRTT returns the round trip of the peer with raw ID id that this node
// measured, and whether it has measured one.
func (d *Dispatcher) peerRTT(id string) (time.Duration, bool) {
	if rtt, ok := d.metrics.lastRTT(id); ok {
		return rtt, true // the common case: no lock, no allocation
	}
	h := d.node.Host()
	rtt := connRTT(h, peer.ID(id))
	if rtt == 0 {
		rtt = h.Peerstore().LatencyEWMA(peer.ID(id))
	}
	return rtt, rtt > 0
}

// connRTT returns the smoothed round trip QUIC measured on the connections
// to p (the largest, when there are several), or 0 when none is QUIC.
func connRTT(h host.Host, p peer.ID) time.Duration {
	var rtt time.Duration
	for _, c := range h.Network().ConnsToPeer(p) {
		var qc *quic.Conn
		if c.As(&qc) && qc != nil {
			rtt = max(rtt, qc.ConnectionStats().SmoothedRTT)
		}
	}
	return rtt
}

// connPackets returns how many packets the QUIC connections to p have
// received, and whether any connection to p counts them (QUIC does; TCP,
// relayed and in-memory connections do not).
func connPackets(h host.Host, p peer.ID) (packets uint64, counted bool) {
	for _, c := range h.Network().ConnsToPeer(p) {
		var qc *quic.Conn
		if c.As(&qc) && qc != nil {
			packets += qc.ConnectionStats().PacketsReceived
			counted = true
		}
	}
	return packets, counted
}

// silent reports whether a peer whose health ping just used up its wait
// is silent, not merely slow: its QUIC connection received no packet
// since the ping began (heard, from connPackets then; a live peer's QUIC
// acknowledges the ping however long its answer takes, a killed or
// frozen process sends nothing). A connection that counts no packets
// tells nothing, and there the peer is silent when its last poll failed
// too: one slow answer from a loaded peer does not cost it its
// connection and the work running on it.
func (d *Dispatcher) silent(id string, p peer.ID, heard uint64, counted bool) bool {
	if now, ok := connPackets(d.node.Host(), p); ok && counted {
		return now == heard
	}
	return d.sel.Liveness().State(id) != selection.StateAlive
}

// waitFor returns the wait for an answer from a peer rtt away: floor for a
// near peer, rtt-factor round trips plus rtt-margin for a far one, never
// more than peer-wait-max (unless floor itself is more).
func (d *Dispatcher) waitFor(rtt, floor time.Duration) time.Duration {
	w := d.cfg.Worker
	scaled := time.Duration(w.RTTFactor*float64(rtt)) + w.RTTMargin
	return max(floor, min(scaled, w.PeerWaitMax))
}

// acceptWait returns how long the peer with raw ID id is given to accept
// a work request. A peer whose round trip is not measured yet is given
// worker-timeout: that bounds a worker that has gone silent, not one far
// away.
func (d *Dispatcher) acceptWait(id string) time.Duration {
	w := d.cfg.Worker
	rtt, ok := d.peerRTT(id)
	if !ok {
		return w.WorkerTimeout
	}
	return d.waitFor(rtt, w.WorkerResponseTimeout)
}

// pollWait returns how long a health poll of the peer with raw ID id may
// take: connect-timeout, or poll-interval when that is shorter, for a near
// peer; more for one whose round trip asks for it.
func (d *Dispatcher) pollWait(id string) time.Duration {
	floor := d.cfg.Worker.ConnectTimeout
	if pi := d.cfg.Liveness.PollInterval; pi > 0 && pi < floor {
		floor = pi
	}
	rtt, ok := d.peerRTT(id)
	if !ok {
		return floor
	}
	return d.waitFor(rtt, floor)
}

// workBudget returns how long the peer with raw ID id may spend on the
// work of an attempt whose deadline is ctx's: what is left of it, less
// the time its answer needs to come back (two of its round trips and a
// margin of 20ms, at most a quarter of what is left). A worker cut at
// its budget still answers before the request's deadline, so a worker
// that runs honest work to the end is told apart from one that accepts
// work and stalls. Zero (no deadline) leaves the client's default.
func (d *Dispatcher) workBudget(ctx context.Context, id string) time.Duration {
	deadline, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	left := time.Until(deadline)
	if left <= 0 {
		return 0
	}
	rtt, _ := d.peerRTT(id)
	margin := min(2*rtt+20*time.Millisecond, left/4)
	return left - margin
}
