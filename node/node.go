package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipfs/go-cid"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	lpubsub "github.com/libp2p/go-libp2p-pubsub"
	record "github.com/libp2p/go-libp2p-record"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	mh "github.com/multiformats/go-multihash"
	"github.com/sirupsen/logrus"

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

// Option configures a Node.
type Option func(*options) error

type apiHandler struct {
	pattern string
	h       http.Handler
}

type options struct {
	log        *logrus.Logger
	clock      selection.Clock
	state      LocalState
	version    string
	key        crypto.PrivKey
	handlers   []apiHandler
	gossipOpts []lpubsub.Option
	// healthCheck, when set, judges each health ping; see WithHealthCheck.
	healthCheck func(from peer.ID) error
	// apiToken is the bearer token the local API requires; empty means none.
	apiToken string
	// info adds fields to /v1/info; see WithInfo.
	info []infoSource
	// host, when set, is the libp2p host the node runs on instead of one
	// of its own; see WithHost.
	host host.Host
}

// WithLogger sets the logger; the default is the standard logrus logger.
func WithLogger(log *logrus.Logger) Option {
	return func(o *options) error {
		if log == nil {
			return errors.New("node: nil logger")
		}
		o.log = log
		return nil
	}
}

// WithClock sets the clock the peer table judges freshness by.
func WithClock(c selection.Clock) Option {
	return func(o *options) error {
		if c == nil {
			return errors.New("node: nil clock")
		}
		o.clock = c
		return nil
	}
}

// WithLocalState sets where capacity, load and heads come from; without it
// the node advertises zero capacity and load and no heads.
func WithLocalState(s LocalState) Option {
	return func(o *options) error {
		if s == nil {
			return errors.New("node: nil local state")
		}
		o.state = s
		return nil
	}
}

// WithHealthCheck has the node ask check, once per health ping, whether its
// worker can work now (check gets the pinging peer, and must be quick). A
// non-nil error is answered to the ping (HealthAnswer.Error: the pinging
// peer counts a failed poll), or, when it wraps ErrHealthDropped, the ping
// is reset unanswered, as a grey peer's would be.
func WithHealthCheck(check func(from peer.ID) error) Option {
	return func(o *options) error {
		if check == nil {
			return errors.New("node: nil health check")
		}
		o.healthCheck = check
		return nil
	}
}

// WithAPIToken makes the local API require this bearer token. Without one
// the API may only listen on loopback: New refuses anything else.
func WithAPIToken(token string) Option {
	return func(o *options) error { o.apiToken = token; return nil }
}

// infoSource is a field WithInfo adds to GET /v1/info.
type infoSource struct {
	key  string
	view func() any
}

// WithInfo adds a field to GET /v1/info: under key, what f returns at the
// time of the request (left out when nil), so that a part of the process
// the node does not know, such as fault injection, shows its state next to
// the node's own. Fields come after the node's own, in the order added; key
// must not be one of the node's own keys or one added before.
func WithInfo(key string, f func() any) Option {
	return func(o *options) error {
		if key == "" || f == nil {
			return errors.New("node: info field needs a key and a function")
		}
		if slices.Contains(infoKeys, key) || slices.ContainsFunc(o.info, func(s infoSource) bool { return s.key == key }) {
			return fmt.Errorf("node: info field %q: the key is taken", key)
		}
		o.info = append(o.info, infoSource{key, f})
		return nil
	}
}

// WithVersion sets the version the node advertises (default "dev").
func WithVersion(v string) Option {
	return func(o *options) error {
		if v == "" || len(v) > maxNameLen {
			return fmt.Errorf("node: version %q: want 1 to %d bytes", v, maxNameLen)
		}
		o.version = v
		return nil
	}
}

// WithIdentity sets the node's key instead of the one in the data dir
// (tests use it to start many nodes without touching disk).
func WithIdentity(key crypto.PrivKey) Option {
	return func(o *options) error {
		if key == nil {
			return errors.New("node: nil identity key")
		}
		o.key = key
		return nil
	}
}

