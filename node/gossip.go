package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	lpubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/node/authority"
	"github.com/workmesh/workmesh/pubsub"
)

// gossip is where records from the network come in: it verifies every
// announcement before gossipsub relays it, and enters good records, from
// gossip, sync or the DHT, in the peer table. Entering works from the
// start; the announcer (gossipsub on the NodeData topic) runs from Start.
type gossip struct {
	log     *logrus.Logger
	host    host.Host
	table   *PeerTable
	guard   *dialGuard
	network string
	ttl     time.Duration // how long a record's addresses are kept
	ann     *pubsub.Announcer
	// newcomers bounds, per peer that passes records on, how many peers
	// new to the table it may introduce (see verify).
	newcomers *pubsub.PeerBuckets
}

// A peer that passes records on may introduce newcomerBurst peers new to
// the table at once, and newcomerRate more a second: a network forming
// through one bootstrap peer fits (a burst of 200 records of 200 new
// peers is kept whole), one peer inventing identities does not get far.
// A record beyond it is ignored, not rejected: its peer's next
// announcement, from this peer or another, brings it again.
const (
	newcomerBurst = 256
	newcomerRate  = 8
)

func newGossip(h host.Host, table *PeerTable, guard *dialGuard, network string, ttl time.Duration, log *logrus.Logger) *gossip {
	return &gossip{log: log, host: h, table: table, guard: guard, network: network, ttl: ttl,
		newcomers: pubsub.NewPeerBuckets(newcomerRate, newcomerBurst)}
}

// Start joins the NodeData topic; onPeerJoin runs when a peer joins it
// (missed: a publication of this node's was not sent to it, for want of a
// send queue, see pubsub.WithPeerJoin). The announcer runs until Close or until
// ctx ends.
func (g *gossip) Start(ctx context.Context, onPeerJoin func(p peer.ID, missed bool), opts []lpubsub.Option, topics []string) error {
	// Records are entered by the verifier itself, the moment they are
	// known good, rather than after gossipsub's delivery queue.
	ann, err := pubsub.New(ctx, g.host, g.network, g.verify, nil,
		pubsub.WithLogger(g.log),
		pubsub.WithPeerJoin(onPeerJoin),
		pubsub.WithGossipSubOptions(opts...),
		pubsub.WithTopics(topics...))
	if err != nil {
		return err
	}
	g.ann = ann
	return nil
}

// Close leaves the topic and stops gossipsub's delivery and join calls.
func (g *gossip) Close() error {
	if g.ann == nil {
		return nil
	}
	return g.ann.Close()
}

