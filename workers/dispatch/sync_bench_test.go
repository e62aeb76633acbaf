package dispatch

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers/workertest"
)

// BenchmarkDispatcherSyncPeers measures a dispatcher's sync with its peer
// table of 1,000 peers after one peer's record changed: a re-announcement
// that changes nothing dispatch uses (a new sequence, every
// announce-interval from every peer), and a load change, which it uses.
// An op includes entering the new record in the table (PeerTable.Offer,
// under 1us at 1,000 peers; see BenchmarkPeerTableOffer), as every sync follows one.
func BenchmarkDispatcherSyncPeers(b *testing.B) {
	const n = 1000
	peers := make([]*fakePeer, n)
	for i := range peers {
		peers[i] = &fakePeer{types: []string{"echo"}, labels: []string{fmt.Sprintf("zone-%d", i%3)}}
	}
	d := testDispatcher(b, config.Defaults(), peers...)
	table := d.node.Peers()
	for _, change := range []string{"reannounce", "load"} {
		b.Run(change, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				pi, ok := table.Get(peers[i%n].id)
				if !ok {
					b.Fatal("peer not in the table")
				}
				sd := node.SignedNodeData{Data: pi.Data, Envelope: pi.Envelope}
				sd.Data.Sequence++
				if change == "load" {
					sd.Data.Load.InFlight = (sd.Data.Load.InFlight + 1) % 4
				}
				if ok, err := table.Offer(&sd, sd.Data.PeerID, node.SourceGossip); !ok || err != nil {
					b.Fatalf("offer: %v %v", ok, err)
				}
				d.syncPeers()
			}
		})
	}
}

// TestDispatcher_SyncPeersFollowsTheTable: the dispatcher's candidates
// follow its peer table. A record that changes what selection uses (work
// types, a connection) and a new peer reach the ranking; a re-announcement
// that changes none of it (a new sequence only) does not rebuild it.
func TestDispatcher_SyncPeersFollowsTheTable(t *testing.T) {
	a, b := &fakePeer{types: []string{"echo"}}, &fakePeer{types: []string{"echo"}}
	d := testDispatcher(t, config.Defaults(), a, b)
	table := d.node.Peers()
	ranked := func() []string {
		var ids []string
		for _, r := range d.sel.Ranking("echo") {
			ids = append(ids, peer.ID(r.Peer).String())
		}
		slices.Sort(ids)
		return ids
	}
	want := func(ps ...*fakePeer) []string {
		var ids []string
		for _, p := range ps {
			ids = append(ids, p.id.String())
		}
		slices.Sort(ids)
		return ids
	}
	offer := func(nd node.NodeData) {
		t.Helper()
		if ok, err := table.Offer(&node.SignedNodeData{Data: nd}, nd.PeerID, node.SourceGossip); !ok || err != nil {
			t.Fatalf("offer %s: %v %v", nd.PeerID, ok, err)
		}
	}
	reannounce := func(p *fakePeer, edit func(*node.NodeData)) {
		t.Helper()
		pi, ok := table.Get(p.id)
		if !ok {
			t.Fatalf("%s not in the table", p.id)
		}
		nd := pi.Data
		nd.Sequence++
		if edit != nil {
			edit(&nd)
		}
		offer(nd)
	}
	rebuilt := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	if got := ranked(); !slices.Equal(got, want(a, b)) {
		t.Fatalf("ranking %v, want %v", got, want(a, b))
	}

	ch := d.sel.Changed()
	reannounce(a, nil)
	d.syncPeers()
	if rebuilt(ch) {
		t.Error("a re-announcement that changes nothing selection uses rebuilt the ranking")
	}

	reannounce(b, func(nd *node.NodeData) { nd.WorkTypes = []node.WorkType{{Name: "other"}} })
	d.syncPeers()
	if !rebuilt(ch) {
		t.Error("a change of work types did not rebuild the ranking")
	}
	if got := ranked(); !slices.Equal(got, want(a)) {
		t.Errorf("after b stopped serving echo: ranking %v, want %v", got, want(a))
	}

	ch = d.sel.Changed()
	table.SetConnected(a.id, true)
	d.syncPeers()
	if !rebuilt(ch) {
		t.Error("a connection change did not reach selection")
	}

	key, _, err := crypto.GenerateEd25519Key(nil)
	workertest.Must(t, err)
	c := &fakePeer{types: []string{"echo"}}
	c.id, err = peer.IDFromPrivateKey(key)
	workertest.Must(t, err)
	offer(node.NodeData{PeerID: c.id, Network: d.node.Network(), Sequence: 1, WorkTypes: []node.WorkType{{Name: "echo"}},
		Capacity: node.Capacity{MaxConcurrent: 4, QueueSize: 10}})
	d.syncPeers()
	if got := ranked(); !slices.Equal(got, want(a, c)) {
		t.Errorf("after c joined: ranking %v, want %v", got, want(a, c))
	}
	if got := d.idString(string(c.id)); got != c.id.String() {
		t.Errorf("name of c: %q", got)
	}
}

