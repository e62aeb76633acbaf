package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	lpubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/pubsub"
)

// TestNetworkGossipRejectsBadRecords has a raw gossipsub host, with no
// validator of its own, publish forged, replayed, oversized, malformed and
// foreign-network records on the NodeData topic. The honest node counts
// each under its reason, and its record of the victim stays the victim's
// own. (The victim's genuine record passed on by the attacker is no attack:
// see TestNetworkGossipAcceptsRelayedRecords.)
func TestNetworkGossipRejectsBadRecords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	network := config.Defaults().Node.Network
	observer := startNode(t, testNodeConfig(t, nodeSpec{workTypes: []string{"echo"}}, nil))
	victim := startNode(t, testNodeConfig(t, nodeSpec{workTypes: []string{"echo"}}, addrStrings(observer)))
	waitFor(t, 5*time.Second, "observer lists victim", func() error {
		return knows(observer, victim, []string{"echo"}, nil)
	}, observer.Peers())
	good, _ := observer.Peers().Get(victim.ID())

	key, topic := rawGossiper(t, ctx, observer)
	attacker, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}

	sign := func(nd node.NodeData) []byte {
		b, err := node.SignNodeData(nd, key)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	own := func(seq uint64, net string) node.NodeData {
		return node.NodeData{PeerID: attacker, Network: net, Version: "evil", Sequence: seq,
			WorkTypes: []node.WorkType{{Name: "echo"}}, StartTime: time.Now()}
	}
	// A newer record "of the victim", signed by the attacker.
	forgedData := good.Data
	forgedData.Sequence++
	forgedData.WorkTypes = []node.WorkType{{Name: "steal"}}
	forged := signRaw(t, forgedData, key)

	bad := []struct {
		name string
		data []byte
		want node.RejectReason
	}{
		{"victim's record signed by the attacker", forged, node.RejectForged},
		// Passed on by anyone, a genuine record is a duplicate, not a
		// rejection (0: counted under no reason).
		{"victim's genuine record passed on by the attacker", good.Envelope, 0},
		{"oversized", bytes.Repeat([]byte{0x0a}, node.MaxRecordSize+1), node.RejectOversized},
		{"malformed", []byte("definitely not an envelope"), node.RejectMalformed},
		{"own record for another network", sign(own(uint64(time.Now().UnixNano()), "elsewhere")), node.RejectWrongNetwork},
	}
	// First a valid record of the attacker's own, then an older one: a
	// replay the observer ignores without passing it on.
	if err := topic.Publish(ctx, sign(own(uint64(time.Now().UnixNano()), network))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "observer lists the attacker's own record", func() error {
		if _, ok := observer.Peers().Get(attacker); !ok {
			return fmt.Errorf("not yet")
		}
		return nil
	}, observer.Peers())
	bad = append(bad, struct {
		name string
		data []byte
		want node.RejectReason
	}{"replayed older record", sign(own(1, network)), node.RejectReplay})

	before := observer.Peers().Rejections()
	want := map[node.RejectReason]uint64{}
	for _, b := range bad {
		if err := topic.Publish(ctx, b.data); err != nil {
			t.Fatalf("%s: publish: %v", b.name, err)
		}
		if b.want != 0 {
			want[b.want]++
		}
	}
	waitFor(t, 5*time.Second, "every bad record counted", func() error {
		got := observer.Peers().Rejections()
		for _, r := range node.RejectReasons() {
			if n := want[r]; got[r]-before[r] != n {
				return fmt.Errorf("%s: %d counted, want %d (all: %v)", r, got[r]-before[r], n, got)
			}
		}
		return nil
	})
	now, _ := observer.Peers().Get(victim.ID())
	if now.Data.Sequence < good.Data.Sequence || now.Data.Serves("steal") {
		t.Errorf("victim's record displaced: %+v", now.Data)
	}
	if p, _ := observer.Peers().Get(attacker); p.Data.Sequence == 1 {
		t.Error("attacker's replayed older record displaced its newer one")
	}
}

// TestNetworkGossipAcceptsRelayedRecords has a raw gossipsub host pass on
// the records of a third peer, which is not connected to anyone: the honest
// node enters a record that peer signed, whoever published it on gossip,
// and refuses one signed by the publisher in that peer's name.
func TestNetworkGossipAcceptsRelayedRecords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	network := config.Defaults().Node.Network
	observer := startNode(t, testNodeConfig(t, nodeSpec{workTypes: []string{"echo"}}, nil))
	relayerKey, topic := rawGossiper(t, ctx, observer)
	absentKey, absent := newIdentity(t)
	nd := node.NodeData{PeerID: absent, Network: network, Version: "test", Sequence: uint64(time.Now().UnixNano()),
		WorkTypes: []node.WorkType{{Name: "echo"}}, StartTime: time.Now().UTC()}
	genuine, err := node.SignNodeData(nd, absentKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := topic.Publish(ctx, genuine); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "observer enters the relayed record", func() error {
		p, ok := observer.Peers().Get(absent)
		if !ok || !bytes.Equal(p.Envelope, genuine) || p.Source != node.SourceGossip {
			return fmt.Errorf("observer holds %t, source %s", ok, p.Source)
		}
		return nil
	}, observer.Peers())

	before := observer.Peers().RejectionsBySource()[node.SourceGossip][node.RejectForged]
	forgedData := nd
	forgedData.Sequence++
	forgedData.WorkTypes = []node.WorkType{{Name: "steal"}}
	if err := topic.Publish(ctx, signRaw(t, forgedData, relayerKey)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "observer counts the relayed forgery", func() error {
		if got := observer.Peers().RejectionsBySource()[node.SourceGossip][node.RejectForged]; got != before+1 {
			return fmt.Errorf("%d forged from gossip, want %d", got, before+1)
		}
		return nil
	})
	if p, _ := observer.Peers().Get(absent); !bytes.Equal(p.Envelope, genuine) {
		t.Errorf("the relayed forgery displaced the genuine record: %+v", p.Data)
	}
}