// WithAPIHandler mounts h on the local HTTP API under pattern (http.ServeMux
// syntax), next to /v1/info and /v1/peers.
func WithAPIHandler(pattern string, h http.Handler) Option {
	return func(o *options) error {
		if pattern == "" || h == nil {
			return errors.New("node: API handler needs a pattern and a handler")
		}
		o.handlers = append(o.handlers, apiHandler{pattern, h})
		return nil
	}
}

// WithHost runs the node on h instead of a host of its own, so that a test
// can put many nodes on an in-memory network (go-libp2p's mocknet) or a
// program can share a host it built. The node signs its records with h's
// key, which must be in h's peerstore (WithIdentity, when also given, must
// be that key), advertises h's addresses and ignores cfg.Listen. The
// workmesh stream limits of the node's own host are not applied: h's
// resource manager is the caller's choice.
//
// The caller keeps ownership of h: Node.Close stops everything the node
// started on it (DHT, gossip, its protocol handlers) and leaves h open; the
// caller closes h, after the node or before it (a node on a closed host
// still closes, its streams failing at once).
func WithHost(h host.Host) Option {
	return func(o *options) error {
		if h == nil {
			return errors.New("node: nil host")
		}
		o.host = h
		return nil
	}
}

// WithGossipSubOptions passes options through to gossipsub.
func WithGossipSubOptions(opts ...lpubsub.Option) Option {
	return func(o *options) error {
		o.gossipOpts = append(o.gossipOpts, opts...)
		return nil
	}
}

// Timing of the node's background work.
const (
	// announceMinGap spaces out re-signed records asked for with Announce,
	// so that a busy dispatcher cannot turn every load change into gossip.
	announceMinGap = 100 * time.Millisecond
	// minReach is the number of topic peers a record must have been
	// published to before the node stops re-publishing it when a peer
	// joins: a node that signed its record alone, or with one peer whose
	// mesh is not formed yet, gets it spread as its first peers arrive,
	// while a node that is already known does not re-gossip on every
	// new connection.
	minReach = 3
	// fullSyncs is how many of the first peers a node asks for their whole
	// table; later peers are only asked for their own record when missing.
	fullSyncs = 2
	// selfFetchDelay is how long a node waits for a peer that joined to
	// announce itself before asking it for its record directly: the
	// announcement nearly always comes first, and the fetch would compete
	// with relaying it.
	selfFetchDelay = 250 * time.Millisecond
	// reprovideInterval re-announces the provider records of work types.
	reprovideInterval = time.Hour
	// refreshDelay is the wait between reaching a bootstrap peer and the
	// first routing-table refresh; refreshInterval spaces later refreshes
	// (the DHT's own default period).
	refreshDelay    = 500 * time.Millisecond
	refreshInterval = 10 * time.Minute
	// bootstrapTimeout bounds one dial of a bootstrap peer.
	bootstrapTimeout = 10 * time.Second
)

var networkName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Node is a running workmesh node: its libp2p host, DHT, gossip, peer table,
// health protocol and local HTTP API. New starts it; Close stops everything
// it started.
type Node struct {
	cfg     config.NodeConfig
	network string
	version string
	log     *logrus.Logger
	key     crypto.PrivKey
	state   LocalState
	// healthCheck judges each health ping; see WithHealthCheck.
	healthCheck func(from peer.ID) error
	// info adds fields to /v1/info; see WithInfo.
	info  []infoSource
	start time.Time

	host host.Host
	// ownsHost is false on a host given with WithHost: Close then leaves
	// it open and only removes the handlers in added.
	ownsHost bool
	added    []protocol.ID
	dht      *dht.IpfsDHT
	gossip   *pubsub.Announcer
	table    *PeerTable

	// api is the process's one HTTP server; it listens when cfg.API is set.
	api *httpapi.Server

	mu        sync.Mutex // guards workTypes, seq and re-signing
	workTypes []string
	seq       uint64
	cur       atomic.Pointer[SignedNodeData]
	reach     atomic.Int32 // topic peers the current record was published to
	// early carries the outcome of New's dial and push to each bootstrap
	// peer to bootstrapLoop's first round (then nil).
	early  []chan error
	synced atomic.Int32

	bootstrap []peer.AddrInfo
	kick      chan struct{} // re-sign and publish now
	dhtKick   chan struct{} // put the current record in the DHT
	refresh   chan struct{} // refresh the DHT routing table
	provide   chan struct{} // (re)provide work types
	syncQ     chan syncRequest

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// ParseBootstrap parses bootstrap multiaddrs, each of which must end in
// /p2p/<peer id>. The error names the address that does not parse.
func ParseBootstrap(addrs []string) ([]peer.AddrInfo, error) {
	var out []peer.AddrInfo
	byID := map[peer.ID]int{}
	for _, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("bootstrap address %q: %w", s, err)
		}
		ai, err := peer.AddrInfoFromP2pAddr(a)
		if err != nil {
			return nil, fmt.Errorf("bootstrap address %q: want a multiaddr ending in /p2p/<peer id>: %w", s, err)
		}
		if i, ok := byID[ai.ID]; ok {
			out[i].Addrs = append(out[i].Addrs, ai.Addrs...)
			continue
		}
		byID[ai.ID] = len(out)
		out = append(out, *ai)
	}
	return out, nil
}

