package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ipfs/go-cid"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p-kad-dht/records"
	record "github.com/libp2p/go-libp2p-record"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	mh "github.com/multiformats/go-multihash"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
)

// Timing of the DHT's upkeep.
const (
	// providerValidity is how long a provider record is held: three
	// reprovides.
	providerValidity = 3 * reprovideInterval
	// reprovideInterval re-announces the provider records of work types.
	reprovideInterval = time.Hour
	// refreshInterval spaces the routing-table refreshes after the first
	// (the DHT's own default period).
	refreshInterval = 10 * time.Minute
)

// dhtRecords is the node's part of the Kademlia DHT: it keeps the node's
// record and a provider record per work type stored, and its routing table
// joined and refreshed. It runs apart from gossip so that a slow DHT query
// never delays an announcement.
type dhtRecords struct {
	log        *logrus.Logger
	dht        *dht.IpfsDHT
	store      *dhtStore  // the records the DHT holds for others
	sender     *dhtSender // the DHT's requests and the checks of their answers
	providers  *dhtStore  // the provider records the DHT holds for others
	self       peer.ID
	network    string
	putTimeout time.Duration
	rec        *recordPublisher

	put     chan struct{} // put the current record in the DHT
	provide chan struct{} // (re)provide work types
	joinNow chan struct{} // join the routing table (after bootstrap)
	wg      sync.WaitGroup
}

// newDHTRecords starts the DHT on h in server mode, with the workmesh
// record validator as its only namespace; refused records are counted in
// table.
func newDHTRecords(h host.Host, cfg config.NodeConfig, bootstrap []peer.AddrInfo, table *PeerTable, rec *recordPublisher, log *logrus.Logger) (*dhtRecords, error) {
	maxAge := max(4*cfg.RecordTTL, time.Minute)
	store := newDHTStore(DHTKey(h.ID()), maxAge, dhtStoreBytes, dhtStoreRecords)
	// Only workmesh records live in this DHT: setting the validator drops
	// the default pk and ipns namespaces.
	validator := record.NamespacedValidator{DHTNamespace: RecordValidator{
		Network:  cfg.Network,
		OnReject: func(r RejectReason, err error) { table.RejectVia(SourceDHT, r, "", err) },
	}}
	prefix := protocol.ID("/workmesh/" + cfg.Network)
	providers := newProviderStore()
	var sender *dhtSender
	d, err := dht.New(h,
		dht.WithCustomMessageSender(func(h host.Host, protos []protocol.ID) dhtpb.MessageSenderWithDisconnect {
			sender = newDHTSender(h, protos)
			return sender
		}),
		dht.Mode(dht.ModeServer),
		dht.ProtocolPrefix(prefix),
		dht.Validator(validator),
		dht.MaxRecordAge(maxAge),
		// The addresses a DHT answer carries are dialed by the host and
		// judged by its dial guard; a name would be resolved before that.
		dht.AddressFilter(ipAddrsOnly),
		dht.ValueDatastore(store),
		// Provider records go to a store of their own, bounded in all and
		// per provider: any peer may announce itself as the provider of
		// every key it makes up, and the DHT's own store held each for
		// 48 hours without bound. They last three reprovides here.
		dht.ProviderDatastore(providers),
		dht.ProviderManagerOpts(records.ProvideValidity(providerValidity)),
		dht.BootstrapPeers(bootstrap...),
		// The node refreshes its routing table itself (loop), a moment
		// after joining: the refresh dials every peer it finds at once,
		// and on a busy machine that would hold up the first NodeData
		// announcement, which is what makes the node known.
		dht.DisableAutoRefresh(),
	)
	if err != nil {
		return nil, fmt.Errorf("dht: %w", err)
	}
	return &dhtRecords{
		log:        log,
		dht:        d,
		store:      store,
		sender:     sender,
		providers:  providers,
		self:       h.ID(),
		network:    cfg.Network,
		putTimeout: min(cfg.AnnounceInterval, time.Minute),
		rec:        rec,
		put:        make(chan struct{}, 1),
		provide:    make(chan struct{}, 1),
		joinNow:    make(chan struct{}, 1),
	}, nil
}

// Start runs the DHT upkeep until ctx ends.
func (d *dhtRecords) Start(ctx context.Context) {
	d.wg.Add(1)
	go d.loop(ctx)
}

// Close waits for the upkeep, which ends with the context given to Start,
// and closes the DHT.
func (d *dhtRecords) Close() error {
	d.wg.Wait()
	if err := d.dht.Close(); err != nil {
		return fmt.Errorf("dht: %w", err)
	}
	return nil
}

// storeRecord has the current record put in the DHT.
func (d *dhtRecords) storeRecord() { signal(d.put) }

// workTypesChanged has the current record put and the work types provided.
func (d *dhtRecords) workTypesChanged() {
	signal(d.put)
	signal(d.provide)
}

// join has the DHT fill its routing table, once a bootstrap peer answered.
func (d *dhtRecords) join() { signal(d.joinNow) }

func (d *dhtRecords) loop(ctx context.Context) {
	defer d.wg.Done()
	reprovide := time.NewTicker(reprovideInterval)
	defer reprovide.Stop()
	refresh := time.NewTicker(refreshInterval)
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.put:
			d.putRecord(ctx)
		case <-d.provide:
			d.provideWorkTypes(ctx)
		case <-reprovide.C:
			d.provideWorkTypes(ctx)
		case <-d.joinNow:
			d.joinRoutingTable(ctx)
		case <-refresh.C:
			d.refreshRoutingTable(ctx)
		}
	}
}

