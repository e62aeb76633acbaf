package node

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
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
	// bootstrapTimeout bounds one dial of a bootstrap peer.
	bootstrapTimeout = 10 * time.Second
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
	host      host.Host
	table     *PeerTable
	rec       *recordPublisher
	ex        recordExchange
	bootstrap []peer.AddrInfo
	ttl       time.Duration

	// ctx is the one given to Start; onPeerJoin publishes within it.
	ctx context.Context
	// early carries the outcome of Start's dial and push to each bootstrap
	// peer to bootstrapLoop's first round (then nil).
	early  []chan error
	synced atomic.Int32
	syncQ  chan syncRequest
	wg     sync.WaitGroup
}

func newMembership(h host.Host, table *PeerTable, rec *recordPublisher, ex recordExchange, bootstrap []peer.AddrInfo, ttl time.Duration, log *logrus.Logger) *membership {
	return &membership{
		log: log, host: h, table: table, rec: rec, ex: ex, bootstrap: bootstrap, ttl: ttl,
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
			dctx, dcancel := context.WithTimeout(ctx, bootstrapTimeout)
			defer dcancel()
			m.host.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.TempAddrTTL)
			_, err := m.host.Network().DialPeer(dctx, ai.ID)
			if err == nil {
				err = m.ex.pushEarly(dctx, ai.ID)
			}
			done <- err // bootstrapLoop reports errors and tries again
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
func (m *membership) bootstrapLoop(ctx context.Context, joined func()) {
	defer m.wg.Done()
	backoff := time.Second
	for {
		var wg sync.WaitGroup
		var ok atomic.Bool
		for i, ai := range m.bootstrap {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if early := m.early[i]; early != nil {
					// The first round: Start dialed and pushed already.
					m.early[i] = nil
					select {
					case err := <-early:
						if err == nil {
							ok.Store(true)
							return
						}
					case <-ctx.Done():
						return
					}
				}
				dctx, cancel := context.WithTimeout(ctx, bootstrapTimeout)
				defer cancel()
				if err := m.host.Connect(dctx, ai); err != nil {
					if ctx.Err() == nil {
						m.log.WithField("peer", ai.ID.String()).Warnf("bootstrap: %v", err)
					}
					return
				}
				ok.Store(true)
				// Hand the bootstrap peer our record at once: it
				// passes it on to its own peers, so that the network
				// knows this node before its gossip is set up.
				if err := m.ex.pushNodeData(dctx, ai.ID); err != nil && ctx.Err() == nil {
					m.log.WithField("peer", ai.ID.String()).Debugf("bootstrap: %v", err)
				}
			}()
		}
		wg.Wait()
		if ok.Load() {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(refreshDelay):
	}
	joined()
}

// onPeerJoin runs when a peer joins the NodeData topic: publish our record
// while it may still be new to the network, and learn what the newcomer
// knows.
func (m *membership) onPeerJoin(p peer.ID) {
	if m.rec.reach.Load() < minReach {
		m.rec.publish(m.ctx)
	}
	req := syncRequest{p: p, due: time.Now()}
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
		if _, ok := m.table.Get(p); ok && !all {
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
