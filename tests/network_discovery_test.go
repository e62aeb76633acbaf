package tests

import (
	"fmt"
	"testing"
	"time"

	"github.com/workmesh/workmesh/node"
)

// tenNodeBound is how long ten nodes started together on loopback may take
// until every one lists the other nine. Measured on 2 cores: 0.48-0.64s
// after the last node started (5 runs). That is a cold start: no gossipsub
// mesh exists yet (meshes form at the first heartbeats, 1s apart), so a
// newcomer's announcement reaches the bootstrap node but is not relayed
// further; the others learn it when the first DHT refresh (0.5s after
// joining) connects them to it and the nodedata sync and join greeting
// run. The bound leaves about 8x margin for a loaded CI machine.
const tenNodeBound = 5 * time.Second

func TestNetworkTenNodesDiscoverEachOther(t *testing.T) {
	const count = 10
	specs := make([]nodeSpec, count)
	for i := range specs {
		specs[i] = nodeSpec{
			workTypes: []string{"echo", fmt.Sprintf("type-%d", i%3)},
			labels:    []string{fmt.Sprintf("zone-%d", i%2)},
		}
	}
	nodes := make([]*node.Node, count)
	nodes[0] = startNode(t, testNodeConfig(t, specs[0], nil))
	boot := addrStrings(nodes[0])
	for i := 1; i < count; i++ {
		nodes[i] = startNode(t, testNodeConfig(t, specs[i], boot))
	}
	took := waitFor(t, tenNodeBound, "ten nodes list each other", func() error {
		missing, first := 0, error(nil)
		for i, n := range nodes {
			for j, other := range nodes {
				if i == j {
					continue
				}
				if err := knows(n, other, specs[j].workTypes, specs[j].labels); err != nil {
					missing++
					if first == nil {
						first = err
					}
				}
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d pairs missing, first: %w", missing, count*(count-1), first)
		}
		return nil
	}, tables(nodes)...)
	t.Logf("ten nodes list each other %s after the last one started", took)
	for i, n := range nodes {
		if got := n.Peers().Len(); got != count-1 {
			t.Errorf("node %d lists %d peers, want %d", i, got, count-1)
		}
		rej := n.Peers().Rejections()
		if bad := rej[node.RejectForged] + rej[node.RejectMalformed] + rej[node.RejectOversized] + rej[node.RejectWrongNetwork]; bad != 0 {
			t.Errorf("node %d rejected honest records: %v", i, rej)
		}
	}
}

// TestNetworkStoppedNodeExpires stops one of three nodes: the others keep
// it until its record's TTL runs out, then drop it, and keep each other.
func TestNetworkStoppedNodeExpires(t *testing.T) {
	const ttl, announce = 1500 * time.Millisecond, 250 * time.Millisecond
	spec := nodeSpec{workTypes: []string{"echo"}, announce: announce, ttl: ttl}
	a := startNode(t, testNodeConfig(t, spec, nil))
	b := startNode(t, testNodeConfig(t, spec, addrStrings(a)))
	c := startNode(t, testNodeConfig(t, spec, addrStrings(a)))
	all := []*node.Node{a, b, c}
	waitFor(t, 5*time.Second, "three nodes list each other", func() error {
		return allKnow(all)
	}, tables(all)...)

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	for _, n := range []*node.Node{a, b} {
		if _, ok := n.Peers().Get(c.ID()); !ok {
			t.Fatalf("%s dropped the stopped node at once, before its TTL", n.ID().ShortString())
		}
	}
	// C's last record was signed at most one announce interval before it
	// stopped, so it must be gone within the TTL after stopping (plus a
	// little for scheduling), and not before TTL - interval.
	took := waitFor(t, ttl+time.Second, "stopped node expires", func() error {
		for _, n := range []*node.Node{a, b} {
			if _, ok := n.Peers().Get(c.ID()); ok {
				return fmt.Errorf("%s still lists the stopped node", n.ID().ShortString())
			}
		}
		return nil
	}, a.Peers(), b.Peers())
	if early := ttl - announce - 100*time.Millisecond; time.Since(stopped) < early {
		t.Errorf("stopped node gone after %s, before its TTL allows (%s)", took, early)
	}
	t.Logf("stopped node gone %s after it stopped (TTL %s)", took, ttl)
	if err := allKnow([]*node.Node{a, b}); err != nil {
		t.Errorf("live nodes lost each other: %v", err)
	}
}

// TestNetworkWorkTypeChangeSeen changes one node's work types; the others
// see the new ones.
func TestNetworkWorkTypeChangeSeen(t *testing.T) {
	spec := nodeSpec{workTypes: []string{"echo"}}
	a := startNode(t, testNodeConfig(t, spec, nil))
	b := startNode(t, testNodeConfig(t, spec, addrStrings(a)))
	c := startNode(t, testNodeConfig(t, spec, addrStrings(a)))
	all := []*node.Node{a, b, c}
	waitFor(t, 5*time.Second, "three nodes list each other", func() error { return allKnow(all) }, tables(all)...)

	if err := c.SetWorkTypes([]string{"sha256", "sleep"}); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 2*time.Second, "new work types seen", func() error {
		for _, n := range []*node.Node{a, b} {
			if err := knows(n, c, []string{"sha256", "sleep"}, nil); err != nil {
				return err
			}
		}
		return nil
	}, a.Peers(), b.Peers())
	t.Logf("work type change seen after %s", took)
	for _, n := range []*node.Node{a, b} {
		if got := n.Peers().Eligible("echo", nil); len(got) != 1 {
			t.Errorf("%s: %d eligible for echo after C dropped it, want 1", n.ID().ShortString(), len(got))
		}
		if got := n.Peers().Eligible("sha256", nil); len(got) != 1 || got[0].Data.PeerID != c.ID() {
			t.Errorf("%s: eligible for sha256 = %v, want C", n.ID().ShortString(), got)
		}
	}
}

func tables(nodes []*node.Node) []*node.PeerTable {
	out := make([]*node.PeerTable, len(nodes))
	for i, n := range nodes {
		out[i] = n.Peers()
	}
	return out
}

// allKnow reports the first pair of nodes where one does not list the other.
func allKnow(nodes []*node.Node) error {
	for _, n := range nodes {
		for _, other := range nodes {
			if n == other {
				continue
			}
			if _, ok := n.Peers().Get(other.ID()); !ok {
				return fmt.Errorf("%s does not list %s", n.ID().ShortString(), other.ID().ShortString())
			}
		}
	}
	return nil
}
