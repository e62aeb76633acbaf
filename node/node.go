package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/sirupsen/logrus"
	"golang.org/x/time/rate"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/httpapi"
	"github.com/workmesh/workmesh/pubsub"
	"github.com/workmesh/workmesh/selection"
)

// LocalState supplies the parts of this node's NodeData that change while it
// runs. The dispatcher implements it; node only reads it when it signs a new
// record or answers a health ping, so every method must be cheap and safe for
// concurrent use.
type LocalState interface {
	// Capacity is how much work the local worker takes at most.
	Capacity() Capacity
	// Load is how much work the local worker has now.
	Load() Load
	// Heads maps work type to head, for the types that have one.
	Heads() map[string]uint64
}

// ErrHealthDropped, wrapped by a health check's error (WithHealthCheck),
// makes the node drop the ping unanswered rather than answer it as failing.
var ErrHealthDropped = errors.New("health ping dropped")

type noState struct{}

func (noState) Capacity() Capacity       { return Capacity{} }
func (noState) Load() Load               { return Load{} }
func (noState) Heads() map[string]uint64 { return nil }

var networkName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Node is a running workmesh node. It is made of parts, each with its own
// file, started by New in this order and closed by Close in reverse:
//
//   - lock (lock.go): the lock on the data dir, held while the node runs,
//     when its identity comes from there;
//   - host (host.go): the libp2p host, the node's own or a borrowed one;
//   - records (records.go): the node's signed NodeData, re-signed and
//     published on change and every announce-interval;
//   - membership (membership.go): bootstrap, connections, syncs, expiry;
//   - gossip (gossip.go): the NodeData topic, and the verification and
//     entry of every record that arrives;
//   - dht (dht.go): the node's records in the DHT and its routing table;
//   - api (api.go, httpapi): the process's one HTTP server.
//
// In a closed network (WithMembership), members.go holds the rule the
// peer table, the health and nodedata handlers and gossip apply: who is a
// member, revocations, and the timer that takes expired members out.
//
// The peer table, the health and nodedata protocols (health.go) and the
// API's views belong to Node itself.
type Node struct {
	cfg config.NodeConfig
	log *logrus.Logger
	// healthCheck judges each health ping; see WithHealthCheck.
	healthCheck func(from peer.ID) error
	// info adds fields to /v1/info; see WithInfo.
	info []infoSource

	host  *nodeHost
	guard *dialGuard
	// fetchQ holds the peers whose health answers named a record newer
	// than the one held, for fetchLoop; fetching, under fetchMu, those
	// queued or being fetched.
	fetchQ   chan peer.ID
	fetchMu  sync.Mutex
	fetching map[peer.ID]bool
	// syncBudget is each member's byte budget of nodedata answers.
	syncBudget *pubsub.PeerBuckets
	// fullSyncs allows each peer one whole-table answer per record-ttl.
	fullSyncs *pubsub.PeerBuckets
	table     *PeerTable
	records   *recordPublisher
	members   *membership
	gossip    *gossip
	dht       *dhtRecords
	api       *httpapi.Server
	// strangers counts the streams refused to non-members.
	strangers atomic.Uint64
	// parts are the started parts, in the order they started.
	parts []io.Closer

	// ctx ends when the node closes; every part runs within it.
	ctx       context.Context
	cancel    context.CancelFunc
	closeOnce sync.Once
	closeErr  error
}

