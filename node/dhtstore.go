package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	ds "github.com/ipfs/go-datastore"
	dssync "github.com/ipfs/go-datastore/sync"
	"google.golang.org/protobuf/encoding/protowire"
)

// Bounds of the records the DHT stores for other peers (dhtStore).
const (
	// dhtStoreBytes bounds the bytes of the records held; dhtStoreRecords
	// their number. A record is stored at the DHT_K (20) peers closest to
	// its key, so a node of an honest network holds about 20 records
	// whatever the network's size; the bounds are many times that.
	dhtStoreBytes   = 8 << 20
	dhtStoreRecords = 4096
)

// Bounds of the provider records the DHT stores for other peers
// (newProviderStore). A provider record is stored at the 20 peers closest
// to its key: in an honest network a node holds about 20 for each work
// type, and a provider announces at most its work types.
const (
	dhtProviderRecords   = 16384
	dhtProviderPerPeer   = 2 * maxWorkTypes
	dhtProviderValueSize = 16 // a provider record's value: its time
)

// newProviderStore returns the DHT's provider store: bounded in records,
// and in records of one provider (a provider record's key ends in its
// provider).
func newProviderStore() *dhtStore {
	s := newDHTStore("", providerValidity, dhtProviderRecords*dhtProviderValueSize, dhtProviderRecords)
	s.owner = func(k ds.Key) string { return k.BaseNamespace() }
	s.maxPerOwner = dhtProviderPerPeer
	return s
}

// errDHTStoreFull refuses a DHT put that the bounds of the store leave no
// room for.
var errDHTStoreFull = errors.New("dht record store full")

// dhtStore is the DHT's value store: an in-memory map, as the DHT's own
// default, bounded in bytes and records. Any peer may put a valid record
// for every key pair it makes up, and each would otherwise be held for the
// records' maximum age; when the store is full, records older than that
// make room, and a put that still finds no room is refused (the record's
// peer is reached by gossip and syncs all the same).
type dhtStore struct {
	ds.Batching
	// own is the DHT key of the node's own record: the DHT stores it here
	// before it sends it to others, so it is held whatever the bounds (a
	// peer filling the store must not keep the node out of the DHT).
	own      string
	maxAge   time.Duration
	maxBytes int
	maxKeys  int
	now      func() time.Time

	// owner, when set, names who a key's record belongs to (a provider
	// record's provider), and maxPerOwner bounds the records of one owner.
	owner       func(ds.Key) string
	maxPerOwner int

	mu     sync.Mutex
	held   map[ds.Key]heldRecord
	bytes  int
	owners map[string]int
	// dropAt is when the first held record passes its age: before then a
	// full store has nothing to drop, and a put is refused without a scan.
	dropAt time.Time
}

type heldRecord struct {
	size int
	at   time.Time
}

func newDHTStore(own string, maxAge time.Duration, maxBytes, maxKeys int) *dhtStore {
	return &dhtStore{
		Batching: dssync.MutexWrap(ds.NewMapDatastore()),
		own:      own, maxAge: maxAge, maxBytes: maxBytes, maxKeys: maxKeys, now: time.Now,
		held: make(map[ds.Key]heldRecord), owners: make(map[string]int),
	}
}

// Put stores value under key when the bounds leave room for it, counting a
// replaced value's room as free.
func (s *dhtStore) Put(ctx context.Context, key ds.Key, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.held[key]
	owner := ""
	if s.owner != nil {
		owner = s.owner(key)
		if !had && s.owners[owner] >= s.maxPerOwner {
			return fmt.Errorf("%w: %d records of %s (at most %d)", errDHTStoreFull, s.owners[owner], owner, s.maxPerOwner)
		}
	}
	fits := func() bool {
		keys := len(s.held)
		if !had {
			keys++
		}
		return keys <= s.maxKeys && s.bytes-old.size+len(value) <= s.maxBytes
	}
	if !fits() && !s.isOwn(value) {
		s.dropOldLocked(ctx, key)
		if !fits() {
			return fmt.Errorf("%w: %d records, %d bytes (at most %d and %d)", errDHTStoreFull, len(s.held), s.bytes, s.maxKeys, s.maxBytes)
		}
	}
	if err := s.Batching.Put(ctx, key, value); err != nil {
		return err
	}
	s.bytes += len(value) - old.size
	s.held[key] = heldRecord{size: len(value), at: s.now()}
	if s.owner != nil && !had {
		s.owners[owner]++
	}
	return nil
}