// ParseListen parses listen multiaddrs.
func ParseListen(addrs []string) ([]ma.Multiaddr, error) {
	if len(addrs) == 0 {
		return nil, errors.New("no listen address")
	}
	out := make([]ma.Multiaddr, 0, len(addrs))
	for _, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("listen address %q: %w", s, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// New starts a node: it loads or creates its identity, listens, starts the
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
	if !networkName.MatchString(cfg.Network) {
		return nil, fmt.Errorf("node: network %q: want 1 to 64 letters, digits, '.', '_' or '-'", cfg.Network)
	}
	if cfg.AnnounceInterval <= 0 || cfg.RecordTTL <= cfg.AnnounceInterval {
		return nil, fmt.Errorf("node: record-ttl %s must be longer than announce-interval %s (and both positive), or peers would expire between announcements",
			cfg.RecordTTL, cfg.AnnounceInterval)
	}
	bootstrap, err := ParseBootstrap(cfg.Bootstrap)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	var listen []ma.Multiaddr
	key, h := o.key, o.host
	if h != nil {
		hk := h.Peerstore().PrivKey(h.ID())
		if hk == nil {
			return nil, fmt.Errorf("node: the given host's peerstore holds no private key for %s", h.ID())
		}
		if key != nil && !key.Equals(hk) {
			return nil, fmt.Errorf("node: the identity key is not the given host's (%s)", h.ID())
		}
		key = hk
	} else {
		if listen, err = ParseListen(cfg.Listen); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
		if key == nil {
			dir, err := DataDir(cfg.DataDir)
			if err != nil {
				return nil, fmt.Errorf("node: %w", err)
			}
			if key, err = LoadOrCreateIdentity(dir); err != nil {
				return nil, fmt.Errorf("node: %w", err)
			}
		}
	}

	if err := httpapi.CheckExposure(cfg.API, o.apiToken); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	// On a borrowed host, note the protocols it serves already, so that
	// Close removes exactly the handlers this node (with its DHT and
	// gossipsub) added.
	var hostProtocols []protocol.ID
	if h != nil {
		hostProtocols = h.Mux().Protocols()
	} else {
		var bsAddrs []ma.Multiaddr
		for _, ai := range bootstrap {
			bsAddrs = append(bsAddrs, ai.Addrs...)
		}
		if h, err = newHost(key, cfg.Network, o.version, listen, usesTCP(listen, bsAddrs)); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	n := &Node{
		cfg:         cfg,
		network:     cfg.Network,
		version:     o.version,
		log:         o.log,
		key:         key,
		state:       o.state,
		healthCheck: o.healthCheck,
		info:        o.info,
		start:       time.Now(),
		host:        h,
		ownsHost:    o.host == nil,
		api:         httpapi.New(o.apiToken, o.log),
		workTypes:   slices.Clone(cfg.WorkTypes),
		bootstrap:   bootstrap,
		kick:        make(chan struct{}, 1),
		dhtKick:     make(chan struct{}, 1),
		refresh:     make(chan struct{}, 1),
		provide:     make(chan struct{}, 1),
		syncQ:       make(chan syncRequest, 256),
		ctx:         ctx,
		cancel:      cancel,
	}
	n.table = NewPeerTable(PeerTableConfig{Self: h.ID(), Network: cfg.Network, TTL: cfg.RecordTTL, Clock: o.clock, Logger: o.log})
	fail := func(err error) (*Node, error) {
		n.claimProtocols(hostProtocols)
		n.Close()
		return nil, err
	}
	if err := n.resign(); err != nil {
		return fail(fmt.Errorf("node: %w", err))
	}

	h.SetStreamHandler(HealthProtocol(n.network), n.handleHealth)
	sub, err := h.EventBus().Subscribe(new(event.EvtPeerConnectednessChanged))
	if err != nil {
		return fail(fmt.Errorf("node: connection events: %w", err))
	}
	n.wg.Add(1)
	go n.connectednessLoop(sub)
	// Dial the bootstrap peers while the rest of the node is set up: the
	// QUIC handshake is most of a join's first milliseconds, and
	// bootstrapLoop's Connect then finds the connection made or joins the
	// dial in progress. Handlers set after the connection reach the peer
	// by identify push. It starts once connection events are watched, so
	// the peer table sees this connection too.
	// Once connected, it pushes the node's record at once, without
	// waiting for identify (pushEarly): the push is what makes the node
	// known, and identify's round trip would only delay it.
	n.early = make([]chan error, len(bootstrap))
	for i, ai := range bootstrap {
		done := make(chan error, 1)
		n.early[i] = done
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			dctx, dcancel := context.WithTimeout(ctx, bootstrapTimeout)
			defer dcancel()
			h.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.TempAddrTTL)
			_, err := h.Network().DialPeer(dctx, ai.ID)
			if err == nil {
				err = n.pushEarly(dctx, ai.ID)
			}
			done <- err // bootstrapLoop reports errors and tries again
		}()
	}

	// Records are entered by the verifier itself, the moment they are
	// known good, rather than after gossipsub's delivery queue.
	n.gossip, err = pubsub.New(ctx, h, n.network, n.verifyGossip, nil,
		pubsub.WithLogger(n.log),
		pubsub.WithPeerJoin(n.onPeerJoin),
		pubsub.WithGossipSubOptions(o.gossipOpts...))
	if err != nil {
		return fail(fmt.Errorf("node: %w", err))
	}
	// The nodedata handler may pass a pushed record on through gossip.
	h.SetStreamHandler(NodeDataProtocol(n.network), n.handleNodeData)

	n.dht, err = dht.New(h,
		dht.Mode(dht.ModeServer),
		dht.ProtocolPrefix(protocol.ID("/workmesh/"+n.network)),
		// Only workmesh records live in this DHT: setting the validator
		// drops the default pk and ipns namespaces.
		dht.Validator(record.NamespacedValidator{DHTNamespace: RecordValidator{
			Network:  n.network,
			OnReject: func(r RejectReason, err error) { n.table.RejectVia(SourceDHT, r, "", err) },
		}}),
		dht.MaxRecordAge(max(4*cfg.RecordTTL, time.Minute)),
		dht.BootstrapPeers(bootstrap...),
		// The node refreshes its routing table itself (dhtLoop), a moment
		// after joining: the refresh dials every peer it finds at once,
		// and on a busy machine that would hold up the first NodeData
		// announcement, which is what makes the node known.
		dht.DisableAutoRefresh(),
	)
	if err != nil {
		return fail(fmt.Errorf("node: dht: %w", err))
	}
	n.claimProtocols(hostProtocols)

	if err := n.routes(); err != nil {
		return fail(fmt.Errorf("node: %w", err))
	}
	for _, ah := range o.handlers {
		if err := n.HandleAPI(ah.pattern, ah.h); err != nil {
			return fail(fmt.Errorf("node: %w", err))
		}
	}
	if cfg.API != "" {
		if err := n.api.Start(cfg.API); err != nil {
			return fail(fmt.Errorf("node: %w", err))
		}
	}

	n.wg.Add(5)
	go n.announceLoop()
	go n.dhtLoop()
	go n.expireLoop()
	go n.syncLoop()
	go n.syncLoop()
	if len(bootstrap) > 0 {
		n.wg.Add(1)
		go n.bootstrapLoop()
	}
	n.log.WithFields(logrus.Fields{"peer": h.ID().String(), "network": n.network}).Info("node started")
	return n, nil
}

