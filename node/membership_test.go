package node

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/protocol/identify"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/workmesh/workmesh/tests/testkit"
)

// TestBootstrapPeerNotOfThisNetwork bootstraps a node from a peer that
// speaks no workmesh protocol and from one of another network: each is
// named in a warning that says what it is.
func TestBootstrapPeerNotOfThisNetwork(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve string // a protocol the bootstrap peer serves
		want  string
	}{
		{"plain libp2p peer", "", "does not speak workmesh network " + testNetwork},
		{"another network", "/workmesh/other/nodedata/1.0.0", "is on network other, this node is on " + testNetwork},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hosts := linkedMockHosts(t, 2)
			if tc.serve != "" {
				hosts[1].SetStreamHandler(protocol.ID(tc.serve), func(s network.Stream) { s.Reset() })
			}
			addr, hook := startBootstrappedFrom(t, hosts[0], hosts[1])
			want := "bootstrap peer " + addr + " " + tc.want
			waitWarning(t, hook, 5*time.Second, want)
		})
	}
}

// TestBootstrapPeerTooBusyToIdentifyKeepsItsConnection bootstraps a node
// from a peer that takes no record and whose identify never answers, as a
// member of the network too loaded to answer in time would: the warning
// says so, and the connection to it stays open (the peer is not known to
// be of another network).
func TestBootstrapPeerTooBusyToIdentifyKeepsItsConnection(t *testing.T) {
	hosts := linkedMockHosts(t, 2)
	stalled := make(chan struct{})
	t.Cleanup(func() { close(stalled) })
	hosts[1].SetStreamHandler(identify.ID, func(s network.Stream) {
		<-stalled
		s.Reset()
	})
	addr, hook := startBootstrappedFrom(t, hosts[0], hosts[1])
	want := "bootstrap " + addr + ": reached, but it neither took this node's record nor identified itself within 1s"
	waitWarning(t, hook, 10*time.Second, want)
	if c := hosts[0].Network().Connectedness(hosts[1].ID()); c != network.Connected {
		t.Fatalf("the connection to the busy bootstrap peer: %v, want it kept", c)
	}
}

// waitWarning waits until the log has a warning that contains want.
func waitWarning(t *testing.T, hook *logtest.Hook, within time.Duration, want string) {
	t.Helper()
	testkit.WaitFor(t, within, "a warning: "+want, func() error {
		var seen []string
		for _, e := range hook.AllEntries() {
			if e.Level == logrus.WarnLevel && strings.Contains(e.Message, want) {
				t.Logf("%s", e.Message)
				return nil
			}
			seen = append(seen, e.Message)
		}
		return fmt.Errorf("logged %q", seen)
	})
}

// startBootstrappedFrom starts a node on h with boot as its bootstrap
// peer, and returns boot's address as the node was given it and the
// node's log.
func startBootstrappedFrom(t *testing.T, h, boot host.Host) (string, *logtest.Hook) {
	t.Helper()
	log, hook := logtest.NewNullLogger()
	cfg := testConfig(t)
	addrs, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: boot.ID(), Addrs: boot.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Bootstrap = []string{addrs[0].String()}
	startTestNode(t, cfg, WithHost(h), WithLogger(log))
	return addrs[0].String(), hook
}

// TestMissedPeerIsPushedTheRecord: a peer greeted as having missed a
// publication of this node's (gossipsub had no send queue to the peer yet,
// pubsub's LeftOut) has this node's record pushed to it, though the node holds
// the peer's record and has done its whole-table syncs, when a join would
// exchange nothing: the record the peer holds may be older than the one it
// missed.
func TestMissedPeerIsPushedTheRecord(t *testing.T) {
	a := startTestNode(t, testConfig(t))
	b := startTestNode(t, testConfig(t))
	connect(t, b, a)
	seq := func(n, of *Node) uint64 {
		info, _ := n.table.Get(of.ID())
		return info.Data.Sequence
	}
	testkit.WaitFor(t, 10*time.Second, "each node holding the other's record", func() error {
		if seq(b, a) != a.current().Data.Sequence || seq(a, b) == 0 {
			return fmt.Errorf("b holds a's sequence %d of %d, a holds b's %d", seq(b, a), a.current().Data.Sequence, seq(a, b))
		}
		return nil
	})
	// A newer record of a's that gossip did not carry to b, as one that
	// left b out would not have.
	if err := a.records.resign(); err != nil {
		t.Fatal(err)
	}
	// a's record has reached enough peers, and a has its whole-table
	// syncs: a join alone pushes nothing.
	a.members.rec.reach.Store(minReach)
	a.members.synced.Store(fullSyncs)
	want := a.current().Data.Sequence
	a.members.onPeerJoin(b.ID(), true)
	testkit.WaitFor(t, 10*time.Second, "b holding a's newest record", func() error {
		if got := seq(b, a); got != want {
			return fmt.Errorf("b holds a's sequence %d, a's newest is %d", got, want)
		}
		return nil
	})
}
