package pubsub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	lpubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/sirupsen/logrus"
	"golang.org/x/time/rate"
)

// TopicName returns the gossip topic that carries NodeData in a network.
func TopicName(network string) string { return "workmesh/" + network + "/nodedata/1" }

// ErrIgnore, returned (or wrapped) by a Verifier, drops a message that is
// valid but not worth passing on (an older copy of a record already held),
// without penalising the peer that relayed it. Any other error rejects the
// message and counts against the relaying peer in gossipsub's scoring.
var ErrIgnore = errors.New("announcement ignored")

// Verifier checks one announcement before it is delivered or relayed.
// from is the peer that passed the message to this node (a direct
// connection), or this node itself for its own publications. Messages carry
// no author and no signature of gossipsub's own (see New): an announcement is
// a value that proves itself (a signed record), and the Verifier is what
// checks that proof, once. It returns the decoded value that the Handler will
// receive. It is the earliest point at which an announcement is known good,
// so a caller that only needs the value may act on it here and pass a nil
// Handler.
type Verifier func(from peer.ID, data []byte) (any, error)

// Handler receives each verified announcement from another peer, with the
// peer that passed it on and the value its Verifier returned, after
// gossipsub's own bookkeeping.
type Handler func(from peer.ID, value any)

// MessageID is the gossip message ID of an announcement: the SHA-256 of its
// bytes, in hex. Content-addressed, the same record is one message however
// many peers publish it (its author, and any peer that relays it on the
// author's behalf), and gossipsub drops every copy after the first one
// before it is validated.
func MessageID(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// MessageFormat returns the gossipsub options that set the network's
// message format, which every peer on the topic must share: messages carry
// neither an author nor a signature of gossipsub's own, and a message that
// does is refused (an announcement is a record signed by the peer it
// speaks for, which the Verifier checks, so a second signature over the
// same bytes would only double the checks); the message ID is the hash of
// the bytes (MessageID), so copies of one record published by several
// peers are one message, and a copy is dropped as a duplicate before it
// costs a check. A bad message counts against the peer that passed it on.
func MessageFormat() []lpubsub.Option {
	return []lpubsub.Option{
		lpubsub.WithNoAuthor(),
		lpubsub.WithMessageSignaturePolicy(lpubsub.StrictNoSign),
		lpubsub.WithMessageIdFn(func(m *pb.Message) string { return MessageID(m.GetData()) }),
	}
}

// Option configures an Announcer.
type Option func(*options) error

type options struct {
	log        *logrus.Logger
	onPeerJoin func(peer.ID, bool)
	gossipOpts []lpubsub.Option
	topics     []string
	peerRate   rate.Limit
	peerBurst  int
	noEarly    bool // tests: no early send queues (earlyQueues)
}

// Defaults of the per-peer rate limit on announcements (WithPeerRate): a
// forwarding peer of a network of a few hundred nodes, each announcing every
// few seconds, stays well under it, and a burst of 200 records back to back
// (a network forming) fits in the burst.
const (
	DefaultPeerRate  rate.Limit = 200
	DefaultPeerBurst int        = 400
)

// WithPeerRate limits the announcements one peer may pass to this node: r a
// second, burst at once. A message beyond it is rejected before it is
// verified, which counts against the peer in gossipsub's peer score (see
// ScoreParams): a peer that keeps flooding is graylisted, and gossipsub then
// ignores what it sends. r = rate.Inf lifts the limit.
func WithPeerRate(r rate.Limit, burst int) Option {
	return func(o *options) error {
		if r <= 0 || burst < 1 {
			return fmt.Errorf("pubsub: peer rate %v, burst %d: want both positive", r, burst)
		}
		o.peerRate, o.peerBurst = r, burst
		return nil
	}
}

// WithLogger sets the logger; the default is the standard logrus logger.
func WithLogger(log *logrus.Logger) Option {
	return func(o *options) error {
		if log == nil {
			return errors.New("pubsub: nil logger")
		}
		o.log = log
		return nil
	}
}

// WithPeerJoin sets a function called (from one goroutine, in order) each
// time a peer has joined the topic and this node can send to it, so the
// caller can greet newcomers. Both conditions matter: gossipsub may learn of
// a peer's subscription before it has a send queue to that peer, and a
// publication of this node's in between is not sent to that peer (see
// LeftOut). missed says one was, since the peer's last greeting: the peer
// may lack this node's latest record.
func WithPeerJoin(f func(p peer.ID, missed bool)) Option {
	return func(o *options) error {
		o.onPeerJoin = f
		return nil
	}
}

// WithGossipSubOptions passes options through to gossipsub (for example
// faster heartbeats in tests).
func WithGossipSubOptions(opts ...lpubsub.Option) Option {
	return func(o *options) error {
		o.gossipOpts = append(o.gossipOpts, opts...)
		return nil
	}
}

// WithTopics names topics besides the network's that this node may join
// on the same gossipsub (an embedder's own, or a benchmark's baseline):
// peers' subscriptions to them are tracked as to the network's, and a join
// of any other topic is refused (see earlyQueues).
func WithTopics(names ...string) Option {
	return func(o *options) error {
		o.topics = append(o.topics, names...)
		return nil
	}
}

// Announcer publishes this node's announcements on the network's topic and
// hands verified announcements from other peers to a Handler. Messages are
// verified before they are delivered or relayed.
type Announcer struct {
	self  peer.ID
	log   *logrus.Logger
	ps    *lpubsub.PubSub
	topic *lpubsub.Topic
	sub   *lpubsub.Subscription
	evh   *lpubsub.TopicEventHandler

	onJoin func(peer.ID, bool)

	// early carries the peers that subscribed before this node had a send
	// queue to them, for earlyLoop (see earlyQueues).
	early   chan peer.ID
	emitter event.Emitter
	// waiting holds the messages in gossipsub's validation queue.
	waiting *waiting

	mu      sync.Mutex
	peers   map[peer.ID]peerState
	ready   []joined      // peers that became ready, for joinLoop
	readyCh chan struct{} // signals ready is not empty

	// Messages gossipsub dropped under load (see Dropped), and those of
	// droppedOutbound that were for a peer without a stream yet. This
	// node's own publications are not among them (leftOut; own holds what
	// it published lately).
	droppedValidation, droppedOutbound, droppedNoStream atomic.Uint64

	own recent
	// leftOut counts this node's publications gossipsub had no send queue
	// for a topic peer to put in (see LeftOut).
	leftOut atomic.Uint64
	// Messages rejected because their peer passed its rate (WithPeerRate),
	// and those dropped on arrival at twice it.
	throttled, shed atomic.Uint64

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// Gossipsub's queues, per node: messages waiting for validation, and
// messages waiting to be written to each peer. At gossipsub's default of 32
// each, a burst of announcements (a network forming, a partition healing)
// loses records: of 200 records published back to back by one peer, a node
// dropped 9 and 23 for a full validation queue in two of three runs
// (TestNetworkGossipBurstKeepsEveryRecord), lost unless a duplicate, a sync
// or the next announcement brings them again. 256 held such a burst. With
// records re-announced only on change (and every few minutes), a record
// lost to a full queue stays lost until a sync or that refresh: the queues
// hold a whole network forming, every node's record at once (of 200 nodes
// on mocknet, at 256 the dispatchers lacked a third of the workers' records
// for 40s). A sustained overload still sheds messages, counted in Dropped.
// A queued message is a pointer; the record it holds is at most
// MaxRecordSize.
const (
	validateQueueSize     = 1024
	peerOutboundQueueSize = 1024
	// validateConcurrency bounds the messages checked at once (see New);
	// beyond it a message is dropped as throttled, counted with those the
	// validation queue had no room for.
	validateConcurrency = 1024
)

// peerState tracks the two conditions under which a peer can be greeted.
type peerState struct {
	joined   bool // subscribed to the topic
	outbound bool // our stream to it is open
	greeted  bool // onJoin was called since both became true
	// missed: a publication of this node's was not sent to the peer since
	// its greeting (LeftOut); the next greeting says so.
	missed bool
}

// joined is a peer ready to be greeted, for joinLoop.
type joined struct {
	p      peer.ID
	missed bool
}

// New starts gossipsub on h, joins the topic of network, and delivers every
// announcement that verify accepts to deliver (which may be nil). The
// Announcer runs until Close or until ctx ends.
func New(ctx context.Context, h host.Host, network string, verify Verifier, deliver Handler, opts ...Option) (*Announcer, error) {
	if network == "" {
		return nil, errors.New("pubsub: empty network")
	}
	if verify == nil {
		return nil, errors.New("pubsub: a verifier is required")
	}
	o := options{log: logrus.StandardLogger(), peerRate: DefaultPeerRate, peerBurst: DefaultPeerBurst}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	a := &Announcer{
		self:    h.ID(),
		log:     o.log,
		cancel:  cancel,
		onJoin:  o.onPeerJoin,
		peers:   make(map[peer.ID]peerState),
		readyCh: make(chan struct{}, 1),
		early:   make(chan peer.ID, earlyQueue),
		waiting: newWaiting(),
	}
	if o.noEarly {
		a.early = nil // FilterIncomingSubscriptions never queues a peer
	}
	fail := func(err error) (*Announcer, error) {
		a.close()
		return nil, err
	}
	name := TopicName(network)
	em, err := h.EventBus().Emitter(new(event.EvtPeerProtocolsUpdated))
	if err != nil {
		return fail(fmt.Errorf("pubsub: protocol events: %w", err))
	}
	a.emitter = em

	gopts := append(MessageFormat(), append([]lpubsub.Option{
		// The network's message format (MessageFormat).
		// A node's own announcement goes to every topic peer it is
		// connected to, not only to its mesh: a node that just connected
		// has no mesh until the next heartbeat (up to a second), and
		// gossipsub no longer floods own messages by default.
		lpubsub.WithFloodPublish(true),
		lpubsub.WithRawTracer(streamTracer{a}),
		lpubsub.WithValidateQueueSize(validateQueueSize),
		lpubsub.WithPeerOutboundQueueSize(peerOutboundQueueSize),
		// Peers are scored (gossipsub v1.1): a peer whose announcements
		// are rejected (forged, malformed, beyond its rate) loses score
		// and, below the thresholds, is not gossiped to, not published
		// to and at last graylisted: its messages are dropped unread.
		lpubsub.WithPeerScore(ScoreParams(TopicName(network)), ScoreThresholds()),
		// A peer sending more than twice its rate (WithPeerRate) has the
		// excess dropped as it arrives, before gossipsub's validation
		// queue, which the messages of every peer share: a flood cannot
		// crowd honest announcements out of it. Up to twice the rate
		// reaches the verifier, which rejects what is beyond the rate
		// itself, and that is what sinks the peer's score.
		//
		// An RPC whose decoded control part is larger than gossipsub's
		// bound is dropped whole (inspectControl).
		lpubsub.WithAppSpecificRpcInspector(inspectors(inspectControl(lpubsub.DefaultMaxControlMessageSize),
			NewPeerBuckets(2*o.peerRate, 2*o.peerBurst).inspect(&a.shed), a.waiting.inspect(name))),
		// Only the network's topic (and WithTopics') are tracked, and a
		// peer that subscribes to one gets its send queue at once
		// (earlyQueues).
		lpubsub.WithSubscriptionFilter(newEarlyQueues(a, append([]string{name}, o.topics...))),
		// A peer gossipsub has no send queue for is not taken for a
		// floodsub peer (queueless).
		lpubsub.WithGossipSubProtocols(lpubsub.GossipSubDefaultProtocols, queuelessFeatures),
		lpubsub.WithPeerFilter(func(p peer.ID, _ string) bool { return a.HasStream(p) }),
	}, o.gossipOpts...)...)
	ps, err := lpubsub.NewGossipSub(ctx, h, gopts...)
	if err != nil {
		return fail(fmt.Errorf("pubsub: start gossipsub: %w", err))
	}
	a.ps = ps
	limits := NewPeerBuckets(o.peerRate, o.peerBurst)
	validate := func(_ context.Context, from peer.ID, msg *lpubsub.Message) lpubsub.ValidationResult {
		if from != a.self && !limits.Allow(from) {
			a.throttled.Add(1)
			return lpubsub.ValidationReject
		}
		v, err := verify(from, msg.Data)
		switch {
		case err == nil:
			msg.ValidatorData = v
			return lpubsub.ValidationAccept
		case errors.Is(err, ErrIgnore):
			return lpubsub.ValidationIgnore
		default:
			return lpubsub.ValidationReject
		}
	}
	// Not inline: gossipsub marks a message seen when a validation worker
	// takes it from the validation queue, and only then drops the other
	// copies of it on arrival. With the check inline, the few workers hold
	// each message for its signature check while the queue behind them
	// fills, and every copy that arrives meanwhile (from each mesh peer, and
	// from every peer that relays it while a network forms) takes a place
	// of its own: of 200 nodes forming on mocknet, dispatchers dropped
	// 1,000-4,000 messages for a full queue, copies crowding out records.
	// Handed to a goroutine of its own (at most validateConcurrency at
	// once), a message leaves the queue at once, is marked seen, and its
	// copies are dropped before they cost a place or a check.
	if err := ps.RegisterTopicValidator(name, lpubsub.ValidatorEx(validate), lpubsub.WithValidatorConcurrency(validateConcurrency)); err != nil {
		return fail(fmt.Errorf("pubsub: validator for %s: %w", name, err))
	}
	if a.topic, err = ps.Join(name); err != nil {
		return fail(fmt.Errorf("pubsub: join %s: %w", name, err))
	}
	if a.evh, err = a.topic.EventHandler(); err != nil {
		return fail(fmt.Errorf("pubsub: events of %s: %w", name, err))
	}
	if a.sub, err = a.topic.Subscribe(); err != nil {
		return fail(fmt.Errorf("pubsub: subscribe %s: %w", name, err))
	}

	a.wg.Add(4)
	go a.deliverLoop(ctx, deliver)
	go a.eventLoop(ctx)
	go a.joinLoop(ctx)
	go a.earlyLoop(ctx, h)
	return a, nil
}

func (a *Announcer) deliverLoop(ctx context.Context, deliver Handler) {
	defer a.wg.Done()
	for {
		msg, err := a.sub.Next(ctx)
		if err != nil {
			return // cancelled: Close or the parent context
		}
		if msg.ReceivedFrom == a.self || deliver == nil {
			continue // our own announcement, echoed back
		}
		deliver(msg.ReceivedFrom, msg.ValidatorData)
	}
}

func (a *Announcer) eventLoop(ctx context.Context) {
	defer a.wg.Done()
	for {
		ev, err := a.evh.NextPeerEvent(ctx)
		if err != nil {
			return
		}
		a.update(ev.Peer, func(st *peerState) {
			st.joined = ev.Type == lpubsub.PeerJoin
			// A publication left out for the peer was left out while
			// gossipsub counted it in the topic: before the leave, which
			// gossipsub announces once it no longer counts the peer.
			st.missed = st.missed && st.joined
		})
	}
}

// update changes the state of p and queues p for the join function when it
// just became both subscribed and reachable. It never blocks: the stream
// half is called from gossipsub's event loop.
func (a *Announcer) update(p peer.ID, change func(*peerState)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.peers[p]
	change(&st)
	switch {
	case st.joined && st.outbound && !st.greeted:
		st.greeted = true
		a.ready = append(a.ready, joined{p: p, missed: st.missed})
		st.missed = false
		select {
		case a.readyCh <- struct{}{}:
		default:
		}
	case !st.joined && !st.outbound && !st.missed:
		// missed and neither: left out before its join was handled here.
		delete(a.peers, p)
		return
	case !st.joined || !st.outbound:
		st.greeted = false
	}
	a.peers[p] = st
}

func (a *Announcer) joinLoop(ctx context.Context) {
	defer a.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.readyCh:
		}
		a.mu.Lock()
		ready := a.ready
		a.ready = nil
		a.mu.Unlock()
		for _, j := range ready {
			if a.onJoin != nil && ctx.Err() == nil {
				a.onJoin(j.p, j.missed)
			}
		}
	}
}

