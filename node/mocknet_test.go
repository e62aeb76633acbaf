package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/workmesh/workmesh/tests/testkit"
)

// waitKnows waits, on every change of n's peer table, until it holds a
// record of other.
func waitKnows(t *testing.T, n *Node, other peer.ID, within time.Duration) {
	t.Helper()
	testkit.WaitFor(t, within, fmt.Sprintf("%s knows %s", n.ID().ShortString(), other.ShortString()), func() error {
		if _, ok := n.Peers().Get(other); !ok {
			return errors.New("no record of it")
		}
		return nil
	}, n.Peers().Changed)
}

// TestNodeOnMocknetHost runs two nodes on hosts of go-libp2p's in-memory
// mock network: one bootstraps from the other, each learns the other's
// record, a health ping goes through, and closing a node leaves its host
// open without the node's handlers.
func TestNodeOnMocknetHost(t *testing.T) {
	hosts := linkedMockHosts(t, 2)
	before := hosts[0].Mux().Protocols()

	cfgA := testConfig(t)
	cfgA.WorkTypes = []string{"echo"}
	a := startTestNode(t, cfgA, WithHost(hosts[0]), WithLocalState(stubState{}))
	cfgB := testConfig(t)
	for _, ad := range a.Addrs() {
		cfgB.Bootstrap = append(cfgB.Bootstrap, ad.String())
	}
	b := startTestNode(t, cfgB, WithHost(hosts[1]))
	if a.ID() != hosts[0].ID() || b.ID() != hosts[1].ID() {
		t.Fatalf("nodes %s, %s do not run as their hosts %s, %s", a.ID(), b.ID(), hosts[0].ID(), hosts[1].ID())
	}

	waitKnows(t, a, b.ID(), 10*time.Second)
	waitKnows(t, b, a.ID(), 10*time.Second)
	if p, _ := b.Peers().Get(a.ID()); !slices.Equal(p.Data.WorkTypeNames(), []string{"echo"}) {
		t.Errorf("b sees a with work types %v, want [echo]", p.Data.WorkTypeNames())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, ans, err := b.Ping(ctx, a.ID())
	if err != nil {
		t.Fatalf("health ping over mocknet: %v", err)
	}
	if want := a.NodeData().Data.Sequence; ans.Sequence != want {
		t.Errorf("ping answered sequence %d, want %d", ans.Sequence, want)
	}

	// The node does not own a host it was given.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if got := hosts[0].Mux().Protocols(); !sameProtocols(got, before) {
		t.Errorf("after Close the host serves %v, want what it served before the node: %v", got, before)
	}
	if _, _, err := b.Ping(ctx, a.ID()); err == nil {
		t.Error("a closed node still answers health pings on its host")
	}
	if _, err := hosts[1].Network().DialPeer(ctx, hosts[0].ID()); err != nil {
		t.Errorf("the host was closed with the node: %v", err)
	}
}

func sameProtocols(a, b []protocol.ID) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func TestWithHostRefusesAnotherIdentity(t *testing.T) {
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	h, err := mn.GenPeer()
	if err != nil {
		t.Fatal(err)
	}
	other := newPeerKey(t)
	n, err := New(context.Background(), testConfig(t), WithLogger(quietLogger()), WithHost(h), WithIdentity(other.key))
	if err == nil {
		n.Close()
		t.Fatal("started with an identity that is not the host's")
	}
}

// linkedMockHosts returns n hosts of one in-memory mock network, linked so
// that they can dial each other (links are what lets mocknet peers dial at
// all); the network closes with the test.
func linkedMockHosts(t testing.TB, n int) []host.Host {
	t.Helper()
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	hosts := make([]host.Host, n)
	for i := range hosts {
		h, err := mn.GenPeer()
		if err != nil {
			t.Fatal(err)
		}
		hosts[i] = h
	}
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	return hosts
}
