package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
)

// announceMinGap spaces out re-signed records asked for with Announce (a
// new head, new addresses): a node whose chain has a new head every 100ms
// gossips it at most once a second. Load is never announced: it travels in
// the answers to work and to health pings.
const announceMinGap = time.Second

// recordPublisher is the node's own record: it signs a new NodeData
// whenever what the node advertises changes, and publishes it on gossip,
// on request (Announce: heads, addresses) and every announce-interval (a
// long refresh: each periodic publication reaches every node of the
// network, so it costs n records at each of n nodes). The load in a record
// is a snapshot from when it was signed; load changes alone publish
// nothing.
type recordPublisher struct {
	log     *logrus.Logger
	key     crypto.PrivKey
	host    host.Host
	state   LocalState
	version string
	network string
	labels  []string
	// cert is the node's membership certificate, carried in its record
	// (nil in an open network).
	cert     []byte
	start    time.Time
	interval time.Duration
	// gossip carries the records; its announcer runs once the node's
	// gossip has started.
	gossip *gossip
	// onInterval runs after each periodic publication: the DHT copy is
	// refreshed then.
	onInterval func()
	kick       chan struct{} // re-sign and publish now

	mu           sync.Mutex // guards workTypes, seq and re-signing
	workTypes    []string
	seq          uint64
	cur          atomic.Pointer[SignedNodeData]
	sent         atomic.Pointer[SignedNodeData] // the record last published on gossip
	publications atomic.Uint64                  // publications on gossip (RecordsPublished)
	reach        atomic.Int32                   // topic peers the current record was published to

	wg sync.WaitGroup
}

func newRecordPublisher(cfg config.NodeConfig, o *options, key crypto.PrivKey, h host.Host, g *gossip, onInterval func()) *recordPublisher {
	return &recordPublisher{
		log:        o.log,
		key:        key,
		host:       h,
		state:      o.state,
		version:    o.version,
		network:    cfg.Network,
		labels:     cfg.Labels,
		cert:       certBytes(o.cert),
		start:      time.Now(),
		interval:   cfg.AnnounceInterval,
		gossip:     g,
		onInterval: onInterval,
		kick:       make(chan struct{}, 1),
		workTypes:  slices.Clone(cfg.WorkTypes),
	}
}

// Start runs the announcement loop until ctx ends.
func (r *recordPublisher) Start(ctx context.Context) {
	r.wg.Add(1)
	go r.announceLoop(ctx)
}

// Close waits for the announcement loop, which ends with the context given
// to Start.
func (r *recordPublisher) Close() error {
	r.wg.Wait()
	return nil
}

func (r *recordPublisher) current() *SignedNodeData { return r.cur.Load() }

// announce asks the loop to re-sign and publish now.
func (r *recordPublisher) announce() { signal(r.kick) }

// announceAddrs asks the loop to re-sign and publish when the host's
// addresses are no longer the ones the record advertises: the host reports
// address updates that change nothing advertised (at start, and whenever
// its observed addresses are re-confirmed), and each re-signed record
// reaches every node of the network.
func (r *recordPublisher) announceAddrs() {
	if cur := r.current(); cur == nil || !slices.Equal(r.addrs(), cur.Data.Addrs) {
		r.announce()
	}
}

// addrs returns the host's addresses as a record advertises them.
func (r *recordPublisher) addrs() []string {
	var addrs []string
	for _, a := range r.host.Addrs() {
		addrs = append(addrs, a.String())
	}
	if len(addrs) > maxAddrs {
		addrs = addrs[:maxAddrs]
	}
	return addrs
}

// setWorkTypes re-signs the record with types and publishes it; it
// reports false, and publishes nothing, when the record already advertises
// exactly types.
func (r *recordPublisher) setWorkTypes(ctx context.Context, types []string) (bool, error) {
	r.mu.Lock()
	old := r.workTypes
	if slices.Equal(old, types) {
		r.mu.Unlock()
		return false, nil
	}
	r.workTypes = slices.Clone(types)
	if err := r.resignLocked(); err != nil {
		r.workTypes = old
		r.mu.Unlock()
		return false, err
	}
	r.mu.Unlock()
	r.publish(ctx)
	return true, nil
}

// advertised returns the work types the record advertises.
func (r *recordPublisher) advertised() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.workTypes)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// resign builds and signs a new record with a higher sequence.
func (r *recordPublisher) resign() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resignLocked()
}

func (r *recordPublisher) resignLocked() error {
	seq := uint64(time.Now().UnixNano())
	if seq <= r.seq {
		seq = r.seq + 1
	}
	heads := r.state.Heads()
	wts := make([]WorkType, 0, len(r.workTypes))
	for _, name := range r.workTypes {
		wt := WorkType{Name: name}
		if h, ok := heads[name]; ok {
			wt.Head = &h
		}
		wts = append(wts, wt)
	}
	nd := NodeData{
		PeerID:    r.host.ID(),
		Addrs:     r.addrs(),
		Version:   r.version,
		Network:   r.network,
		WorkTypes: wts,
		Labels:    slices.Clone(r.labels),
		Capacity:  r.state.Capacity(),
		Load:      r.state.Load(),
		StartTime: r.start.UTC(),
		Sequence:  seq,
		Cert:      r.cert,
	}
	if err := nd.check(); err != nil {
		return fmt.Errorf("own nodedata: %w", err)
	}
	env, err := SignNodeData(nd, r.key)
	if err != nil {
		return err
	}
	r.seq = seq
	r.cur.Store(&SignedNodeData{Data: nd, Envelope: env})
	r.reach.Store(0)
	return nil
}

// published reports whether the current record has been published on
// gossip.
func (r *recordPublisher) published() bool { return r.sent.Load() == r.current() }

// RecordsPublished returns how many times the node has published its own
// record on gossip: each publication reaches every node of the network.
func (n *Node) RecordsPublished() uint64 { return n.records.publications.Load() }

// publish gossips the current record. A record already published is
// re-signed first: gossip message IDs are the hash of the bytes, so the
// same bytes again would be dropped as a duplicate, here and at every peer
// that saw them, and never reach the peers the publication is for.
func (r *recordPublisher) publish(ctx context.Context) {
	cur := r.current()
	if r.sent.Load() == cur {
		if err := r.resign(); err != nil {
			r.log.Errorf("announce: %v", err)
			return
		}
		cur = r.current()
	}
	r.sent.Store(cur)
	r.publications.Add(1)
	peers := int32(len(r.gossip.ann.Peers()))
	for {
		n := r.reach.Load()
		if peers <= n || r.reach.CompareAndSwap(n, peers) {
			break
		}
	}
	if err := r.gossip.ann.Publish(ctx, cur.Envelope); err != nil && ctx.Err() == nil {
		r.log.Debugf("announce: %v", err)
	}
}

func (r *recordPublisher) announceLoop(ctx context.Context) {
	defer r.wg.Done()
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		periodic := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			periodic = true
		case <-r.kick:
		}
		if err := r.resign(); err != nil {
			r.log.Errorf("announce: %v", err)
			continue
		}
		r.publish(ctx)
		if periodic {
			// The DHT copy is refreshed every announce-interval; a
			// head or address change (announced up to once a second)
			// goes by gossip only: storing each in the DHT cost a lookup and
			// up to 20 stores, each checking the signature. Work type
			// changes are put at once (SetWorkTypes).
			r.onInterval()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(announceMinGap, r.interval)):
		}
	}
}