// rawGossiper starts a plain libp2p host with raw gossipsub on the NodeData
// topic (no validator of its own, the network's message format; opts go to
// gossipsub), connected to n, and
// returns its key and the topic once both sides see each other on it.
func rawGossiper(t *testing.T, ctx context.Context, n *node.Node, opts ...lpubsub.Option) (crypto.PrivKey, *lpubsub.Topic) {
	t.Helper()
	key, _ := newIdentity(t)
	h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings(loopbackQUIC))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	// The attacker's own send queue holds what a test publishes in a
	// burst: at gossipsub's default of 32, a loaded machine dropped about
	// 650 of 1,000 records before they left the attacker (so the node under
	// test held 33 of 100 identities), and what is measured is the node.
	base := append(pubsub.MessageFormat(), lpubsub.WithFloodPublish(true), lpubsub.WithPeerOutboundQueueSize(4096))
	ps, err := lpubsub.NewGossipSub(ctx, h, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	topic, err := ps.Join(pubsub.TopicName(n.Network()))
	if err != nil {
		t.Fatal(err)
	}
	// Subscribing is what announces the topic to peers.
	sub, err := topic.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Cancel)
	if err := h.Connect(ctx, peer.AddrInfo{ID: n.ID(), Addrs: n.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "raw gossiper and node see each other on the topic", func() error {
		if !contains(topic.ListPeers(), n.ID()) || !contains(n.Gossip().Peers(), h.ID()) {
			return fmt.Errorf("gossiper sees %v, node sees %v, conns %v", topic.ListPeers(), n.Gossip().Peers(), h.Network().Peers())
		}
		return nil
	})
	return key, topic
}

// rawRecord seals any payload as NodeData, so a test can sign a record for
// a peer other than the key's own, as an attacker would.
type rawRecord struct{ payload []byte }

func (*rawRecord) Domain() string                   { return node.RecordDomain }
func (*rawRecord) Codec() []byte                    { return node.RecordCodec }
func (r *rawRecord) MarshalRecord() ([]byte, error) { return r.payload, nil }
func (r *rawRecord) UnmarshalRecord(b []byte) error { r.payload = b; return nil }

func signRaw(t testing.TB, nd node.NodeData, key crypto.PrivKey) []byte {
	t.Helper()
	payload, err := json.Marshal(nd)
	if err != nil {
		t.Fatal(err)
	}
	env, err := record.Seal(&rawRecord{payload}, key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func contains(ids []peer.ID, id peer.ID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// TestNetworkGossipBurstKeepsEveryRecord: 200 genuine records of 200
// peers, published back to back by one peer (as when a network forms or a
// partition heals and many announcements arrive at once), all reach the
// node's peer table. None is dropped for a full gossipsub queue, and the
// node's drop counters (workmesh_gossip_dropped_total) stay at zero.
func TestNetworkGossipBurstKeepsEveryRecord(t *testing.T) {
	const burst = 200
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	observer := startNode(t, testNodeConfig(t, nodeSpec{workTypes: []string{"echo"}}, nil))
	// The sender's own queue to the observer must hold the burst too.
	_, topic := rawGossiper(t, ctx, observer, lpubsub.WithPeerOutboundQueueSize(2*burst))
	records := make([][]byte, burst)
	for i := range records {
		key, id := newIdentity(t)
		records[i] = signRaw(t, node.NodeData{PeerID: id, Network: observer.Network(), Version: "burst",
			Sequence: 1, WorkTypes: []node.WorkType{{Name: "echo"}}, StartTime: time.Now()}, key)
	}
	for _, r := range records {
		if err := topic.Publish(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "observer holds every record of the burst", func() error {
		if got := observer.Peers().Len(); got < burst {
			v, o := observer.Gossip().Dropped()
			return fmt.Errorf("%d of %d records held; dropped %d for a full validation queue, %d for a full peer queue", got, burst, v, o)
		}
		return nil
	}, observer.Peers())
	if v, o := observer.Gossip().Dropped(); v != 0 || o != 0 {
		t.Errorf("dropped %d messages for a full validation queue and %d for a full peer queue, want none", v, o)
	}
}
