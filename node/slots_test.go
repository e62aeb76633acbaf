package node

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/workmesh/workmesh/tests/testkit"
)

// holdStreams has peers new identities connect to victim and each open
// perPeer streams of pid that send one byte and nothing more, and returns
// how many the victim took.
func holdStreams(t *testing.T, victim *Node, pid protocol.ID, peers, perPeer int) int {
	t.Helper()
	held := 0
	for range peers {
		h := strangerHost(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := h.Connect(ctx, peer.AddrInfo{ID: victim.ID(), Addrs: victim.Host().Addrs()}); err != nil {
			cancel()
			t.Fatal(err)
		}
		for range perPeer {
			s, err := h.NewStream(ctx, victim.ID(), pid)
			if err != nil {
				continue
			}
			if _, err := s.Write([]byte{0}); err == nil {
				held++
			}
		}
		cancel()
	}
	return held
}

// strangerHost is a bare libp2p host of a new identity on loopback, as a
// peer the node never heard of has; it closes when the test ends.
func strangerHost(t *testing.T) host.Host {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHost(key, testNetwork, "test", []ma.Multiaddr{ma.StringCast("/ip4/127.0.0.1/udp/0/quic-v1")}, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// inbound is how many inbound streams of pid the victim holds now.
func inbound(n *Node, pid protocol.ID) int {
	count := 0
	_ = n.Host().Network().ResourceManager().ViewProtocol(pid, func(s network.ProtocolScope) error {
		count = s.Stat().NumStreamsInbound
		return nil
	})
	return count
}

// Peers that open health and nodedata streams and send one byte of a
// request, as many of them as one machine's addresses allow (32 and 16
// identities, each opening more streams than the per-peer limit takes), do
// not keep an honest dispatcher's pings and an honest sync from the node:
// each holds only its own share of the protocol's streams. (Here their
// requests are given 30s; TestLateRequestsAreReset has the shipped bound.)
func TestHealthAndSyncServeHonestPeersWhileStrangersHoldStreams(t *testing.T) {
	was := requestReadTimeout
	requestReadTimeout = 30 * time.Second
	t.Cleanup(func() { requestReadTimeout = was }) // after the nodes close
	victim := startTestNode(t, testConfig(t))
	honest := startTestNode(t, testConfig(t))
	connect(t, honest, victim)
	health, nodedata := HealthProtocol(testNetwork), NodeDataProtocol(testNetwork)
	holdStreams(t, victim, health, 32, 8)
	holdStreams(t, victim, nodedata, 16, 2)
	want := 32*healthPeerLimit.StreamsInbound + 16*nodedataPeerLimit.StreamsInbound
	testkit.WaitFor(t, 5*time.Second, "the victim holding the strangers' streams", func() error {
		if got := inbound(victim, health) + inbound(victim, nodedata); got < want {
			return fmt.Errorf("%d of %d streams", got, want)
		}
		return nil
	})
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _, err := honest.Ping(ctx, victim.ID())
		cancel()
		if err != nil {
			t.Fatalf("honest ping %d while strangers hold %d health streams: %v", i, inbound(victim, health), err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := honest.fetchNodeData(ctx, victim.ID(), true); err != nil {
		t.Fatalf("honest sync while strangers hold %d nodedata streams: %v", inbound(victim, nodedata), err)
	}
}

// A health or nodedata request that does not arrive within
// requestReadTimeout of its stream is given up: the stream is reset, and
// the peer that opened it holds nothing of the node.
func TestLateRequestsAreReset(t *testing.T) {
	victim := startTestNode(t, testConfig(t))
	health, nodedata := HealthProtocol(testNetwork), NodeDataProtocol(testNetwork)
	holdStreams(t, victim, health, 2, 4)
	holdStreams(t, victim, nodedata, 2, 2)
	testkit.WaitFor(t, 5*time.Second, "the victim holding the streams", func() error {
		if got := inbound(victim, health) + inbound(victim, nodedata); got == 0 {
			return fmt.Errorf("none held")
		}
		return nil
	})
	// Within a few times requestReadTimeout, well before the 5s and 10s
	// the exchanges themselves may take.
	testkit.WaitFor(t, 4*requestReadTimeout, "the late streams reset", func() error {
		if got := inbound(victim, health) + inbound(victim, nodedata); got > 0 {
			return fmt.Errorf("%d still held", got)
		}
		return nil
	})
}