// TestDispatcher_SyncPeersDropsExpired: a peer whose record is past its TTL
// leaves the dispatcher's candidates at the next sync.
func TestDispatcher_SyncPeersDropsExpired(t *testing.T) {
	clk := testkit.NewFakeClockAt(time.Now())
	a, b := &fakePeer{types: []string{"echo"}}, &fakePeer{types: []string{"echo"}}
	cfg := config.Defaults()
	d := testDispatcherWith(t, cfg, []node.Option{node.WithClock(clk)}, a, b)
	if got := len(d.sel.Ranking("echo")); got != 2 {
		t.Fatalf("%d ranked, want 2", got)
	}
	clk.Advance(cfg.Node.RecordTTL / 2)
	pi, _ := d.node.Peers().Get(a.id)
	nd := pi.Data
	nd.Sequence++ // a re-announces, b does not
	if ok, err := d.node.Peers().Offer(&node.SignedNodeData{Data: nd}, a.id, node.SourceGossip); !ok || err != nil {
		t.Fatalf("offer: %v %v", ok, err)
	}
	clk.Advance(cfg.Node.RecordTTL/2 + time.Second)
	d.syncPeers()
	r := d.sel.Ranking("echo")
	if len(r) != 1 || r[0].Peer != string(a.id) {
		var got []string
		for _, x := range r {
			got = append(got, peer.ID(x.Peer).String())
		}
		t.Errorf("ranking %v, want only %s (%s expired)", got, a.id, b.id)
	}
	if got := d.idString(string(b.id)); got != b.id.String() {
		t.Errorf("name of the expired peer: %q", got)
	}
}

// TestDispatcher_NewPeerSyncedDuringABurst: while the changes of known
// peers are being spaced out (Run's sync window, here an hour long), a new
// peer still reaches selection as its record arrives.
func TestDispatcher_NewPeerSyncedDuringABurst(t *testing.T) {
	a := &fakePeer{types: []string{"echo"}}
	d := testDispatcher(t, config.Defaults(), a)
	d.syncDelay = time.Hour
	table := d.node.Peers()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	// awaitRanked waits (10s at most) until the echo ranking satisfies ok,
	// checking it again whenever the selector announces a change.
	awaitRanked := func(what string, ok func([]selection.Ranked) bool) {
		t.Helper()
		testkit.WaitFor(t, 10*time.Second, what, func() error {
			rs := d.sel.Ranking("echo")
			if ok(rs) {
				return nil
			}
			var got []string
			for _, r := range rs {
				got = append(got, peer.ID(r.Peer).String()+" "+r.State.String())
			}
			return fmt.Errorf("not in the ranking: %v", got)
		}, d.sel.Changed)
	}
	has := func(id peer.ID, state selection.State) func([]selection.Ranked) bool {
		return func(rs []selection.Ranked) bool {
			return slices.ContainsFunc(rs, func(r selection.Ranked) bool { return r.Peer == string(id) && r.State == state })
		}
	}
	offer := func(nd node.NodeData) {
		t.Helper()
		if ok, err := table.Offer(&node.SignedNodeData{Data: nd}, nd.PeerID, node.SourceGossip); !ok || err != nil {
			t.Fatalf("offer %s: %v %v", nd.PeerID, ok, err)
		}
	}
	newPeer := func() node.NodeData {
		key, _, err := crypto.GenerateEd25519Key(nil)
		workertest.Must(t, err)
		id, err := peer.IDFromPrivateKey(key)
		workertest.Must(t, err)
		return node.NodeData{PeerID: id, Network: d.node.Network(), Sequence: 1, WorkTypes: []node.WorkType{{Name: "echo"}},
			Capacity: node.Capacity{MaxConcurrent: 4, QueueSize: 10}}
	}
	awaitRanked("a", has(a.id, selection.StateAlive))

	// A change of a is synced at once and opens the window; a's next
	// change waits for the window's end.
	pi, _ := table.Get(a.id)
	nd := pi.Data
	nd.Sequence++
	nd.WorkTypes = append(nd.WorkTypes, node.WorkType{Name: "other"})
	offer(nd)
	awaitRanked("a's first change", func(rs []selection.Ranked) bool { return len(d.sel.Ranking("other")) == 1 })
	nd.Sequence++
	offer(nd)

	// A new peer does not wait. (It is not alive before its first good
	// poll, which this fake peer cannot answer: it is ranked in some state.)
	b := newPeer()
	offer(b)
	awaitRanked("new peer b", func(rs []selection.Ranked) bool {
		return slices.ContainsFunc(rs, func(r selection.Ranked) bool { return r.Peer == string(b.PeerID) })
	})
}