// New starts a node: it locks its data dir (an error wrapping
// ErrDataDirInUse when another process holds it), loads or creates its
// identity, listens, starts the
// DHT, gossip and the HTTP API, and joins through the bootstrap peers in the
// background. It returns once the node is listening. Cancelling ctx stops
// the node's background work as Close does, but only Close frees it.
func New(ctx context.Context, cfg config.NodeConfig, opts ...Option) (*Node, error) {
	o := options{log: logrus.StandardLogger(), clock: selection.SystemClock{}, state: noState{}, version: "dev"}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if err := checkConfig(cfg); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	bootstrap, err := ParseBootstrap(cfg.Bootstrap)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	key, listen, lock, err := hostIdentity(cfg, &o)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if err := httpapi.CheckExposure(cfg.API, o.apiToken); err != nil {
		lock.Close()
		return nil, fmt.Errorf("node: %w", err)
	}
	h, err := openHost(key, &o, cfg, listen)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("node: %w", err)
	}

	ctx, cancel := context.WithCancel(ctx)
	n := &Node{cfg: cfg, log: o.log, healthCheck: o.healthCheck, info: o.info, host: h,
		api: httpapi.New(o.apiToken, o.log), parts: []io.Closer{h}, ctx: ctx, cancel: cancel,
		fetchQ: make(chan peer.ID, fetchQueue), fetching: make(map[peer.ID]bool)}
	if lock != nil {
		// Released last, once everything that uses the data dir stopped.
		n.parts = []io.Closer{lock, h}
	}
	fail := func(err error) (*Node, error) {
		n.host.claim()
		n.Close()
		return nil, fmt.Errorf("node: %w", err)
	}
	// The guard observes connections from the first one on (membership
	// dials the bootstrap peers below), including those of a borrowed host.
	n.guard = newDialGuard(cfg.NewcomerDials, cfg.NewcomerDialInterval)
	n.guard.listens = func(p peer.ID) []ma.Multiaddr { return signedAddrs(h.Peerstore(), p) }
	n.guard.trust(bootstrap)
	h.nat.guard.Store(n.guard)
	n.syncBudget = pubsub.NewPeerBuckets(syncBudgetRate, syncBudgetBurst)
	n.fullSyncs = pubsub.NewPeerBuckets(rate.Every(cfg.RecordTTL), 1)
	nf := n.guard.notifiee()
	h.Network().Notify(nf)
	n.parts = append(n.parts, closerFunc(func() error { h.Network().StopNotify(nf); return nil }))
	for _, c := range h.Network().Conns() {
		n.guard.observe(c.RemotePeer(), c.RemoteMultiaddr(), c.Stat().Direction == network.DirOutbound)
	}
	var members *Members
	if !o.authority.IsZero() {
		if members, err = NewMembers(o.authority, cfg.Network); err != nil {
			return fail(err)
		}
	}
	n.table = NewPeerTable(PeerTableConfig{Self: h.ID(), Network: cfg.Network, TTL: cfg.RecordTTL, Clock: o.clock, Logger: o.log,
		Cap: cfg.PeerTableCap, Members: members})
	n.gossip = newGossip(h.Host, n.table, n.guard, cfg.Network, cfg.RecordTTL, o.log)
	n.records = newRecordPublisher(cfg, &o, key, h.Host, n.gossip, func() { n.dht.storeRecord() })
	n.parts = append(n.parts, n.records)
	if err := n.records.resign(); err != nil {
		return fail(err)
	}
	n.watchNAT()
	h.SetStreamHandler(HealthProtocol(cfg.Network), n.handleHealth)

	n.members = newMembership(h.Host, cfg.Network, n.table, n.records, n, bootstrap, cfg.RecordTTL, o.log)
	n.members.trustNames = n.guard.trustNames
	n.parts = append(n.parts, n.members)
	if err := n.members.Start(ctx); err != nil {
		return fail(err)
	}
	if err := n.gossip.Start(ctx, n.members.onPeerJoin, o.gossipOpts, o.gossipTopics); err != nil {
		return fail(err)
	}
	n.parts = append(n.parts, n.gossip)
	// The nodedata handler may pass a pushed record on through gossip.
	h.SetStreamHandler(NodeDataProtocol(cfg.Network), n.handleNodeData)
	if n.dht, err = newDHTRecords(h.Host, cfg, bootstrap, n.table, n.records, o.log); err != nil {
		return fail(err)
	}
	n.parts = append(n.parts, n.dht)
	h.claim()
	if cfg.MDNS && h.owned {
		lan, err := startMDNS(h.Host, cfg.Network, o.log)
		if err != nil {
			return fail(fmt.Errorf("mdns: %w", err))
		}
		n.parts = append(n.parts, lan)
	}

	n.parts = append(n.parts, n.api)
	if err := n.routes(); err != nil {
		return fail(err)
	}
	if members != nil {
		if err := n.memberRoutes(); err != nil {
			return fail(err)
		}
	}
	for _, ah := range o.handlers {
		if err := n.HandleAPI(ah.pattern, ah.h); err != nil {
			return fail(err)
		}
	}
	if cfg.API != "" {
		if err := n.api.Start(cfg.API); err != nil {
			return fail(err)
		}
	}

	n.records.Start(ctx)
	var fetches sync.WaitGroup
	fetches.Go(func() { n.fetchLoop(ctx) })
	n.parts = append(n.parts, closerFunc(func() error { fetches.Wait(); return nil }))
	if members != nil {
		var wg sync.WaitGroup
		wg.Go(func() { n.memberLoop(ctx) })
		n.parts = append(n.parts, closerFunc(func() error { wg.Wait(); return nil }))
	}
	n.dht.Start(ctx)
	n.members.Join(n.dht.join)
	n.log.WithFields(logrus.Fields{"peer": h.ID().String(), "network": cfg.Network}).Info("node started")
	return n, nil
}

