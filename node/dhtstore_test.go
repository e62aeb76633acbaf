package node

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	ds "github.com/ipfs/go-datastore"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	record "github.com/libp2p/go-libp2p-record"
	recpb "github.com/libp2p/go-libp2p-record/pb"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
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
	// Batches keep to the bounds too.
	b, _ := s.Batch(ctx)
	_ = b.Put(ctx, ds.NewKey("/r/99"), make([]byte, 1<<10))
	if err := b.Commit(ctx); !errors.Is(err, errDHTStoreFull) {
		t.Fatalf("a batch put beyond the bounds: %v, want it refused", err)
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