// verify checks an announcement before gossipsub relays it: the same
// checks as the DHT validator. Gossip messages carry no signature of their
// own (see pubsub.New): the record inside must be signed by the key of the
// peer it speaks for, and that one signature, checked here once, is what
// makes it trustworthy, so any peer may pass on another's record (as a node
// does with the record a newcomer pushed to it), while the peer table's
// rules (newest sequence wins, replays refused) apply whoever relayed it. A
// good record is entered in the peer table here, without waiting for
// gossipsub's delivery queue. A bad one counts against from, the peer that
// passed it on.
//
// from introduces at most newcomerBurst peers new to the table at once
// (newcomerRate a second after): beyond that a record of a peer the table
// does not hold is ignored before its signature is checked.
func (g *gossip) verify(from peer.ID, data []byte) (any, error) {
	self := g.host.ID()
	if from == self {
		// Our own publication on its way out (our record, or a peer's
		// that we relay), checked when it was made or received.
		return nil, nil
	}
	if authority.IsRevocation(data) {
		return g.verifyRevocation(from, data)
	}
	id, ok := envelopeSigner(data)
	if ok && (id == self || g.table.HoldsGossiped(id, data)) {
		// Signed with our key: our own record passed back to us, which
		// we never need (and a forgery would not pass the signature
		// check). Otherwise a copy of what we already relayed.
		return nil, pubsub.ErrIgnore
	}
	if ok {
		if p, held := g.table.Get(id); held && bytes.Equal(p.Envelope, data) {
			// Held byte for byte, learned by sync or from the DHT (and
			// checked then): relay it once so it still spreads, as below,
			// without checking its signature again.
			g.enter(&SignedNodeData{Data: p.Data, Envelope: p.Envelope}, from, SourceGossip)
			return nil, nil
		}
		if _, known := g.table.Sequence(id); !known && !g.newcomers.Allow(from) {
			return nil, fmt.Errorf("%w: %s passed on more records of peers new to this node than %d at once and %d a second", pubsub.ErrIgnore, from, newcomerBurst, newcomerRate)
		}
	}
	sd, err := OpenNodeData(data, g.network)
	if err != nil {
		g.table.RejectVia(SourceGossip, ReasonOf(err), from, err)
		return nil, err
	}
	id = sd.Data.PeerID
	if have, ok := g.table.Sequence(id); ok && sd.Data.Sequence <= have {
		if sd.Data.Sequence == have {
			// Held, but learned by sync or from the DHT: relay it
			// once so it still spreads, and mark it relayed.
			if p, ok := g.table.Get(id); ok && !p.Gossiped {
				g.enter(sd, from, SourceGossip)
				return nil, nil
			}
			return nil, pubsub.ErrIgnore
		}
		// An older record is not relayed, but the relaying peer may just
		// have been slow: ignore rather than punish.
		err := reject(RejectReplay, fmt.Errorf("sequence %d of %s, already have %d", sd.Data.Sequence, id, have))
		g.table.RejectVia(SourceGossip, RejectReplay, from, err)
		return nil, fmt.Errorf("%w: %w", pubsub.ErrIgnore, err)
	}
	if _, err := g.enter(sd, from, SourceGossip); err != nil {
		// Refused here (the table is full): not passed on, and no fault
		// of the peer that relayed it.
		return nil, fmt.Errorf("%w: %w", pubsub.ErrIgnore, err)
	}
	return nil, nil
}

// errNotAsked is a record of another peer in an answer that was to bring
// the answering peer's own record only.
var errNotAsked = errors.New("a record of another peer, where only the answering peer's own was asked for")

// accept opens a signed record from the network and enters it; with only
// set, a record of any other peer is refused (errNotAsked).
func (g *gossip) accept(data []byte, from peer.ID, src Source, only peer.ID) (bool, error) {
	id, signed := envelopeSigner(data)
	if signed && only != "" && id != only {
		return false, errNotAsked
	}
	if signed && g.table.Holds(id, data) {
		// The record held, byte for byte: a sync mostly returns what
		// gossip already brought, and checking each again would cost a
		// signature check per record per sync.
		return false, nil
	}
	sd, err := OpenNodeData(data, g.network)
	if err != nil {
		g.table.RejectVia(src, ReasonOf(err), from, err)
		return false, err
	}
	if only != "" && sd.Data.PeerID != only {
		return false, errNotAsked
	}
	return g.enter(sd, from, src)
}

// enter offers a verified record to the table and, when it is newer, keeps
// those of the addresses its peer signed at which the peer was observed, so
// that the host (and the DHT) may dial them. The others stay in the record
// only: a record is its signer's word, and the word of a peer nobody
// connected to must not make the node send packets to whatever address it
// names (see dialGuard, DialInfo).
func (g *gossip) enter(sd *SignedNodeData, from peer.ID, src Source) (bool, error) {
	ok, err := g.table.Offer(sd, from, src)
	if ok {
		if addrs, _ := g.guard.vouched(sd.Data.PeerID, sd.Data.Multiaddrs()); len(addrs) > 0 {
			g.host.Peerstore().AddAddrs(sd.Data.PeerID, addrs, g.ttl)
		}
	}
	return ok, err
}

// relay publishes a peer's verified record on gossip on its behalf. The
// record is marked relayed first, so that the peer's own gossip copy is not
// passed on a second time.
func (g *gossip) relay(ctx context.Context, sd *SignedNodeData) {
	g.table.Offer(sd, g.host.ID(), SourceGossip) // the same record again as gossip: marks it relayed
	if err := g.ann.Publish(ctx, sd.Envelope); err != nil && ctx.Err() == nil {
		g.log.WithField("peer", sd.Data.PeerID.String()).Debugf("relay nodedata: %v", err)
	}
}
