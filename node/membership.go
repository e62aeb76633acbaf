package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/sec"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/libp2p/go-libp2p/p2p/protocol/identify"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/sirupsen/logrus"
)

// Timing of joining the network and learning its peers.
const (
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
	// refreshDelay is the wait between reaching a bootstrap peer and the
	// first routing-table fill.
	refreshDelay = 500 * time.Millisecond
	// firstDialTimeout bounds the first dial of a bootstrap peer, so that
	// one that does not answer is reported within a couple of seconds of
	// the start; each later round allows twice as long, up to
	// bootstrapTimeout, for a slow path.
	firstDialTimeout = 2 * time.Second
	// bootstrapTimeout bounds one dial and push to a bootstrap peer.
	bootstrapTimeout = 10 * time.Second
	// firstRetry is the wait after the first round in which no bootstrap
	// peer answered; it doubles each round, up to maxRetry.
	firstRetry = time.Second
	maxRetry   = time.Minute
	// identifyWait bounds the wait for a bootstrap peer's identify, which
	// says what it speaks, when it refused the nodedata protocol.
	identifyWait = time.Second
)

// recordExchange is the nodedata protocol (health.go) as membership uses
// it: pushing the node's record to a peer and fetching a peer's records.
type recordExchange interface {
	pushNodeData(ctx context.Context, p peer.ID) error
	pushEarly(ctx context.Context, p peer.ID) error
	fetchNodeData(ctx context.Context, p peer.ID, all bool) (int, error)
}

// membership is how the node joins the network and learns who is in it:
// it dials the bootstrap peers until one answers, follows connections into
// the peer table, syncs records with the peers that join the NodeData
// topic, and expires peers whose records grew too old.
//
// It starts in two steps, because a join's first milliseconds count: Start
// watches connections and dials the bootstrap peers at once, while the
// rest of the node is set up; Join, once the DHT is up, runs the bootstrap
// retries, the syncs and the expiry.
type membership struct {
	log       *logrus.Logger
	network   string
	host      host.Host
	table     *PeerTable
	rec       *recordPublisher
	ex        recordExchange
	bootstrap []peer.AddrInfo
	ttl       time.Duration
	// trustNames has the dial guard clear the addresses a bootstrap
	// peer's configured names resolve to now (dialGuard.trustNames); nil:
	// no guard.
	trustNames func(context.Context, peer.AddrInfo)

	// ctx is the one given to Start; onPeerJoin publishes within it.
	ctx context.Context
	// early carries the outcome of Start's dial and push to each bootstrap
	// peer to bootstrapLoop's first round (then nil).
	early  []chan error
	synced atomic.Int32
	syncQ  chan syncRequest
	wg     sync.WaitGroup
}

func newMembership(h host.Host, network string, table *PeerTable, rec *recordPublisher, ex recordExchange, bootstrap []peer.AddrInfo, ttl time.Duration, log *logrus.Logger) *membership {
	return &membership{
		log: log, network: network, host: h, table: table, rec: rec, ex: ex, bootstrap: bootstrap, ttl: ttl,
		syncQ: make(chan syncRequest, 256),
	}
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

// Start follows the host's connections into the peer table and dials the
// bootstrap peers, until ctx ends.
func (m *membership) Start(ctx context.Context) error {
	m.ctx = ctx
	sub, err := m.host.EventBus().Subscribe(new(event.EvtPeerConnectednessChanged))
	if err != nil {
		return fmt.Errorf("connection events: %w", err)
	}
	m.wg.Add(1)
	go m.connectednessLoop(ctx, sub)
	// Dial the bootstrap peers while the rest of the node is set up: the
	// QUIC handshake is most of a join's first milliseconds, and
	// bootstrapLoop's Connect then finds the connection made or joins the
	// dial in progress. Handlers set after the connection reach the peer
	// by identify push. It starts once connection events are watched, so
	// the peer table sees this connection too.
	// Once connected, it pushes the node's record at once, without
	// waiting for identify (pushEarly): the push is what makes the node
	// known, and identify's round trip would only delay it.
	m.early = make([]chan error, len(m.bootstrap))
	for i, ai := range m.bootstrap {
		done := make(chan error, 1)
		m.early[i] = done
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.host.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.TempAddrTTL)
			done <- m.reachBootstrap(ctx, ai, firstDialTimeout, true) // bootstrapLoop reports errors and tries again
		}()
	}
	return nil
}