// joinRoutingTable is a joining node's first fill of its DHT routing
// table: a lookup of its own ID, Kademlia's join, which finds the peers
// closest to it and makes it known to them. The farther buckets fill from
// the connections gossip, syncs and polls make, and from the periodic
// refresh; a full refresh here (a lookup per bucket) made every newcomer
// query most of the network, and a 200-node network forming spent more of
// its CPU on those lookups than on anything else of its own. Then it stores
// the node's records.
func (d *dhtRecords) joinRoutingTable(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	_, err := d.dht.GetClosestPeers(lctx, string(d.self))
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		d.log.Debugf("dht: join lookup: %v", err)
	}
	d.putRecord(ctx)
	d.provideWorkTypes(ctx)
}

// refreshRoutingTable fills the DHT routing table, then stores the node's
// records in it.
func (d *dhtRecords) refreshRoutingTable(ctx context.Context) {
	select {
	case err := <-d.dht.RefreshRoutingTable():
		if err != nil && ctx.Err() == nil {
			d.log.Debugf("dht: refresh routing table: %v", err)
		}
	case <-ctx.Done():
		return
	}
	d.putRecord(ctx)
	d.provideWorkTypes(ctx)
}

func (d *dhtRecords) putRecord(ctx context.Context) {
	if d.dht.RoutingTable().Size() == 0 {
		return // nobody to store it with yet; the next announcement will
	}
	pctx, cancel := context.WithTimeout(ctx, d.putTimeout)
	defer cancel()
	if err := d.dht.PutValue(pctx, DHTKey(d.self), d.rec.current().Envelope); err != nil && ctx.Err() == nil {
		d.log.Debugf("dht: put nodedata: %v", err)
	}
}

func (d *dhtRecords) provideWorkTypes(ctx context.Context) {
	if d.dht.RoutingTable().Size() == 0 {
		return
	}
	for _, wt := range d.rec.advertised() {
		c, err := WorkTypeCID(d.network, wt)
		if err != nil {
			d.log.Errorf("dht: provide %s: %v", wt, err)
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		err = d.dht.Provide(pctx, c, true)
		cancel()
		if err != nil && ctx.Err() == nil {
			d.log.Debugf("dht: provide %s: %v", wt, err)
		}
	}
}

// ipAddrsOnly keeps the addresses that start with an IP (a relayed one
// through a relay at an IP included): a DHT answer is another peer's word,
// and a name in it would have the host ask a resolver before any dial
// guard saw it.
func ipAddrsOnly(addrs []ma.Multiaddr) []ma.Multiaddr {
	out := make([]ma.Multiaddr, 0, len(addrs))
	for _, a := range addrs {
		if _, ok := addrIP(a); ok {
			out = append(out, a)
		}
	}
	return out
}

// WorkTypeCID returns the DHT key under which the providers of a work type in
// a network are announced.
func WorkTypeCID(network, workType string) (cid.Cid, error) {
	sum, err := mh.Sum([]byte("/workmesh/"+network+"/work-type/"+workType), mh.SHA2_256, -1)
	if err != nil {
		return cid.Undef, err
	}
	return cid.NewCidV1(cid.Raw, sum), nil
}

// InRoutingTable reports whether p is in the node's DHT routing table.
func (n *Node) InRoutingTable(p peer.ID) bool {
	return n.dht.dht.RoutingTable().Find(p) != ""
}

// Lookup reads a peer's record from the DHT, verifies it like any other,
// enters it in the peer table when it is newer than the one held, and
// returns it.
func (n *Node) Lookup(ctx context.Context, id peer.ID) (NodeData, error) {
	val, err := n.dht.dht.GetValue(ctx, DHTKey(id))
	if err != nil {
		return NodeData{}, fmt.Errorf("dht lookup %s: %w", id, err)
	}
	sd, err := OpenNodeData(val, n.cfg.Network)
	if err != nil {
		n.table.RejectVia(SourceDHT, ReasonOf(err), "", err)
		return NodeData{}, fmt.Errorf("dht lookup %s: %w", id, err)
	}
	if sd.Data.PeerID != id {
		return NodeData{}, fmt.Errorf("dht lookup %s: got the record of %s", id, sd.Data.PeerID)
	}
	if _, err := n.gossip.enter(sd, "", SourceDHT); err != nil && ReasonOf(err) != RejectReplay {
		return NodeData{}, fmt.Errorf("dht lookup %s: %w", id, err)
	}
	return sd.Data, nil
}

// FindWorkers asks the DHT for the providers of a work type, so that a node
// can find workers of a type it has not seen announced yet, and returns the
// record of each (from the peer table when it is fresh there, else read from
// the DHT). Providers whose record cannot be read are left out.
func (n *Node) FindWorkers(ctx context.Context, workType string) ([]NodeData, error) {
	c, err := WorkTypeCID(n.cfg.Network, workType)
	if err != nil {
		return nil, fmt.Errorf("find workers %s: %w", workType, err)
	}
	var out []NodeData
	for ai := range n.dht.dht.FindProvidersAsync(ctx, c, 100) {
		if ai.ID == n.ID() {
			continue
		}
		if p, ok := n.table.Get(ai.ID); ok {
			out = append(out, p.Data)
			continue
		}
		nd, err := n.Lookup(ctx, ai.ID)
		if err != nil {
			n.log.Debugf("find workers %s: %v", workType, err)
			continue
		}
		out = append(out, nd)
	}
	if err := ctx.Err(); err != nil && len(out) == 0 {
		return nil, fmt.Errorf("find workers %s: %w", workType, err)
	}
	return out, nil
}