// ID returns the node's peer ID.
func (n *Node) ID() peer.ID { return n.host.ID() }

// Host returns the node's libp2p host, for protocols built on top of it.
func (n *Node) Host() host.Host { return n.host }

// Network returns the network the node joined.
func (n *Node) Network() string { return n.network }

// Peers returns the node's peer table.
func (n *Node) Peers() *PeerTable { return n.table }

// Gossip returns the node's NodeData gossip.
func (n *Node) Gossip() *pubsub.Announcer { return n.gossip }

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

// APIAddr returns the address the HTTP API listens on, or "" when it is off.
func (n *Node) APIAddr() string { return n.api.Addr() }

// NodeData returns the node's current signed record.
func (n *Node) NodeData() SignedNodeData { return *n.current() }

func (n *Node) current() *SignedNodeData { return n.cur.Load() }

// Announce re-signs the node's record with its current load and heads and
// publishes it. Calls are coalesced and spaced at least 100ms apart.
func (n *Node) Announce() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// SetWorkTypes changes the work types the node advertises and announces the
// change at once.
func (n *Node) SetWorkTypes(types []string) error {
	n.mu.Lock()
	old := n.workTypes
	n.workTypes = slices.Clone(types)
	if err := n.resignLocked(); err != nil {
		n.workTypes = old
		n.mu.Unlock()
		return fmt.Errorf("set work types: %w", err)
	}
	n.mu.Unlock()
	n.publish()
	signal(n.dhtKick)
	signal(n.provide)
	return nil
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// resign builds and signs a new record with a higher sequence.
func (n *Node) resign() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.resignLocked()
}

