package node

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-msgio"
	"google.golang.org/protobuf/proto"

	"github.com/workmesh/workmesh/tests/testkit"
)

// TestDHTSurvivesAnswersWithoutTheRecord: a DHT peer answers every
// request of the node with a message that holds no record and no peers.
// The DHT read the record of an answer to PUT_VALUE unchecked, so such an
// answer crashed the node's process (a nil pointer in a goroutine of the
// DHT): to the put of its own record, and to the corrections a lookup
// sends to the peers that did not answer with the best record. Now each
// is that peer's error; the node's record reaches the honest peer and a
// lookup of the honest peer's record finds it.
func TestDHTSurvivesAnswersWithoutTheRecord(t *testing.T) {
	a := startTestNode(t, testConfig(t))
	b := startTestNode(t, testConfig(t))
	connect(t, a, b)
	p := newPeerKey(t)
	h := bareHost(t, p)
	var puts atomic.Int64
	h.SetStreamHandler(protocol.ID("/workmesh/"+testNetwork+"/kad/1.0.0"), func(s network.Stream) {
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
			if req.GetType() == dhtpb.Message_PUT_VALUE {
				puts.Add(1)
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
	testkit.WaitFor(t, 10*time.Second, "the node's routing table holds the honest and the hostile peer, and the honest peer's the node", func() error {
		if !a.InRoutingTable(b.ID()) || !a.InRoutingTable(p.id) || !b.InRoutingTable(a.ID()) {
			return errors.New("not yet")
		}
		return nil
	})
	// The node's own record, put with both.
	key, value := DHTKey(a.ID()), a.records.current().Envelope
	if err := a.dht.dht.PutValue(ctx, key, value); err != nil {
		t.Fatalf("put: %v", err)
	}
	if puts.Load() == 0 || a.dht.sender.refused.Load() == 0 {
		t.Fatalf("%d puts at the hostile peer, %d answers refused: want its put tried and its answer refused", puts.Load(), a.dht.sender.refused.Load())
	}
	if got, err := b.dht.dht.GetValue(ctx, key); err != nil || string(got) != string(value) {
		t.Fatalf("the honest peer's copy of the node's record: %v, want it stored", err)
	}
	// A lookup of b's record: the hostile peer answers without it, so
	// the lookup sends it the record afterwards, in the background.
	if err := b.dht.dht.PutValue(ctx, DHTKey(b.ID()), b.records.current().Envelope); err != nil {
		t.Fatalf("the honest peer's put: %v", err)
	}
	refused := a.dht.sender.refused.Load()
	if _, err := a.Lookup(ctx, b.ID()); err != nil {
		t.Fatalf("lookup of the honest peer's record: %v", err)
	}
	testkit.WaitFor(t, 10*time.Second, "the lookup's record correction at the hostile peer refused", func() error {
		if a.dht.sender.refused.Load() == refused {
			return errors.New("not yet")
		}
		return nil
	})
}

// blockingStream is a stream whose reads wait until it is reset or its
// peer's answer (release) comes; it fails the test when used after the
// call that owned it returned.
type blockingStream struct {
	network.Stream
	t       *testing.T
	release chan struct{}
	reset   chan struct{}
	once    sync.Once
	done    atomic.Bool // the call returned
	wrote   atomic.Bool
}

func (b *blockingStream) used(what string) {
	if b.done.Load() {
		b.t.Errorf("%s on the stream after the call returned", what)
	}
}
func (b *blockingStream) Write(p []byte) (int, error) {
	b.used("Write")
	b.wrote.Store(true)
	return len(p), nil
}
func (b *blockingStream) Read([]byte) (int, error) {
	select {
	case <-b.release:
	case <-b.reset:
	}
	b.used("Read")
	return 0, errors.New("stream reset")
}
func (b *blockingStream) SetDeadline(time.Time) error { b.used("SetDeadline"); return nil }
func (b *blockingStream) Reset() error {
	b.used("Reset")
	b.once.Do(func() { close(b.reset) })
	return nil
}

// TestDHTSenderCallEndsWithItsContext: a request whose context ends as its
// answer fails resets the stream, and touches it no more once the call
// returned (the reset of the context's end ran on a goroutine of its own
// and read the stream field after the call had cleared it: a nil pointer
// that ended the process, seen by a review's race run).
func TestDHTSenderCallEndsWithItsContext(t *testing.T) {
	d := newDHTSender(nil, nil)
	p := newPeerKey(t).id
	for range 2000 {
		bs := &blockingStream{t: t, release: make(chan struct{}), reset: make(chan struct{})}
		ps := d.stream(p)
		ps.s, ps.r = bs, msgio.NewVarintReaderSize(bs, network.MessageSizeMax)
		ctx, cancel := context.WithCancel(context.Background())
		go func() { cancel(); close(bs.release) }()
		if _, err := d.SendRequest(ctx, p, dhtpb.NewMessage(dhtpb.Message_FIND_NODE, []byte("k"), 0)); err == nil {
			t.Fatal("a request whose stream failed answered")
		}
		bs.done.Store(true)
		if bs.wrote.Load() && ps.s != nil {
			t.Fatal("the failed stream is kept for the next request")
		}
		ps.s, ps.r = nil, nil
	}
}