// Join runs, until the context given to Start ends, the expiry of old
// records, the syncs with joining peers and, with bootstrap peers, the
// retries of the dials Start made; joined runs once a bootstrap peer
// answered and the first announcement had a moment to spread.
func (m *membership) Join(joined func()) {
	m.wg.Add(3)
	go m.expireLoop(m.ctx)
	go m.syncLoop(m.ctx)
	go m.syncLoop(m.ctx)
	if len(m.bootstrap) > 0 {
		m.wg.Add(1)
		go m.bootstrapLoop(m.ctx, joined)
	}
}

// Close waits for membership's goroutines, which end with the context
// given to Start.
func (m *membership) Close() error {
	m.wg.Wait()
	return nil
}

func (m *membership) expireLoop(ctx context.Context) {
	defer m.wg.Done()
	t := time.NewTicker(max(m.ttl/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.table.Expire()
		}
	}
}

func (m *membership) connectednessLoop(ctx context.Context, sub event.Subscription) {
	defer m.wg.Done()
	defer sub.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-sub.Out():
			if !ok {
				return
			}
			ev := e.(event.EvtPeerConnectednessChanged)
			m.table.SetConnected(ev.Peer, ev.Connectedness == network.Connected)
		}
	}
}

// bootstrapLoop dials the bootstrap peers until at least one answers, then,
// once the first announcement had a moment to spread, calls joined (the
// DHT fills its routing table). Later losses are the DHT's to repair (it
// redials its bootstrap peers when its table runs empty).
//
// After each round in which none answered, it says why for each of them
// (reportBootstrap), and tries again after 1s, 2s, 4s... up to maxRetry:
// at warn level while the node has no workmesh peer at all, at debug level
// once it has one by other means (a peer that dialed it).
func (m *membership) bootstrapLoop(ctx context.Context, joined func()) {
	defer m.wg.Done()
	wait, timeout := firstRetry, firstDialTimeout
	for {
		errs := make([]error, len(m.bootstrap))
		var wg sync.WaitGroup
		for i, ai := range m.bootstrap {
			wg.Go(func() {
				if early := m.early[i]; early != nil {
					// The first round: Start dialed and pushed already.
					m.early[i] = nil
					select {
					case errs[i] = <-early:
					case <-ctx.Done():
					}
					return
				}
				errs[i] = m.reachBootstrap(ctx, ai, timeout, false)
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			return
		}
		if slices.Contains(errs, nil) {
			break
		}
		quiet := m.hasPeer()
		for i, err := range errs {
			m.reportBootstrap(m.bootstrap[i], err, wait, quiet)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait, timeout = min(2*wait, maxRetry), min(2*timeout, bootstrapTimeout)
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(refreshDelay):
	}
	joined()
}

// reachBootstrap dials a bootstrap peer (the dial bounded by dialTimeout)
// and hands it the node's record, which it passes on to its own peers, so
// that the network knows this node before its gossip is set up. early
// pushes without waiting for identify (pushEarly): the push is what makes
// the node known, and identify's round trip would only delay it.
//
// A peer that is reached but refuses the push still counts as reached
// when it speaks this network's nodedata protocol (it may just be busy);
// one that does not speak it is not a peer of this network, and the error
// says which network it is on when its protocols tell (see otherNetwork).
// Dials skip the swarm's dial backoff: the retries are spaced here.
func (m *membership) reachBootstrap(ctx context.Context, ai peer.AddrInfo, dialTimeout time.Duration, early bool) error {
	ctx, cancel := context.WithTimeout(network.WithForceDirectDial(ctx, "bootstrap"), bootstrapTimeout)
	defer cancel()
	if m.trustNames != nil {
		m.trustNames(ctx, ai)
	}
	dctx, dcancel := context.WithTimeout(ctx, dialTimeout)
	defer dcancel()
	var err error
	if early {
		_, err = m.host.Network().DialPeer(dctx, ai.ID)
	} else {
		err = m.host.Connect(dctx, ai)
	}
	if err != nil {
		return &dialError{err: err, timeout: dialTimeout}
	}
	if early {
		err = m.ex.pushEarly(ctx, ai.ID)
	} else {
		err = m.ex.pushNodeData(ctx, ai.ID)
	}
	if err == nil {
		return nil
	}
	if ctx.Err() == nil {
		switch speaks, identified := m.speaks(ctx, ai.ID); {
		case speaks:
			m.log.WithField("peer", ai.ID.String()).Debugf("bootstrap: %v", err)
			return nil
		case !identified:
			// Nothing says what the peer speaks: it is connected but
			// too busy to take the record or to identify itself in
			// time. Its connection stays (a busy member of the network
			// is still one), and the dial is tried again.
			return fmt.Errorf("reached, but it neither took this node's record nor identified itself within %s: %w", identifyWait, err)
		}
	}
	ne := &networkError{network: m.network, other: m.otherNetwork(ai.ID), err: err}
	if conns := m.host.Network().ConnsToPeer(ai.ID); len(conns) > 0 {
		ne.addr = conns[0].RemoteMultiaddr()
	}
	// Not a peer of this network: its connection serves nothing here.
	_ = m.host.Network().ClosePeer(ai.ID)
	return ne
}

// speaks reports whether p, once identified, serves this network's
// nodedata protocol, and whether identify told what p speaks (when it did
// not, in time, speaks is false but says nothing of p).
func (m *membership) speaks(ctx context.Context, p peer.ID) (speaks, identified bool) {
	identified = m.waitIdentify(ctx, p)
	ok, err := m.host.Peerstore().SupportsProtocols(p, NodeDataProtocol(m.network))
	return err == nil && len(ok) > 0, identified
}

// waitIdentify waits, for identifyWait at most, until identify ran on a
// connection to p, so that the peerstore knows what p speaks, and reports
// whether it did. A host without an identify service is taken as having
// told all it will.
func (m *membership) waitIdentify(ctx context.Context, p peer.ID) bool {
	ids, ok := m.host.(interface{ IDService() identify.IDService })
	if !ok {
		return true
	}
	conns := m.host.Network().ConnsToPeer(p)
	if len(conns) == 0 {
		return true // gone: nothing to keep open
	}
	t := time.NewTimer(identifyWait)
	defer t.Stop()
	select {
	case <-ids.IDService().IdentifyWait(conns[0]):
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// workmeshProtocol matches a workmesh protocol ID; its first group is the
// network name (see HealthProtocol, NodeDataProtocol).
var workmeshProtocol = regexp.MustCompile(`^/workmesh/([A-Za-z0-9._-]{1,64})/[a-z]+/`)

// otherNetwork returns the networks p's workmesh protocols are scoped to,
// comma-separated, or "" when it speaks none (or identify did not say).
func (m *membership) otherNetwork(p peer.ID) string {
	protos, _ := m.host.Peerstore().GetProtocols(p)
	var nets []string
	for _, id := range protos {
		if sub := workmeshProtocol.FindStringSubmatch(string(id)); sub != nil && !slices.Contains(nets, sub[1]) {
			nets = append(nets, sub[1])
		}
	}
	slices.Sort(nets)
	return strings.Join(nets, ",")
}

// hasPeer reports whether the node is connected to a peer of its network:
// one in the peer table or one that serves its nodedata protocol.
func (m *membership) hasPeer() bool {
	for _, p := range m.host.Network().Peers() {
		if _, ok := m.table.Get(p); ok {
			return true
		}
		if ok, err := m.host.Peerstore().SupportsProtocols(p, NodeDataProtocol(m.network)); err == nil && len(ok) > 0 {
			return true
		}
	}
	return false
}

// reportBootstrap logs, in one line, why a bootstrap peer did not answer
// and when it is tried again: at warn level, or at debug when quiet.
func (m *membership) reportBootstrap(ai peer.AddrInfo, err error, retry time.Duration, quiet bool) {
	log := m.log.WithFields(logrus.Fields{"peer": ai.ID.String(), "retry_in_ms": retry.Milliseconds()})
	var msg string
	if ne := (*networkError)(nil); errors.As(err, &ne) {
		if ne.addr != nil {
			ai.Addrs = []ma.Multiaddr{ne.addr}
		}
		msg = fmt.Sprintf("bootstrap peer %s %v; trying again in %s", bootstrapName(ai), err, retry)
	} else {
		msg = fmt.Sprintf("bootstrap %s: %v; trying again in %s", bootstrapName(ai), err, retry)
	}
	if quiet {
		log.Debug(msg)
		return
	}
	log.Warn(msg)
}

// bootstrapName is the bootstrap peer as the operator gave it: its
// address with /p2p/<id>, or its addresses when it has several.
func bootstrapName(ai peer.AddrInfo) string {
	addrs, err := peer.AddrInfoToP2pAddrs(&ai)
	if err != nil || len(addrs) == 0 {
		return "peer " + ai.ID.String()
	}
	names := make([]string, len(addrs))
	for i, a := range addrs {
		names[i] = a.String()
	}
	return strings.Join(names, ", ")
}

// networkError is a bootstrap peer that was reached but is not a peer of
// this node's network.
// Its text reads after "bootstrap peer <address> ".
type networkError struct {
	network, other string
	// addr is the address the peer was reached at, when known.
	addr ma.Multiaddr
	err  error
}

func (e *networkError) Error() string {
	if e.other != "" {
		return fmt.Sprintf("is on network %s, this node is on %s (to join that network, start this node with --network %s)",
			e.other, e.network, e.other)
	}
	return fmt.Sprintf("does not speak workmesh network %s (%s)", e.network, rootCause(e.err))
}

func (e *networkError) Unwrap() error { return e.err }

// dialError is a failed dial of a bootstrap peer, said as its root cause
// per address rather than as libp2p's aggregate text.
type dialError struct {
	err     error
	timeout time.Duration
}

func (e *dialError) Unwrap() error { return e.err }

func (e *dialError) Error() string {
	var de *swarm.DialError
	if !errors.As(e.err, &de) || len(de.DialErrors) == 0 {
		return "unreachable: " + e.cause(e.err)
	}
	causes := make([]string, 0, len(de.DialErrors))
	for _, te := range de.DialErrors {
		c := e.cause(te.Cause)
		if len(de.DialErrors) > 1 {
			c = te.Address.String() + ": " + c
		}
		causes = append(causes, c)
	}
	return "unreachable: " + strings.Join(causes, "; ")
}

// cause names a dial error's root cause in a few words.
func (e *dialError) cause(err error) string {
	var mismatch sec.ErrPeerIDMismatch
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.EHOSTUNREACH):
		return "no route to host"
	case errors.Is(err, syscall.ENETUNREACH):
		return "network unreachable"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "address not available on this host"
	case errors.As(err, &mismatch):
		return fmt.Sprintf("another peer answers at this address (%s)", mismatch.Actual)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return fmt.Sprintf("no answer within %s (timeout)", e.timeout)
	case errors.Is(err, swarm.ErrNoAddresses):
		return "no address to dial"
	case errors.Is(err, swarm.ErrNoTransport):
		return "no transport for this address"
	}
	return rootCause(err)
}

// rootCause is the innermost error's text, on one line.
func rootCause(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			break
		}
		err = next
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// onPeerJoin runs when a peer joins the NodeData topic: publish our record
// while it may still be new to the network, and learn what the newcomer
// knows. A peer that missed a publication of this node's (gossipsub counted
// it in the topic before it had a send queue to it, pubsub's LeftOut) has
// this node's record pushed to it: the one it has, if any, may be older.
func (m *membership) onPeerJoin(p peer.ID, missed bool) {
	req := syncRequest{p: p, due: time.Now(), push: missed}
	if m.rec.reach.Load() < minReach {
		if !m.rec.published() {
			m.rec.publish(m.ctx)
		} else {
			// Published already: the same bytes again would be a
			// duplicate on gossip (message IDs are the hash of the
			// bytes), and a re-signed record would go to every node
			// once more. The record is pushed to p instead, which
			// enters it and, when it is new there, passes the same
			// bytes on to its mesh, where the nodes that have it drop
			// them unchecked.
			req.push = true
		}
	}
	if m.synced.Load() >= fullSyncs {
		req.due = req.due.Add(selfFetchDelay)
	}
	select {
	case m.syncQ <- req:
	default:
		m.log.WithField("peer", p.String()).Debug("nodedata sync queue full; waiting for the next announcement")
	}
}

// syncRequest asks syncLoop to fetch nodedata from p, not before due.
type syncRequest struct {
	p   peer.ID
	due time.Time
	// push: the exchange is for handing p this node's record, whatever
	// the table holds of p.
	push bool
}

func (m *membership) syncLoop(ctx context.Context) {
	defer m.wg.Done()
	for {
		var req syncRequest
		select {
		case <-ctx.Done():
			return
		case req = <-m.syncQ:
		}
		if wait := time.Until(req.due); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		p := req.p
		all := m.synced.Load() < fullSyncs
		if _, ok := m.table.Get(p); ok && !all && !req.push {
			continue
		}
		if _, err := m.ex.fetchNodeData(ctx, p, all); err != nil {
			if ctx.Err() == nil {
				m.log.Debugf("sync: %v", err)
			}
			continue
		}
		if all {
			m.synced.Add(1)
		}
	}
}