func (n *Node) resignLocked() error {
	seq := uint64(time.Now().UnixNano())
	if seq <= n.seq {
		seq = n.seq + 1
	}
	heads := n.state.Heads()
	wts := make([]WorkType, 0, len(n.workTypes))
	for _, name := range n.workTypes {
		wt := WorkType{Name: name}
		if h, ok := heads[name]; ok {
			wt.Head = &h
		}
		wts = append(wts, wt)
	}
	var addrs []string
	for _, a := range n.host.Addrs() {
		addrs = append(addrs, a.String())
	}
	if len(addrs) > maxAddrs {
		addrs = addrs[:maxAddrs]
	}
	nd := NodeData{
		PeerID:    n.host.ID(),
		Addrs:     addrs,
		Version:   n.version,
		Network:   n.network,
		WorkTypes: wts,
		Labels:    slices.Clone(n.cfg.Labels),
		Capacity:  n.state.Capacity(),
		Load:      n.state.Load(),
		StartTime: n.start.UTC(),
		Sequence:  seq,
	}
	if err := nd.check(); err != nil {
		return fmt.Errorf("own nodedata: %w", err)
	}
	env, err := SignNodeData(nd, n.key)
	if err != nil {
		return err
	}
	n.seq = seq
	n.cur.Store(&SignedNodeData{Data: nd, Envelope: env})
	n.reach.Store(0)
	return nil
}

// publish gossips the current record.
func (n *Node) publish() {
	peers := int32(len(n.gossip.Peers()))
	for {
		r := n.reach.Load()
		if peers <= r || n.reach.CompareAndSwap(r, peers) {
			break
		}
	}
	if err := n.gossip.Publish(n.ctx, n.current().Envelope); err != nil && n.ctx.Err() == nil {
		n.log.Debugf("announce: %v", err)
	}
}

func (n *Node) announceLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.AnnounceInterval)
	defer t.Stop()
	for {
		periodic := false
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			periodic = true
		case <-n.kick:
		}
		if err := n.resign(); err != nil {
			n.log.Errorf("announce: %v", err)
			continue
		}
		n.publish()
		if periodic {
			// The DHT copy is refreshed every announce-interval; a
			// load or head change (announced up to once a second) goes
			// by gossip only: storing each in the DHT cost a lookup and
			// up to 20 stores, each checking the signature. Work type
			// changes are put at once (SetWorkTypes).
			signal(n.dhtKick)
		}
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(announceMinGap):
		}
	}
}

