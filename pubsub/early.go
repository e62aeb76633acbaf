package pubsub

import (
	"context"
	"slices"

	lpubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// earlyQueue bounds the peers waiting for earlyLoop; beyond it a peer
// gets its send queue when its identify completes, as without earlyQueues.
const earlyQueue = 256

// earlyQueues is the subscription filter. It keeps peers' subscriptions
// to the network's topic only (and to those of WithTopics: a peer cannot
// make gossipsub track topics nobody here uses; they are known before the
// first peer's subscriptions come, which name every topic the peer is in
// once, on connecting), and it closes a gap of gossipsub's: a
// peer's subscription arrives on the peer's own stream, as soon as the
// peer has identified this node, while this node makes its send queue to
// the peer only once it has identified the peer in turn. In between,
// gossipsub counts the peer in the topic but has no queue for it, and
// every message it would send there (its own announcements, and every
// message it forwards, since a peer it has not added yet looks like a
// floodsub peer) is dropped ("no send queue"). On a loaded node that gap
// lasts seconds and, while a network forms, costs thousands of messages
// (see Dropped). So a peer that subscribes before this node has a stream
// to it is announced to gossipsub at once as speaking the protocol it
// opened its stream with (earlyLoop): gossipsub makes the queue then, and
// messages wait in it until the stream is open instead of being dropped.
type earlyQueues struct {
	a      *Announcer
	topics map[string]bool // read only
}

func newEarlyQueues(a *Announcer, topics []string) earlyQueues {
	f := earlyQueues{a: a, topics: make(map[string]bool, len(topics))}
	for _, t := range topics {
		f.topics[t] = true
	}
	return f
}

func (f earlyQueues) CanSubscribe(topic string) bool { return f.topics[topic] }

// FilterIncomingSubscriptions runs on gossipsub's event loop: it never
// blocks.
func (f earlyQueues) FilterIncomingSubscriptions(from peer.ID, subs []*pb.RPC_SubOpts) ([]*pb.RPC_SubOpts, error) {
	kept := subs[:0:0]
	subscribes := false
	for _, s := range subs {
		if !f.topics[s.GetTopicid()] {
			continue
		}
		kept = append(kept, s)
		subscribes = subscribes || s.GetSubscribe()
	}
	if subscribes && !f.a.HasStream(from) {
		select {
		case f.a.early <- from:
		default: // its identify gives it a queue, as before
		}
	}
	return kept, nil
}

// requeue asks earlyLoop to have gossipsub make a send queue to p, which
// it counts in the topic but has none for (a message to p was just
// dropped for that): from its subscription until its queue, or when its
// queue went with a stream that closed while the peer stayed. It never
// blocks (DropRPC runs on gossipsub's event loop).
func (a *Announcer) requeue(p peer.ID) {
	if a.early == nil {
		return
	}
	select {
	case a.early <- p:
	default:
	}
}

// earlyLoop tells gossipsub, for each peer earlyQueues passed on, that the
// peer speaks the gossipsub protocol of the stream it opened to this node,
// which makes gossipsub give it a send queue now (see earlyQueues).
func (a *Announcer) earlyLoop(ctx context.Context, h host.Host) {
	defer a.wg.Done()
	for {
		var p peer.ID
		select {
		case <-ctx.Done():
			return
		case p = <-a.early:
		}
		if proto, ok := inboundProtocol(h, p, lpubsub.GossipSubDefaultProtocols); ok && !a.HasStream(p) {
			if err := a.emitter.Emit(event.EvtPeerProtocolsUpdated{Peer: p, Added: []protocol.ID{proto}}); err != nil {
				return // the event bus is closing
			}
		}
	}
}

// inboundProtocol returns the protocol, one of want, of a stream p opened
// to this host.
func inboundProtocol(h host.Host, p peer.ID, want []protocol.ID) (protocol.ID, bool) {
	for _, c := range h.Network().ConnsToPeer(p) {
		for _, s := range c.GetStreams() {
			if s.Stat().Direction == network.DirInbound && slices.Contains(want, s.Protocol()) {
				return s.Protocol(), true
			}
		}
	}
	return "", false
}

// queuelessFeatures is gossipsub's feature test, except for a peer
// gossipsub counts in a topic but has no send queue for yet, whose
// protocol it does not know (""): the default test takes such a peer for
// a floodsub peer, and gossipsub forwards it every message it relays, each
// then dropped for want of a queue ("no send queue", see DroppedNoStream).
// Here it is a mesh peer, one outside this node's mesh until it has a
// queue, which is sent nothing but this node's own publications (flood
// publishing): what a gossipsub peer outside the mesh is sent. The peer
// filter (HasStream) keeps it out of what gossipsub picks peers from
// (grafts, fanout) until its stream is open, as the floodsub test did
// until its queue was made.
func queuelessFeatures(f lpubsub.GossipSubFeature, proto protocol.ID) bool {
	if proto == "" {
		return f == lpubsub.GossipSubFeatureMesh
	}
	return lpubsub.GossipSubDefaultFeatures(f, proto)
}
