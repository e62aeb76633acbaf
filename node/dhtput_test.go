package node

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	record "github.com/libp2p/go-libp2p-record"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-msgio"
	ma "github.com/multiformats/go-multiaddr"
	"google.golang.org/protobuf/proto"

	"github.com/workmesh/workmesh/tests/testkit"
)

// TestDHTPutSurvivesAnAnswerWithoutTheRecord: a DHT peer answers the
// node's PUT_VALUE with a message that holds no record. The DHT's own
// PutValue read the answer's record unchecked, and such an answer
// crashed the node's process (a nil pointer in a goroutine of the DHT);
// now it is that peer's failed put, and the honest peer stores the record.
func TestDHTPutSurvivesAnAnswerWithoutTheRecord(t *testing.T) {
	a := startTestNode(t, testConfig(t))
	b := startTestNode(t, testConfig(t))
	connect(t, a, b)
	p := newPeerKey(t)
	h, err := newHost(p.key, testNetwork, "test", []ma.Multiaddr{ma.StringCast("/ip4/127.0.0.1/udp/0/quic-v1")}, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	h.SetStreamHandler(a.dht.protocol, func(s network.Stream) {
		defer s.Close()
		r := msgio.NewVarintReaderSize(s, network.MessageSizeMax)
		w := msgio.NewVarintWriter(s)
		for {
			m, err := r.ReadMsg()
			if err != nil {
				return
			}
			var req dhtpb.Message
			if err := proto.Unmarshal(m, &req); err != nil {
				return
			}
			// The answer's type and key, no record and no peers.
			out, _ := proto.Marshal(&dhtpb.Message{Type: req.Type, Key: req.Key})
			if err := w.WriteMsg(out); err != nil {
				return
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.Connect(ctx, peer.AddrInfo{ID: a.ID(), Addrs: a.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the node's routing table holds the honest and the hostile peer", func() error {
		if !a.InRoutingTable(b.ID()) || !a.InRoutingTable(p.id) {
			return errors.New("not yet")
		}
		return nil
	})
	key, value := DHTKey(a.ID()), a.records.current().Envelope
	err = a.dht.putAt(ctx, p.id, record.MakePutRecord(key, value))
	if err == nil || !strings.Contains(err.Error(), "does not hold the record sent") {
		t.Fatalf("put at the peer answering without the record: %v, want the answer refused", err)
	}
	if err := a.dht.putValue(ctx, key, value); err != nil {
		t.Fatalf("put: %v", err)
	}
	rec, err := b.dht.local.Get(ctx, key)
	if err != nil || rec == nil || string(rec.GetValue()) != string(value) {
		t.Fatalf("the honest peer holds %v (%v), want the node's record", rec, err)
	}
}
