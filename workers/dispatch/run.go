package dispatch

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	lpevent "github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/selection"
)

// defaultSyncDelay spaces out a dispatcher's peer syncs during a burst of
// peer table changes.
const defaultSyncDelay = 5 * time.Millisecond

// Run keeps the selection core in step with the network until ctx ends: it
// feeds the peer table's changes to the selector, polls peers' health as
// liveness asks (which is also how unreachable peers are redialed), and
// refreshes the ranking. It returns when ctx ends and every poll it started
// has stopped.
func (d *Dispatcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	defer d.audits.stop()
	const tick = 50 * time.Millisecond
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	// The leading workers' connections are protected from the connection
	// manager's trimming (protectLeading), checked every second.
	const protectEvery = 20 // ticks
	ticks := 0
	defer d.unprotectAll()
	table := d.node.Peers()
	changed := table.Changed()
	// This loop polls: a peer it learns of is selected once it answered.
	d.sel.Liveness().AwaitFirstPoll()
	d.syncPeers()
	var syncC <-chan time.Time // running while syncs are spaced out
	var addC <-chan time.Time  // running while syncs for new peers are
	syncPending := false       // a change arrived since the last sync
	var mu sync.Mutex
	polling := map[string]bool{}
	// again holds the probes news asked for while a poll of the peer was
	// in flight: that poll may have set out before the news (a dial to
	// addresses that lead nowhere), so the probe follows it at once.
	again := map[string]selection.Poll{}
	sem := make(chan struct{}, 16) // polls in flight at once
	startPoll := func(due selection.Poll) bool {
		id := due.Peer
		if len(sem) == cap(sem) {
			return false
		}
		mu.Lock()
		busy := polling[id]
		polling[id] = true
		mu.Unlock()
		if busy {
			return true
		}
		sem <- struct{}{} // never blocks: only this loop sends
		wg.Go(func() {
			defer func() { <-sem }()
			for {
				d.poll(ctx, due)
				mu.Lock()
				next, ok := again[id]
				delete(again, id)
				if !ok || ctx.Err() != nil {
					delete(polling, id)
					mu.Unlock()
					return
				}
				mu.Unlock()
				due = next
			}
		})
		return true
	}
	// probe starts a poll that news of the peer asked for, or queues it
	// behind the poll in flight.
	probe := func(due selection.Poll) {
		mu.Lock()
		if polling[due.Peer] {
			again[due.Peer] = due
			mu.Unlock()
			return
		}
		mu.Unlock()
		startPoll(due)
	}
	// startDue starts the polls that are due, as poll slots allow: every
	// tick, and at once when new peers are synced (their first poll, which
	// makes them selectable, is due at once).
	startDue := func() {
		for _, due := range d.sel.Liveness().DuePolls() {
			if !startPoll(due) {
				// Every poll slot is taken (dead peers hold theirs for a
				// whole timeout): the rest stay due for a later tick.
				// Waiting here would stall the peer sync and the ranking
				// refresh behind the slowest polls.
				break
			}
		}
	}
	// Liveness learns from the network: a new connection from a peer it
	// holds unreachable (it came back, or its site's link did) is probed
	// at once instead of at the end of its redial backoff, and so is one
	// from a new peer whose first polls found no way to it yet (its relay
	// slot came after its record).
	conns := d.connectedPeers()
	defer conns.Close()
	// A new record from a peer liveness holds unreachable, or from a new
	// one whose first polls failed (new addresses: a relay slot it
	// reserved, a link back), is probed at once too.
	seqs := map[string]uint64{}
	probeNewRecords := func() {
		live := d.sel.Liveness()
		// A new peer's first poll still in flight counts as failed: it
		// may have set out before the record that shows the way.
		mu.Lock()
		inFlight := slices.Collect(maps.Keys(polling))
		mu.Unlock()
		freshInFlight := func(id string) bool { return slices.Contains(inFlight, id) && live.AwaitsFirstPoll(id) }
		if live.Counts()[selection.StateUnreachable] == 0 && live.CountFirstPollsFailed() == 0 && !slices.ContainsFunc(inFlight, freshInFlight) {
			clear(seqs)
			return
		}
		for _, pi := range table.Peers() {
			id := string(pi.Data.PeerID)
			seq, seen := seqs[id]
			seqs[id] = pi.Data.Sequence
			failedFirst := live.FirstPollsFailed(id) || freshInFlight(id)
			if !failedFirst && live.State(id) != selection.StateUnreachable {
				continue
			}
			// A record of its own since the last look is news; so is the
			// first look at a new peer whose first polls failed: its
			// record may already be the one after they found no way to it.
			if seen && seq != pi.Data.Sequence || !seen && failedFirst {
				if due, ok := live.ProbeFor(id); ok {
					d.forgetDialBackoff(pi.Data.PeerID)
					probe(due)
				}
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			// The first change is taken at once; the changes that
			// follow within syncDelay are taken together at its end,
			// which bounds the syncs during a burst. A new peer is
			// taken at once too, so that it is eligible as its record
			// arrives even while other peers' changes (load, connection
			// state) keep the window running; new peers have a window
			// of their own, which bounds the syncs while a network
			// forms.
			changed = table.Changed()
			probeNewRecords()
			switch {
			case syncC == nil:
				d.syncPeers()
				syncC = time.After(d.syncDelay)
				startDue()
			case addC == nil && table.Additions() != d.syncedAdds:
				d.syncPeers()
				addC = time.After(d.syncDelay)
				startDue()
			default:
				syncPending = true
			}
		case <-addC:
			addC = nil
		case <-syncC:
			syncC = nil
			if syncPending {
				syncPending = false
				d.syncPeers()
				syncC = time.After(d.syncDelay)
			}
		case ev := <-conns.Out():
			// A relayed (limited) connection counts: health pings and
			// small work use it.
			e, ok := ev.(lpevent.EvtPeerConnectednessChanged)
			if !ok {
				break
			}
			if (e.Connectedness == network.Connected || e.Connectedness == network.Limited) && d.probeWorthy(string(e.Peer)) {
				if due, ok := d.sel.Liveness().ProbeFor(string(e.Peer)); ok {
					d.forgetDialBackoff(e.Peer)
					probe(due)
				}
			}
			if _, known := d.synced[e.Peer]; known {
				d.noteUnconnected(e.Peer, e.Connectedness != network.Connected && e.Connectedness != network.Limited)
				d.nUnconnected.Store(int64(len(d.unconnected)))
			}
			if d.noteRelayed(e.Peer, e.Connectedness == network.Limited) {
				// Direct peers win over relayed ones among equals: the
				// candidate changes, and is synced now or at the window's end.
				if syncC == nil {
					d.syncPeers()
					syncC = time.After(d.syncDelay)
				} else {
					syncPending = true
				}
			}
		case <-ticker.C:
			d.sel.MaybeRefresh()
			startDue()
			if ticks++; ticks%protectEvery == 1 {
				d.protectLeading()
			}
		}
	}
}

// noteUnconnected notes whether the host holds no connection to peer id,
// direct or relayed, as a sync (for the entries that changed) or a
// connection event says.
func (d *Dispatcher) noteUnconnected(id peer.ID, unconnected bool) {
	if !unconnected {
		delete(d.unconnected, id)
		return
	}
	if d.unconnected == nil {
		d.unconnected = make(map[peer.ID]struct{})
	}
	d.unconnected[id] = struct{}{}
}

// noteRelayed records whether the host is connected to p through a relay
// only, and reports whether that changed.
func (d *Dispatcher) noteRelayed(p peer.ID, relayed bool) bool {
	if d.relayed[p] == relayed {
		return false
	}
	if relayed {
		if d.relayed == nil {
			d.relayed = make(map[peer.ID]bool)
		}
		d.relayed[p] = true
	} else {
		delete(d.relayed, p)
	}
	return true
}

// forgetDialBackoff clears the host's dial backoff of p before a probe
// that news of it asked for: the failed dials it remembers were to what p
// was before (no relay slot yet, its link down), and the probe would
// otherwise fail at once with "a dial just failed".
func (d *Dispatcher) forgetDialBackoff(p peer.ID) {
	if sw, ok := d.node.Host().Network().(*swarm.Swarm); ok {
		sw.Backoff().Clear(p)
	}
}

// probeWorthy reports whether news of the peer (a new connection, a new
// record) is worth a poll at once: it is unreachable, or new and not yet
// answering (its first polls may have found no address to dial).
func (d *Dispatcher) probeWorthy(id string) bool {
	live := d.sel.Liveness()
	return live.State(id) == selection.StateUnreachable || live.AwaitsFirstPoll(id)
}

// poll pings one peer over the health protocol and reports the result to
// liveness, for the entry it was due for: a peer removed meanwhile stays
// removed.
func (d *Dispatcher) poll(ctx context.Context, due selection.Poll) {
	id := due.Peer
	pid := peer.ID(id)
	var err error
	var rtt time.Duration
	pctx, cancel := context.WithTimeout(ctx, d.pollWait(id))
	defer cancel()
	if live := d.sel.Liveness(); live.State(id) == selection.StateProbing && !live.AwaitsFirstPoll(id) {
		// It answered its redial a moment ago: the host's memory of
		// failed dials to it (while its link was cut) is stale, and a
		// probing peer's one failure sends it back to redialing. (A new
		// peer's dials keep their backoff: only news of it clears that.)
		d.forgetDialBackoff(pid)
	}
	if err = d.connect(pctx, id); err == nil {
		var ans node.HealthAnswer
		heard, counted := connPackets(d.node.Host(), pid)
		rtt, ans, err = d.node.Ping(pctx, pid)
		if err == nil {
			d.pollLoad(id, ans)
		}
		if dl, _ := pctx.Deadline(); err != nil && ctx.Err() == nil && !time.Now().Before(dl) && d.silent(id, pid, heard, counted) {
			// The peer did not answer on an open connection within its
			// wait (the ping failed as its wait ran out: by the stream's
			// deadline or the context's, whichever came first), and the
			// connection heard nothing from it meanwhile (silent): it
			// may be a killed process, which QUIC hears of only at its
			// idle timeout, holding accepted work of this node's
			// requests that will never be answered. Closing the connection
			// ends those attempts now, as lost connections, and their
			// requests go on to another worker while their deadlines allow;
			// the next poll redials.
			if cerr := d.node.Host().Network().ClosePeer(pid); cerr != nil {
				d.log.WithField("peer", pid.String()).WithError(cerr).Debug("close the connection to a silent peer")
			}
		}
	}
	if ctx.Err() != nil {
		return // shutting down: not the peer's fault
	}
	if err != nil && d.debug {
		d.log.WithFields(logrus.Fields{"peer": d.idString(id), logrus.ErrorKey: attemptCause(err)}).Debug("poll failed")
	}
	d.metrics.poll(id, rtt, err, time.Now())
	t, changed := d.sel.Liveness().ReportPoll(due, err == nil)
	if changed {
		d.logTransition(t, err)
	}
}

func (d *Dispatcher) report(id string, ok bool, err error) {
	if t, changed := d.sel.Liveness().Report(id, ok); changed {
		d.logTransition(t, err)
	}
}

// logTransition logs a change of a peer's liveness, with the error that
// caused it when there is one.
func (d *Dispatcher) logTransition(t selection.Transition, err error) {
	id := t.Peer
	f := d.log.WithFields(logrus.Fields{"peer": peer.ID(id).String(), "from": t.From.String(), "to": t.To.String()})
	if err != nil {
		f = f.WithField(logrus.ErrorKey, attemptCause(err))
	}
	if t.First {
		f.Debug("peer liveness changed: its first poll answered")
		return
	}
	if pi, ok := d.node.Peers().Get(peer.ID(id)); ok && left(pi) {
		// It left (syncPeers logged "peer left"): its polls fail because
		// it stopped, which is no liveness failure worth an info line.
		f.Debug("peer liveness changed")
		return
	}
	f.Info("peer liveness changed")
}

// syncPeers hands the peer table's fresh peers to the selector.
func (d *Dispatcher) syncPeers() {
	// Noted before reading, so that a peer entered meanwhile is synced
	// again rather than missed.
	d.syncedAdds = d.node.Peers().Additions()
	entries := d.node.Peers().Entries()
	if d.synced == nil {
		d.synced = make(map[peer.ID]syncedPeer, len(entries))
	}
	// A peer whose entry is the one of the last sync is unchanged; one with
	// a new entry (a re-announcement, a connection change) is converted
	// again, and counts as a change only when what selection uses differs.
	changed, kept, before := false, 0, len(d.synced)
	for _, e := range entries {
		id := e.Data.PeerID
		old, ok := d.synced[id]
		relayed := !e.Connected && d.relayed[id]
		if ok {
			kept++
			if old.entry == e && old.peer.Relayed == relayed {
				continue
			}
		}
		sp := syncedPeer{entry: e, peer: peerOf(*e), name: old.name}
		sp.peer.Relayed = relayed
		if ok && left(*e) && !left(*old.entry) {
			d.log.WithField("peer", id.String()).Info("peer left: it withdrew its work types and disconnected")
		}
		if !ok {
			sp.name = id.String()
			changed = true
		} else if !old.peer.Equal(sp.peer) {
			changed = true
		}
		d.synced[id] = sp
		d.noteUnconnected(id, !e.Connected && !relayed)
	}
	if kept < before { // some peers are gone
		changed = true
		present := make(map[peer.ID]struct{}, len(entries))
		for _, e := range entries {
			present[e.Data.PeerID] = struct{}{}
		}
		for id := range d.synced {
			if _, ok := present[id]; !ok {
				delete(d.synced, id)
				delete(d.unconnected, id)
			}
		}
	}
	d.nUnconnected.Store(int64(len(d.unconnected)))
	if !changed {
		return
	}
	peers := make([]selection.Peer, 0, len(d.synced))
	names := make(map[string]string, len(d.synced))
	for _, sp := range d.synced {
		peers = append(peers, sp.peer)
		names[sp.peer.ID] = sp.name
	}
	d.names.Store(&names)
	d.sel.SetPeers(peers)
}

// syncedPeer is a peer as the dispatcher last synced it: the table entry it
// came from, its selection candidate and its base58 ID.
type syncedPeer struct {
	entry *node.PeerInfo
	peer  selection.Peer
	name  string
}

// idString returns the base58 form of a raw peer ID, from the names of the
// synced peers when it is one of them.
func (d *Dispatcher) idString(raw string) string {
	if names := d.names.Load(); names != nil {
		if s, ok := (*names)[raw]; ok {
			return s
		}
	}
	return peer.ID(raw).String()
}

// peerOf converts a peer table entry to a selection candidate.
func peerOf(pi node.PeerInfo) selection.Peer {
	nd := pi.Data
	// Candidates carry the peer ID's raw bytes: turning them back into a
	// peer.ID costs nothing on the request path.
	p := selection.Peer{ID: string(nd.PeerID), Labels: pi.GroupLabels(), Connected: pi.Connected,
		Concurrency: nd.Capacity.MaxConcurrent,
		Capacity:    nd.Capacity.MaxConcurrent + nd.Capacity.QueueSize, Used: nd.Load.InFlight + nd.Load.Queued}
	for _, wt := range nd.WorkTypes {
		t := selection.TypeInfo{Name: wt.Name}
		if wt.Head != nil {
			t.Head, t.HasHead = *wt.Head, true
		}
		p.Types = append(p.Types, t)
	}
	if c := nd.Capacity.MaxConcurrent + nd.Capacity.QueueSize; c > 0 {
		p.Load = float64(nd.Load.InFlight+nd.Load.Queued) / float64(c)
	}
	return p
}

// connectedPeers subscribes to the host's connection changes; a host whose
// bus refuses gives a subscription that never fires.
func (d *Dispatcher) connectedPeers() lpevent.Subscription {
	sub, err := d.node.Host().EventBus().Subscribe(new(lpevent.EvtPeerConnectednessChanged), eventbus.Name("workmesh dispatch liveness"))
	if err != nil {
		d.log.WithError(err).Warn("liveness: no connection events")
		return noEvents{}
	}
	return sub
}

type noEvents struct{}

func (noEvents) Out() <-chan any { return nil }
func (noEvents) Close() error    { return nil }
func (noEvents) Name() string    { return "none" }