// closerFunc makes a function an io.Closer.
type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// checkConfig refuses a network name that cannot be part of a protocol ID
// and record timing under which peers would expire between announcements.
func checkConfig(cfg config.NodeConfig) error {
	if !networkName.MatchString(cfg.Network) {
		return fmt.Errorf("network %q: want 1 to 64 letters, digits, '.', '_' or '-'", cfg.Network)
	}
	if cfg.AnnounceInterval <= 0 || cfg.RecordTTL <= cfg.AnnounceInterval {
		return fmt.Errorf("record-ttl %s must be longer than announce-interval %s (and both positive), or peers would expire between announcements",
			cfg.RecordTTL, cfg.AnnounceInterval)
	}
	return nil
}

// ID returns the node's peer ID.
func (n *Node) ID() peer.ID { return n.host.ID() }

// Host returns the node's libp2p host, for protocols built on top of it.
func (n *Node) Host() host.Host { return n.host.Host }

// Network returns the network the node joined.
func (n *Node) Network() string { return n.cfg.Network }

// Peers returns the node's peer table.
func (n *Node) Peers() *PeerTable { return n.table }

// Gossip returns the node's NodeData gossip.
func (n *Node) Gossip() *pubsub.Announcer { return n.gossip.ann }

// Addrs returns the node's listen addresses with its /p2p/<id> suffix, as
// another node would bootstrap from them.
func (n *Node) Addrs() []ma.Multiaddr {
	p2p, err := ma.NewComponent("p2p", n.ID().String())
	if err != nil {
		return nil
	}
	var out []ma.Multiaddr
	for _, a := range n.host.Addrs() {
		out = append(out, a.Encapsulate(p2p.Multiaddr()))
	}
	return out
}

// DialAddrs returns the addresses another host can dial the node at, with
// its /p2p/<id> suffix, QUIC first: its listen addresses as the host
// resolves them (an unspecified listen address, 0.0.0.0 or ::, becomes one
// per interface), without unspecified and IPv6 link-local ones, and
// without loopback ones unless the node has no other.
func (n *Node) DialAddrs() []ma.Multiaddr {
	var out, loopback []ma.Multiaddr
	for _, a := range n.Addrs() {
		switch {
		case manet.IsIPUnspecified(a), manet.IsIP6LinkLocal(a):
		case manet.IsIPLoopback(a):
			loopback = append(loopback, a)
		default:
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		out = loopback
	}
	slices.SortStableFunc(out, func(a, b ma.Multiaddr) int {
		return cmp.Compare(quicRank(a), quicRank(b))
	})
	return out
}

// quicRank is 0 for a QUIC address, 1 for any other.
func quicRank(a ma.Multiaddr) int {
	if _, err := a.ValueForProtocol(ma.P_QUIC_V1); err == nil {
		return 0
	}
	return 1
}

// JoinCommand returns the command another host runs to join the network
// through this node: `workmesh node start` with the node's network when it
// is not the default, and its DialAddrs as one comma-separated --bootstrap
// list. It is "" when the node has no address to dial.
func (n *Node) JoinCommand() string {
	addrs := n.DialAddrs()
	if len(addrs) == 0 {
		return ""
	}
	line := "workmesh node start"
	if n.cfg.Network != config.Defaults().Node.Network {
		line += " --network " + n.cfg.Network
	}
	list := make([]string, len(addrs))
	for i, a := range addrs {
		list[i] = a.String()
	}
	return line + " --bootstrap " + strings.Join(list, ",")
}

// APIAddr returns the address the HTTP API listens on, or "" when it is off.
func (n *Node) APIAddr() string { return n.api.Addr() }

// NodeData returns the node's current signed record.
func (n *Node) NodeData() SignedNodeData { return *n.current() }

func (n *Node) current() *SignedNodeData { return n.records.current() }

// Announce re-signs the node's record with its current load and heads and
// publishes it. Calls are coalesced and spaced at least 100ms apart.
func (n *Node) Announce() { n.records.announce() }

// SetWorkTypes changes the work types the node advertises and announces the
// change at once. The types the record already advertises, in the same
// order, change nothing and publish nothing.
func (n *Node) SetWorkTypes(types []string) error {
	changed, err := n.records.setWorkTypes(n.ctx, types)
	if err != nil {
		return fmt.Errorf("set work types: %w", err)
	}
	if changed {
		n.dht.workTypesChanged()
	}
	return nil
}

// Close stops the node: the API, the DHT, gossip, every background goroutine
// and the host when the node made it (a host given with WithHost is left
// open, without the node's protocol handlers). It is safe to call more than
// once.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.cancel()
		var errs []error
		for i := len(n.parts) - 1; i >= 0; i-- {
			errs = append(errs, n.parts[i].Close())
		}
		n.closeErr = errors.Join(errs...)
		if n.closeErr != nil {
			n.closeErr = fmt.Errorf("node close: %w", n.closeErr)
		}
	})
	return n.closeErr
}