// dhtLoop keeps the node's record and provider records in the DHT. It runs
// apart from gossip so that a slow DHT query never delays an announcement.
func (n *Node) dhtLoop() {
	defer n.wg.Done()
	reprovide := time.NewTicker(reprovideInterval)
	defer reprovide.Stop()
	refresh := time.NewTicker(refreshInterval)
	defer refresh.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.dhtKick:
			n.putRecord()
		case <-n.provide:
			n.provideWorkTypes()
		case <-reprovide.C:
			n.provideWorkTypes()
		case <-n.refresh:
			n.joinRoutingTable()
		case <-refresh.C:
			n.refreshRoutingTable()
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
func (n *Node) joinRoutingTable() {
	ctx, cancel := context.WithTimeout(n.ctx, time.Minute)
	_, err := n.dht.GetClosestPeers(ctx, string(n.ID()))
	cancel()
	if n.ctx.Err() != nil {
		return
	}
	if err != nil {
		n.log.Debugf("dht: join lookup: %v", err)
	}
	n.putRecord()
	n.provideWorkTypes()
}

// refreshRoutingTable fills the DHT routing table, then stores the node's
// records in it.
func (n *Node) refreshRoutingTable() {
	select {
	case err := <-n.dht.RefreshRoutingTable():
		if err != nil && n.ctx.Err() == nil {
			n.log.Debugf("dht: refresh routing table: %v", err)
		}
	case <-n.ctx.Done():
		return
	}
	n.putRecord()
	n.provideWorkTypes()
}

func (n *Node) putRecord() {
	if n.dht.RoutingTable().Size() == 0 {
		return // nobody to store it with yet; the next announcement will
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.AnnounceInterval)
	defer cancel()
	if err := n.dht.PutValue(ctx, DHTKey(n.ID()), n.current().Envelope); err != nil && n.ctx.Err() == nil {
		n.log.Debugf("dht: put nodedata: %v", err)
	}
}

func (n *Node) provideWorkTypes() {
	if n.dht.RoutingTable().Size() == 0 {
		return
	}
	n.mu.Lock()
	types := slices.Clone(n.workTypes)
	n.mu.Unlock()
	for _, wt := range types {
		c, err := WorkTypeCID(n.network, wt)
		if err != nil {
			n.log.Errorf("dht: provide %s: %v", wt, err)
			continue
		}
		ctx, cancel := context.WithTimeout(n.ctx, time.Minute)
		err = n.dht.Provide(ctx, c, true)
		cancel()
		if err != nil && n.ctx.Err() == nil {
			n.log.Debugf("dht: provide %s: %v", wt, err)
		}
	}
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

func (n *Node) expireLoop() {
	defer n.wg.Done()
	t := time.NewTicker(max(n.cfg.RecordTTL/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.table.Expire()
		}
	}
}

func (n *Node) connectednessLoop(sub event.Subscription) {
	defer n.wg.Done()
	defer sub.Close()
	for {
		select {
		case <-n.ctx.Done():
			return
		case e, ok := <-sub.Out():
			if !ok {
				return
			}
			ev := e.(event.EvtPeerConnectednessChanged)
			n.table.SetConnected(ev.Peer, ev.Connectedness == network.Connected)
		}
	}
}

// bootstrapLoop dials the bootstrap peers until at least one answers, then,
// once the first announcement had a moment to spread, has the DHT fill its
// routing table. Later losses are the DHT's to repair (it redials its
// bootstrap peers when its table runs empty).
func (n *Node) bootstrapLoop() {
	defer n.wg.Done()
	backoff := time.Second
	for {
		var wg sync.WaitGroup
		var ok atomic.Bool
		for i, ai := range n.bootstrap {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if early := n.early[i]; early != nil {
					// The first round: New dialed and pushed already.
					n.early[i] = nil
					select {
					case err := <-early:
						if err == nil {
							ok.Store(true)
							return
						}
					case <-n.ctx.Done():
						return
					}
				}
				ctx, cancel := context.WithTimeout(n.ctx, bootstrapTimeout)
				defer cancel()
				if err := n.host.Connect(ctx, ai); err != nil {
					if n.ctx.Err() == nil {
						n.log.WithField("peer", ai.ID.String()).Warnf("bootstrap: %v", err)
					}
					return
				}
				ok.Store(true)
				// Hand the bootstrap peer our record at once: it
				// passes it on to its own peers, so that the network
				// knows this node before its gossip is set up.
				if err := n.pushNodeData(ctx, ai.ID); err != nil && n.ctx.Err() == nil {
					n.log.WithField("peer", ai.ID.String()).Debugf("bootstrap: %v", err)
				}
			}()
		}
		wg.Wait()
		if ok.Load() {
			break
		}
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
	select {
	case <-n.ctx.Done():
		return
	case <-time.After(refreshDelay):
	}
	signal(n.refresh)
}

// onPeerJoin runs when a peer joins the NodeData topic: publish our record
// while it may still be new to the network, and learn what the newcomer
// knows.
func (n *Node) onPeerJoin(p peer.ID) {
	if n.reach.Load() < minReach {
		n.publish()
	}
	req := syncRequest{p: p, due: time.Now()}
	if n.synced.Load() >= fullSyncs {
		req.due = req.due.Add(selfFetchDelay)
	}
	select {
	case n.syncQ <- req:
	default:
		n.log.WithField("peer", p.String()).Debug("nodedata sync queue full; waiting for the next announcement")
	}
}

// syncRequest asks syncLoop to fetch nodedata from p, not before due.
type syncRequest struct {
	p   peer.ID
	due time.Time
}

func (n *Node) syncLoop() {
	defer n.wg.Done()
	for {
		var req syncRequest
		select {
		case <-n.ctx.Done():
			return
		case req = <-n.syncQ:
		}
		if wait := time.Until(req.due); wait > 0 {
			select {
			case <-n.ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		p := req.p
		all := n.synced.Load() < fullSyncs
		if _, ok := n.table.Get(p); ok && !all {
			continue
		}
		if _, err := n.fetchNodeData(n.ctx, p, all); err != nil {
			if n.ctx.Err() == nil {
				n.log.Debugf("sync: %v", err)
			}
			continue
		}
		if all {
			n.synced.Add(1)
		}
	}
}

// verifyGossip checks an announcement before gossipsub relays it: the same
// checks as the DHT validator. Whoever published the message on gossip, the
// record inside must be signed by the key of the peer it speaks for: that
// signature is what makes it trustworthy, so any peer may pass on another's
// record (as a node does with the record a newcomer pushed to it), while the
// peer table's rules (newest sequence wins, replays refused) apply whoever
// relayed it. A good record is entered in the peer table here, without
// waiting for gossipsub's delivery queue.
func (n *Node) verifyGossip(author peer.ID, data []byte) (any, error) {
	if author == n.ID() {
		return nil, nil // our own publication on its way out, checked when it was made
	}
	if id, ok := envelopeSigner(data); ok && (id == n.ID() || n.table.HoldsGossiped(id, data)) {
		// Signed with our key: our own record passed back to us, which
		// we never need (and a forgery would not pass the signature
		// check). Otherwise a copy of what we already relayed.
		return nil, pubsub.ErrIgnore
	}
	// author is proven by gossipsub's message signature: a node's own
	// record needs no second signature check (see openNodeData), a relayed
	// one is checked in full.
	sd, err := openNodeData(data, n.network, author)
	if err != nil {
		n.table.RejectVia(SourceGossip, ReasonOf(err), author, err)
		return nil, err
	}
	id := sd.Data.PeerID
	if have, ok := n.table.Sequence(id); ok && sd.Data.Sequence <= have {
		if sd.Data.Sequence == have {
			// Held, but learned by sync or from the DHT: relay it
			// once so it still spreads, and mark it relayed.
			if p, ok := n.table.Get(id); ok && !p.Gossiped {
				n.enter(sd, author, SourceGossip)
				return nil, nil
			}
			return nil, pubsub.ErrIgnore
		}
		// An older record is not relayed, but the relaying peer may just
		// have been slow: ignore rather than punish.
		err := reject(RejectReplay, fmt.Errorf("sequence %d of %s, already have %d", sd.Data.Sequence, id, have))
		n.table.RejectVia(SourceGossip, RejectReplay, author, err)
		return nil, fmt.Errorf("%w: %w", pubsub.ErrIgnore, err)
	}
	n.enter(sd, author, SourceGossip)
	return nil, nil
}

// accept opens a signed record from the network and enters it.
func (n *Node) accept(data []byte, from peer.ID, src Source) (bool, error) {
	if id, ok := envelopeSigner(data); ok && n.table.Holds(id, data) {
		// The record held, byte for byte: a sync mostly returns what
		// gossip already brought, and checking each again would cost a
		// signature check per record per sync.
		return false, nil
	}
	sd, err := OpenNodeData(data, n.network)
	if err != nil {
		n.table.RejectVia(src, ReasonOf(err), from, err)
		return false, err
	}
	return n.enter(sd, from, src)
}

// enter offers a verified record to the table and, when it is newer, keeps
// the addresses its peer signed so that the peer can be dialed.
func (n *Node) enter(sd *SignedNodeData, from peer.ID, src Source) (bool, error) {
	ok, err := n.table.Offer(sd, from, src)
	if ok {
		n.host.Peerstore().AddAddrs(sd.Data.PeerID, sd.Data.Multiaddrs(), n.cfg.RecordTTL)
	}
	return ok, err
}

// Lookup reads a peer's record from the DHT, verifies it like any other,
// enters it in the peer table when it is newer than the one held, and
// returns it.
func (n *Node) Lookup(ctx context.Context, id peer.ID) (NodeData, error) {
	val, err := n.dht.GetValue(ctx, DHTKey(id))
	if err != nil {
		return NodeData{}, fmt.Errorf("dht lookup %s: %w", id, err)
	}
	sd, err := OpenNodeData(val, n.network)
	if err != nil {
		n.table.RejectVia(SourceDHT, ReasonOf(err), "", err)
		return NodeData{}, fmt.Errorf("dht lookup %s: %w", id, err)
	}
	if sd.Data.PeerID != id {
		return NodeData{}, fmt.Errorf("dht lookup %s: got the record of %s", id, sd.Data.PeerID)
	}
	if _, err := n.enter(sd, "", SourceDHT); err != nil && ReasonOf(err) != RejectReplay {
		return NodeData{}, fmt.Errorf("dht lookup %s: %w", id, err)
	}
	return sd.Data, nil
}

// FindWorkers asks the DHT for the providers of a work type, so that a node
// can find workers of a type it has not seen announced yet, and returns the
// record of each (from the peer table when it is fresh there, else read from
// the DHT). Providers whose record cannot be read are left out.
func (n *Node) FindWorkers(ctx context.Context, workType string) ([]NodeData, error) {
	c, err := WorkTypeCID(n.network, workType)
	if err != nil {
		return nil, fmt.Errorf("find workers %s: %w", workType, err)
	}
	var out []NodeData
	for ai := range n.dht.FindProvidersAsync(ctx, c, 100) {
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

// claimProtocols records, on a borrowed host, the protocols the node added
// to those the host served before (before), for Close to remove.
func (n *Node) claimProtocols(before []protocol.ID) {
	if n.ownsHost {
		return
	}
	n.added = n.added[:0]
	for _, p := range n.host.Mux().Protocols() {
		if !slices.Contains(before, p) {
			n.added = append(n.added, p)
		}
	}
}

// Close stops the node: the API, gossip, the DHT, every background goroutine
// and the host when the node made it (a host given with WithHost is left
// open, without the node's protocol handlers). It is safe to call more than
// once.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.cancel()
		var errs []error
		if err := n.api.Close(); err != nil {
			errs = append(errs, err)
		}
		if n.gossip != nil {
			n.gossip.Close()
		}
		n.wg.Wait()
		if n.dht != nil {
			if err := n.dht.Close(); err != nil {
				errs = append(errs, fmt.Errorf("dht: %w", err))
			}
		}
		if n.ownsHost {
			if err := n.host.Close(); err != nil {
				errs = append(errs, fmt.Errorf("host: %w", err))
			}
		} else {
			for _, p := range n.added {
				n.host.RemoveStreamHandler(p)
			}
		}
		n.closeErr = errors.Join(errs...)
		if n.closeErr != nil {
			n.closeErr = fmt.Errorf("node close: %w", n.closeErr)
		}
	})
	return n.closeErr
}
