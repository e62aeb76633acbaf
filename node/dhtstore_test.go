package node

import (
	"context"
	"encoding/base32"
	"errors"
	"fmt"
	"testing"
	"time"

	ds "github.com/ipfs/go-datastore"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	record "github.com/libp2p/go-libp2p-record"
	recpb "github.com/libp2p/go-libp2p-record/pb"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-msgio"
	mh "github.com/multiformats/go-multihash"
	"google.golang.org/protobuf/proto"

	"github.com/workmesh/workmesh/tests/testkit"
)

// The DHT's record store keeps to its bounds: a put beyond them is refused
// while the held records are young, a record replaced in place needs only
// its new room, a deleted one gives its room back, and records older than
// the records' maximum age make room for new ones.
func TestDHTStoreKeepsToItsBounds(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1700000000, 0)
	s := newDHTStore("/workmesh/self", time.Hour, 10<<10, 4)
	s.now = func() time.Time { return now }
	put := func(i, size int) error { return s.Put(ctx, ds.NewKey(fmt.Sprintf("/r/%d", i)), make([]byte, size)) }
	for i := range 4 {
		if err := put(i, 1<<10); err != nil {
			t.Fatalf("record %d of 4: %v", i, err)
		}
	}
	if err := put(4, 1<<10); !errors.Is(err, errDHTStoreFull) {
		t.Fatalf("a fifth record with room for four: %v, want it refused", err)
	}
	if err := put(0, 7<<10); err != nil {
		t.Fatalf("record 0 replaced by one of 7 KiB (10 KiB in all): %v", err)
	}
	if err := put(1, 8<<10); !errors.Is(err, errDHTStoreFull) {
		t.Fatalf("record 1 replaced by one of 8 KiB (17 KiB in all): %v, want it refused", err)
	}
	if err := s.Delete(ctx, ds.NewKey("/r/0")); err != nil {
		t.Fatal(err)
	}
	if err := put(5, 1<<10); err != nil {
		t.Fatalf("a record after one was deleted: %v", err)
	}
	now = now.Add(2 * time.Hour)
	for i := 6; i < 10; i++ {
		if err := put(i, 2<<10); err != nil {
			t.Fatalf("record %d once the others are past their age: %v", i, err)
		}
	}
	if _, err := s.Get(ctx, ds.NewKey("/r/1")); !errors.Is(err, ds.ErrNotFound) {
		t.Fatalf("a record past its age, after new ones needed its room: %v, want it gone", err)
	}
	if len(s.held) != 4 || s.bytes != 8<<10 {
		t.Fatalf("held %d records, %d bytes; want 4 and %d", len(s.held), s.bytes, 8<<10)
	}
	// The node's own record is held however full the store is.
	own, err := proto.Marshal(&recpb.Record{Key: []byte("/workmesh/self"), Value: make([]byte, 3<<10)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, ds.NewKey("/own"), own); err != nil {
		t.Fatalf("the node's own record in a full store: %v", err)
	}
	other, _ := proto.Marshal(&recpb.Record{Key: []byte("/workmesh/other"), Value: make([]byte, 3<<10)})
	if err := s.Put(ctx, ds.NewKey("/other"), other); !errors.Is(err, errDHTStoreFull) {
		t.Fatalf("another peer's record in a full store: %v, want it refused", err)
	}
	// Batches keep to the bounds too: a put beyond them is dropped, and
	// the batch's other writes are made.
	b, _ := s.Batch(ctx)
	_ = b.Put(ctx, ds.NewKey("/r/99"), make([]byte, 1<<10))
	_ = b.Delete(ctx, ds.NewKey("/r/6"))
	if err := b.Commit(ctx); err != nil {
		t.Fatalf("a batch with a put beyond the bounds: %v, want the put dropped", err)
	}
	if _, err := s.Get(ctx, ds.NewKey("/r/99")); !errors.Is(err, ds.ErrNotFound) {
		t.Fatalf("a batch put beyond the bounds was stored (%v)", err)
	}
	if _, err := s.Get(ctx, ds.NewKey("/r/6")); !errors.Is(err, ds.ErrNotFound) {
		t.Fatalf("the batch's delete was not made (%v)", err)
	}
}

