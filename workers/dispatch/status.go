package dispatch

import (
	"sort"
	"time"

	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
)

// Status returns this node at a glance: who it is, its peers, what is in
// flight and queued, and its peers' liveness.
func (d *Dispatcher) Status() apiv1.StatusView {
	info := d.node.Info()
	nd := d.node.NodeData().Data
	v := apiv1.StatusView{
		PeerID: info.PeerID, Network: info.Network, Version: info.Version,
		StartTime: nd.StartTime.UTC(), UptimeS: time.Since(nd.StartTime).Seconds(),
		WorkTypes: info.WorkTypes, Labels: info.Labels,
		Addrs: []string{}, Join: d.node.JoinCommand(),
		InFlight:         d.metrics.inFlight.Load(),
		Rejections:       map[string]uint64{},
		NetworkAuthority: d.cfg.Membership.NetworkAuthority,
	}
	for _, a := range d.node.DialAddrs() {
		v.Addrs = append(v.Addrs, a.String())
	}
	table := d.node.Peers()
	peers := table.Peers()
	v.Peers.Known, v.Peers.Fresh = table.Known(), len(peers)
	for _, p := range peers {
		if p.Connected {
			v.Peers.Connected++
		}
	}
	c := d.sel.Liveness().Counts()
	v.Liveness = apiv1.LivenessCounts{Alive: c[selection.StateAlive], Unreachable: c[selection.StateUnreachable], Probing: c[selection.StateProbing]}
	if d.pool != nil {
		st := d.pool.Stats()
		v.Local.InFlight, v.Local.Queued, v.Local.MaxConcurrent, v.Local.QueueSize = st.InFlight, st.Queued, st.MaxConcurrent, st.QueueSize
	}
	for r, n := range table.Rejections() {
		v.Rejections[r.String()] = n
	}
	d.node.SetNATStatus(&v)
	return v
}

// PeerStatuses returns the dispatcher's view of every fresh peer, ordered
// by peer ID.
func (d *Dispatcher) PeerStatuses() []apiv1.PeerStatus {
	infos := d.node.Peers().Peers()
	out := make([]apiv1.PeerStatus, 0, len(infos))
	idx := make(map[string]int, len(infos))
	keep := make(map[string]bool, len(infos))
	types := map[string]bool{}
	live := d.sel.Liveness()
	for _, pi := range infos {
		raw := string(pi.Data.PeerID)
		keep[raw] = true
		ps := apiv1.PeerStatus{
			PeerView: node.NewPeerView(pi), State: live.State(raw).String(),
			Failures: live.Failures(raw), Scores: []apiv1.TypeScore{},
			Reason:     live.Reason(raw),
			Connection: d.node.Connection(pi.Data.PeerID),
			Disputes:   live.Disputes(raw),
		}
		if left(pi) {
			ps.State = apiv1.StateLeft
		}
		if p, ok := d.metrics.lastPoll(raw); ok {
			at := p.at.UTC()
			ps.LastPoll, ps.PollError = &at, p.err
			if !p.ok.IsZero() {
				v := apiv1.Millis(p.rtt)
				ps.RTTMS = &v
			}
		}
		idx[raw] = len(out)
		out = append(out, ps)
		for _, wt := range pi.Data.WorkTypes {
			types[wt.Name] = true
		}
	}
	d.metrics.retain(keep) // the last polls of peers that left
	names := make([]string, 0, len(types))
	for wt := range types {
		names = append(names, wt)
	}
	sort.Strings(names)
	for _, wt := range names {
		rank := 0
		seen := map[string]bool{}
		for _, r := range d.sel.Ranking(wt) {
			if seen[r.Peer] {
				continue
			}
			seen[r.Peer] = true
			rank++
			if i, ok := idx[r.Peer]; ok {
				out[i].Scores = append(out[i].Scores, apiv1.TypeScore{WorkType: wt, Score: r.Score, Rated: r.Rated, Group: r.Group, Rank: rank})
			}
		}
	}
	return out
}

// left reports whether the peer left the network gracefully: its last
// record withdrew every work type and it is no longer connected (see
// apiv1.StateLeft). A peer that dies keeps the work types of its last
// record, so that is never taken for leaving.
func left(pi node.PeerInfo) bool {
	return len(pi.Data.WorkTypes) == 0 && !pi.Connected
}

// RankedPeer is one peer's place in the dispatcher's current order for a
// work type.
type RankedPeer struct {
	// Peer is the peer ID.
	Peer string
	// Group is the label group the peer stands in: "" without label
	// balancing and for the default group.
	Group string
	// State is the peer's liveness state: alive, unreachable or probing.
	State string
}

// Ranking returns the current order for a work type, group by group, as a
// request would walk it before its own filters; a peer in several groups
// stands once in each.
func (d *Dispatcher) Ranking(workType string) []RankedPeer {
	ranking := d.sel.Ranking(workType)
	out := make([]RankedPeer, 0, len(ranking))
	for _, r := range ranking {
		out = append(out, RankedPeer{Peer: d.idString(r.Peer), Group: r.Group, State: r.State.String()})
	}
	return out
}
