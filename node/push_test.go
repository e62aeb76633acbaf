package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/workmesh/workmesh/tests/testkit"
)

// bareHost is a libp2p host with no workmesh protocols of its own, keyed by
// p, standing in for a peer that speaks the nodedata protocol by hand.
func bareHost(t *testing.T, p peerKey) host.Host {
	t.Helper()
	h, err := newHost(p.key, testNetwork, "test", []ma.Multiaddr{ma.StringCast("/ip4/127.0.0.1/udp/0/quic-v1")}, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// pushRaw connects h to n, pushes rec on the nodedata protocol and returns
// the records n answered with.
func pushRaw(t *testing.T, h host.Host, n *Node, rec []byte) ([][]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.Connect(ctx, peer.AddrInfo{ID: n.ID(), Addrs: n.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	s, err := h.NewStream(ctx, n.ID(), NodeDataProtocol(testNetwork))
	if err != nil {
		t.Fatal(err)
	}
	return pushOn(s, rec)
}

// pushOn pushes rec on s, a nodedata stream, and returns the records the
// other end answered with.
func pushOn(s network.Stream, rec []byte) ([][]byte, error) {
	defer s.Reset()
	s.SetDeadline(time.Now().Add(5 * time.Second))
	if err := writeJSONFrame(s, nodedataRequest{Push: true}, maxRequestFrame); err != nil {
		return nil, err
	}
	if err := writeFrame(s, rec); err != nil {
		return nil, err
	}
	s.CloseWrite()
	var out [][]byte
	for {
		b, err := readFrame(s, MaxRecordSize)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, b)
	}
}

// awaitRecord waits until tb holds a record of id, or fails the test.
func awaitRecord(t *testing.T, tb *PeerTable, id peer.ID) PeerInfo {
	t.Helper()
	var p PeerInfo
	testkit.WaitFor(t, 5*time.Second, fmt.Sprintf("a record of %s", id), func() error {
		var ok bool
		if p, ok = tb.Get(id); !ok {
			return errors.New("none in the table")
		}
		return nil
	}, tb.Changed)
	return p
}

// TestNodeDataPushIsPassedOn has a bare peer push its record to A, which is
// connected to C: A enters it and publishes it on gossip, and C accepts the
// record of a peer it never heard from, published by A.
func TestNodeDataPushIsPassedOn(t *testing.T) {
	a := startTestNode(t, testConfig(t))
	cfg := testConfig(t)
	for _, addr := range a.Addrs() {
		cfg.Bootstrap = append(cfg.Bootstrap, addr.String())
	}
	c := startTestNode(t, cfg)
	awaitRecord(t, a.Peers(), c.ID())
	awaitRecord(t, c.Peers(), a.ID())
	testkit.WaitFor(t, 5*time.Second, "A sees C on the nodedata topic", func() error {
		if ps := a.Gossip().Peers(); !slices.Contains(ps, c.ID()) {
			return fmt.Errorf("A's topic peers: %v", ps)
		}
		return nil
	})

	b := newPeerKey(t)
	rec := b.record(t, uint64(time.Now().UnixNano()))
	answer, err := pushRaw(t, bareHost(t, b), a, rec)
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	if len(answer) != 1 || string(answer[0]) != string(a.NodeData().Envelope) {
		t.Errorf("answer to a push: %d records, want A's own", len(answer))
	}
	if p, ok := a.Peers().Get(b.id); !ok || p.Source != SourceSync || !p.Gossiped {
		t.Errorf("A holds the pushed record: %t, source %s, relayed %t; want true, sync, true", ok, p.Source, p.Gossiped)
	}
	if p := awaitRecord(t, c.Peers(), b.id); p.Source != SourceGossip || string(p.Envelope) != string(rec) {
		t.Errorf("C holds B's record from %s, want gossip, the pushed envelope", p.Source)
	}
}

// TestNodeDataPushOfAnotherPeerRefused pushes a genuine record of one peer
// from another: a push is a peer's own record, so it is refused, counted
// as forged from sync, and not entered.
func TestNodeDataPushOfAnotherPeerRefused(t *testing.T) {
	a := startTestNode(t, testConfig(t))
	pusher, other := newPeerKey(t), newPeerKey(t)
	if _, err := pushRaw(t, bareHost(t, pusher), a, other.record(t, 5)); err == nil {
		t.Error("a push of another peer's record was answered")
	}
	if got := a.Peers().RejectionsBySource()[SourceSync][RejectForged]; got != 1 {
		t.Errorf("%d forged pushes counted from sync, want 1", got)
	}
	if _, ok := a.Peers().Get(other.id); ok {
		t.Error("the record of a peer pushed by another was entered")
	}
}

// TestPushEarlyWithoutIdentify pushes over a connection just made, naming
// the protocol without waiting for identify (as a joining node does to its
// bootstrap peer): a workmesh node takes the record and answers with its
// own, the pusher enters that answer, and a peer that does not speak the
// protocol fails the push at once rather than at the timeout. Each side is
// tried against a bare host, which has no gossip that could deliver the
// same record first and stand in for the push.
func TestPushEarlyWithoutIdentify(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dial := func(h host.Host, p peer.ID, addrs []ma.Multiaddr) {
		t.Helper()
		h.Peerstore().AddAddrs(p, addrs, time.Minute)
		if _, err := h.Network().DialPeer(ctx, p); err != nil {
			t.Fatal(err)
		}
	}

	// The receiving side: an early stream from a bare pusher to a node.
	a := startTestNode(t, testConfig(t))
	b := newPeerKey(t)
	pusher := bareHost(t, b)
	dial(pusher, a.ID(), a.Host().Addrs())
	s, err := newStreamEager(ctx, pusher, a.ID(), NodeDataProtocol(testNetwork))
	if err != nil {
		t.Fatal(err)
	}
	rec := b.record(t, 7)
	answer, err := pushOn(s, rec)
	if err != nil {
		t.Fatalf("early push to a workmesh node: %v", err)
	}
	if len(answer) != 1 || string(answer[0]) != string(a.NodeData().Envelope) {
		t.Errorf("answer to an early push: %d records, want the node's own", len(answer))
	}
	if p, ok := a.Peers().Get(b.id); !ok || p.Source != SourceSync || string(p.Envelope) != string(rec) {
		t.Errorf("the node holds the pushed record: %t from %s; want true from sync", ok, p.Source)
	}

	// The pushing side: a node's pushEarly to a bare peer that serves the
	// protocol by hand, taking the push and answering with its own record.
	r := newPeerKey(t)
	responder := bareHost(t, r)
	own := r.record(t, 9)
	got := make(chan []byte, 1)
	responder.SetStreamHandler(NodeDataProtocol(testNetwork), func(s network.Stream) {
		defer s.Close()
		var req nodedataRequest
		if err := readJSONFrame(s, &req, maxRequestFrame); err != nil || !req.Push {
			s.Reset()
			return
		}
		pushed, err := readFrame(s, MaxRecordSize)
		if err != nil {
			s.Reset()
			return
		}
		got <- pushed
		writeFrame(s, own)
	})
	c := startTestNode(t, testConfig(t))
	dial(c.Host(), r.id, responder.Addrs())
	if err := c.pushEarly(ctx, r.id); err != nil {
		t.Fatalf("early push from a node: %v", err)
	}
	select {
	case pushed := <-got:
		if string(pushed) != string(c.NodeData().Envelope) {
			t.Error("the early push carried another record than the node's own")
		}
	default:
		t.Error("the responder received no pushed record")
	}
	if p, ok := c.Peers().Get(r.id); !ok || p.Source != SourceSync || string(p.Envelope) != string(own) {
		t.Errorf("the pusher holds the answer: %t from %s, want true from sync", ok, p.Source)
	}

	bare := bareHost(t, newPeerKey(t))
	dial(c.Host(), bare.ID(), bare.Addrs())
	if err := c.pushEarly(ctx, bare.ID()); err == nil || ctx.Err() != nil {
		t.Errorf("early push to a peer without the protocol: %v (context: %v), want a prompt error", err, ctx.Err())
	}
}