// A peer that puts a valid record into a node's DHT for every key pair it
// makes up fills the node's record store up to its bounds and no further:
// the DHT's puts go through dhtStore. (The bound is lowered to 20 records
// here; the shipped ones are dhtStoreRecords and dhtStoreBytes.)
func TestDHTPutsFromOnePeerKeepToTheStoreBounds(t *testing.T) {
	victim := startTestNode(t, testConfig(t))
	s := victim.dht.store
	s.mu.Lock()
	s.maxKeys = 20 + len(s.held)
	s.mu.Unlock()
	h := strangerHost(t)
	attacker, err := dht.New(h, dht.Mode(dht.ModeServer), dht.ProtocolPrefix(protocol.ID("/workmesh/"+testNetwork)),
		dht.Validator(record.NamespacedValidator{DHTNamespace: RecordValidator{Network: testNetwork}}), dht.DisableAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { attacker.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Connect(ctx, peer.AddrInfo{ID: victim.ID(), Addrs: victim.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 5*time.Second, "the victim in the attacker's DHT routing table", func() error {
		if attacker.RoutingTable().Find(victim.ID()) == "" {
			return errors.New("not yet")
		}
		return nil
	})
	for range 40 {
		k, id := newKey(t)
		env, err := SignNodeData(sampleNodeData(id, 1), k)
		if err != nil {
			t.Fatal(err)
		}
		_ = attacker.PutValue(ctx, DHTKey(id), env) // refused once the store is full
	}
	s.mu.Lock()
	held, limit := len(s.held), s.maxKeys
	s.mu.Unlock()
	if held != limit {
		t.Fatalf("the victim holds %d records after 40 puts of made-up peers, want its bound %d", held, limit)
	}
}

// TestDHTProvidersFromOnePeerKeepToTheirBound: one peer announces itself
// as the provider of 1,000 keys it made up; the DHT's own provider store
// held every one for 48 hours (a review's run: 200,000 from one peer in
// 1.4s, 40 MB). The node holds at most dhtProviderPerPeer of one provider,
// and still takes another provider's.
func TestDHTProvidersFromOnePeerKeepToTheirBound(t *testing.T) {
	a := startTestNode(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	announce := func(n int) peer.ID {
		p := newPeerKey(t)
		// Open until the test ends (bareHost): the node reads the
		// announcements after they were sent.
		h := bareHost(t, p)
		if err := h.Connect(ctx, peer.AddrInfo{ID: a.ID(), Addrs: a.Host().Addrs()}); err != nil {
			t.Fatal(err)
		}
		s, err := h.NewStream(ctx, a.ID(), protocol.ID("/workmesh/"+testNetwork+"/kad/1.0.0"))
		if err != nil {
			t.Fatal(err)
		}
		w := msgio.NewVarintWriter(s)
		self := []*dhtpb.Message_Peer{{Id: []byte(p.id), Addrs: [][]byte{h.Addrs()[0].Bytes()}}}
		for i := range n {
			sum, _ := mh.Sum(fmt.Appendf(nil, "made-up key %s %d", p.id, i), mh.SHA2_256, -1)
			b, _ := proto.Marshal(&dhtpb.Message{Type: dhtpb.Message_ADD_PROVIDER, Key: sum, ProviderPeers: self})
			if err := w.WriteMsg(b); err != nil {
				t.Fatalf("ADD_PROVIDER %d: %v", i, err)
			}
		}
		return p.id
	}
	count := func(p peer.ID) int {
		a.dht.providers.mu.Lock()
		defer a.dht.providers.mu.Unlock()
		return a.dht.providers.owners[ds.NewKey(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString([]byte(p))).BaseNamespace()]
	}
	flood := announce(1000)
	testkit.WaitFor(t, 10*time.Second, "the flooding provider's records stored up to the bound", func() error {
		if n := count(flood); n < dhtProviderPerPeer {
			return fmt.Errorf("%d", n)
		}
		return nil
	})
	// The provider manager writes in batches of 256, and keeps fewer
	// than 256 records (some of the flood's) unwritten: of another
	// provider's 512, more than 256 are written, the flood's records
	// refused in the same batches or not.
	other := announce(512)
	testkit.WaitFor(t, 10*time.Second, "another provider's records stored up to the bound", func() error {
		if n := count(other); n != dhtProviderPerPeer {
			return fmt.Errorf("%d of %d", n, dhtProviderPerPeer)
		}
		return nil
	})
	if n := count(flood); n != dhtProviderPerPeer {
		t.Errorf("one provider holds %d records, want its bound %d", n, dhtProviderPerPeer)
	}
}
