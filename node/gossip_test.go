package node

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// TestGossipRefusesBadRecordSignature: gossip messages carry no signature of
// their own, so the record's signature is the one that counts, whoever
// publishes it. A node publishing its own record with a broken signature
// (which a gossipsub message signature by the same node used to vouch for)
// is refused as forged by its peer, which keeps the record it had; the same
// record properly signed is then taken.
func TestGossipRefusesBadRecordSignature(t *testing.T) {
	hosts := linkedMockHosts(t, 2)
	a := startTestNode(t, testConfig(t), WithHost(hosts[0]))
	cfgB := testConfig(t)
	for _, ad := range a.Addrs() {
		cfgB.Bootstrap = append(cfgB.Bootstrap, ad.String())
	}
	b := startTestNode(t, cfgB, WithHost(hosts[1]))
	waitKnows(t, b, a.ID(), 10*time.Second)
	testkit.WaitFor(t, 10*time.Second, "a's gossip reaches b", func() error {
		// b subscribed to the topic as a sees it, and a's stream to b
		// open: only then does a publication of a go to b.
		if !slices.Contains(a.Gossip().Peers(), b.ID()) || !a.Gossip().HasStream(b.ID()) {
			return fmt.Errorf("a does not gossip to b yet")
		}
		return nil
	})
	held, _ := b.Peers().Get(a.ID())

	nd := a.NodeData().Data
	nd.Sequence = held.Data.Sequence + 10
	good, err := SignNodeData(nd, a.records.key)
	if err != nil {
		t.Fatal(err)
	}
	forged := func() uint64 { return b.Peers().RejectionsBySource()[SourceGossip][RejectForged] }
	before := forged()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Gossip().Publish(ctx, withBadSignature(good)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "b refuses the record with a broken signature", func() error {
		if forged() == before {
			return fmt.Errorf("no forged record counted from gossip")
		}
		return nil
	})
	if p, _ := b.Peers().Get(a.ID()); p.Data.Sequence != held.Data.Sequence {
		t.Fatalf("b holds sequence %d of a after the forged record, want %d", p.Data.Sequence, held.Data.Sequence)
	}
	if err := a.Gossip().Publish(ctx, good); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "b takes the well-signed record", func() error {
		if p, _ := b.Peers().Get(a.ID()); p.Data.Sequence != nd.Sequence {
			return fmt.Errorf("b holds sequence %d, want %d", p.Data.Sequence, nd.Sequence)
		}
		return nil
	}, b.Peers().Changed)
}