// Publish sends one announcement to the topic. It goes to every topic peer
// this node is connected to (gossipsub's flood publishing of own messages)
// and from them through the mesh; to a peer gossipsub has no send queue for
// yet, it goes later in another way (LeftOut).
func (a *Announcer) Publish(ctx context.Context, data []byte) error {
	a.own.add(MessageID(data))
	if err := a.topic.Publish(ctx, data); err != nil {
		return fmt.Errorf("pubsub: publish on %s: %w", a.topic.String(), err)
	}
	return nil
}

// Throttled returns how many messages were rejected because the peer that
// passed them on exceeded its rate (WithPeerRate), and how many were
// dropped on arrival because it exceeded twice its rate.
func (a *Announcer) Throttled() (rejected, shed uint64) { return a.throttled.Load(), a.shed.Load() }

// HasStream reports whether gossipsub's own stream to p is open, so that a
// message published now is sent to p. A peer's subscription can be known
// before that stream opens, and gossipsub drops what it would send in
// between.
func (a *Announcer) HasStream(p peer.ID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peers[p].outbound
}

// Peers returns the peers known to be subscribed to the topic.
func (a *Announcer) Peers() []peer.ID { return a.topic.ListPeers() }

// PubSub returns the underlying gossipsub instance, for benchmarks that
// compare with raw gossip on the same hosts.
func (a *Announcer) PubSub() *lpubsub.PubSub { return a.ps }

// Close stops delivery and leaves the topic. It waits for the Announcer's
// goroutines; the Handler and the join function are not called after it
// returns.
func (a *Announcer) Close() error {
	a.close()
	return nil
}

func (a *Announcer) close() {
	a.closeOnce.Do(func() {
		if a.sub != nil {
			a.sub.Cancel()
		}
		if a.evh != nil {
			a.evh.Cancel()
		}
		a.cancel()
		a.wg.Wait()
		if a.emitter != nil {
			_ = a.emitter.Close()
		}
		if a.topic != nil {
			// Close fails only while subscriptions or handlers are
			// active, and they were cancelled above; after ctx ends it
			// may report the pubsub as gone, which is fine.
			_ = a.topic.Close()
		}
	})
}
