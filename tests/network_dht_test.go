package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/workmesh/workmesh/node"
)

// TestNetworkDHTLookupAndProviders checks the DHT side of discovery: a node
// can read another's signed NodeData from the DHT (through the workmesh
// validator) and find the providers of a work type it has not seen.
func TestNetworkDHTLookupAndProviders(t *testing.T) {
	a := startNode(t, testNodeConfig(t, nodeSpec{workTypes: []string{"echo"}}, nil))
	b := startNode(t, testNodeConfig(t, nodeSpec{workTypes: []string{"rare-type"}}, addrStrings(a)))
	c := startNode(t, testNodeConfig(t, nodeSpec{workTypes: []string{"echo"}}, addrStrings(a)))

	// B stores its record and provider record after its first routing-table
	// refresh (half a second after joining); poll until C can read them.
	var got node.NodeData
	took := waitFor(t, 15*time.Second, "C reads B's record from the DHT", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		p, err := c.Lookup(ctx, b.ID())
		if err != nil {
			return err
		}
		got = p
		return nil
	})
	if got.PeerID != b.ID() || !got.Serves("rare-type") {
		t.Fatalf("DHT record of B: %+v", got)
	}
	t.Logf("DHT lookup succeeded after %s", took)

	waitFor(t, 15*time.Second, "C finds B as a provider of rare-type", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		peers, err := c.FindWorkers(ctx, "rare-type")
		if err != nil {
			return err
		}
		if len(peers) != 1 || peers[0].PeerID != b.ID() {
			return fmt.Errorf("found %d workers", len(peers))
		}
		return nil
	})
}