// forgetLocked takes a deleted key's record out of the counts.
func (s *dhtStore) forgetLocked(k ds.Key, h heldRecord) {
	s.bytes -= h.size
	delete(s.held, k)
	if s.owner != nil {
		o := s.owner(k)
		if s.owners[o]--; s.owners[o] <= 0 {
			delete(s.owners, o)
		}
	}
}

// isOwn reports whether value, a stored DHT record (its protobuf: the
// record's key is field 1), is the node's own record.
func (s *dhtStore) isOwn(value []byte) bool {
	for len(value) > 0 {
		num, typ, n := protowire.ConsumeTag(value)
		if n < 0 {
			return false
		}
		value = value[n:]
		if num == 1 && typ == protowire.BytesType {
			k, n := protowire.ConsumeBytes(value)
			return n >= 0 && s.own != "" && string(k) == s.own
		}
		if n = protowire.ConsumeFieldValue(num, typ, value); n < 0 {
			return false
		}
		value = value[n:]
	}
	return false
}

// dropOldLocked deletes the records, but keep's, stored longer ago than
// the records' maximum age: expired, they only take room. It scans only
// once the first held record can have passed its age (dropAt): a peer
// putting into a full store costs no scan of it per put.
func (s *dhtStore) dropOldLocked(ctx context.Context, keep ds.Key) {
	now := s.now()
	if now.Before(s.dropAt) {
		return
	}
	first := now
	for k, h := range s.held {
		if k != keep && now.Sub(h.at) > s.maxAge {
			if s.Batching.Delete(ctx, k) == nil {
				s.forgetLocked(k, h)
				continue
			}
		}
		if h.at.Before(first) {
			first = h.at
		}
	}
	s.dropAt = first.Add(s.maxAge)
}

// Delete removes key and gives its room back.
func (s *dhtStore) Delete(ctx context.Context, key ds.Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.Batching.Delete(ctx, key); err != nil {
		return err
	}
	if h, ok := s.held[key]; ok {
		s.forgetLocked(key, h)
	}
	return nil
}

// Batch applies a batch's puts and deletes through Put and Delete, so that
// they keep to the bounds too. A put the bounds refuse is dropped, not the
// batch's error: the DHT's provider manager writes records in batches and
// keeps a failed batch to write again, so one provider over its bound
// would hold back (and at last drop) the records of every other provider
// in the batch.
func (s *dhtStore) Batch(context.Context) (ds.Batch, error) {
	return &boundedBatch{s: s}, nil
}

type boundedBatch struct {
	s   *dhtStore
	ops []batchOp
}

type batchOp struct {
	key    ds.Key
	value  []byte
	delete bool
}

func (b *boundedBatch) Put(_ context.Context, key ds.Key, value []byte) error {
	b.ops = append(b.ops, batchOp{key: key, value: value})
	return nil
}

func (b *boundedBatch) Delete(_ context.Context, key ds.Key) error {
	b.ops = append(b.ops, batchOp{key: key, delete: true})
	return nil
}

func (b *boundedBatch) Commit(ctx context.Context) error {
	for _, op := range b.ops {
		var err error
		if op.delete {
			err = b.s.Delete(ctx, op.key)
		} else {
			err = b.s.Put(ctx, op.key, op.value)
		}
		if err != nil && !errors.Is(err, errDHTStoreFull) {
			return err
		}
	}
	b.ops = nil
	return nil
}
