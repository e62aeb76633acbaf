package pubsub

import (
	"sync"
	"time"

	lpubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// streamTracer tells the Announcer when gossipsub's outbound stream to a
// peer opens and closes, and counts the messages gossipsub drops because a
// queue is full. The other events are no-ops.
type streamTracer struct{ a *Announcer }

func (t streamTracer) OnNewOutboundStream(p peer.ID, _ protocol.ID) {
	t.a.update(p, func(st *peerState) { st.outbound = true })
}
func (t streamTracer) OnClosedOutboundStream(p peer.ID) {
	t.a.update(p, func(st *peerState) { st.outbound = false })
}
func (streamTracer) Join(string)                          {}
func (streamTracer) Leave(string)                         {}
func (streamTracer) Graft(peer.ID, string)                {}
func (streamTracer) Prune(peer.ID, string)                {}
func (t streamTracer) ValidateMessage(m *lpubsub.Message) { t.a.waiting.release(m) }
func (streamTracer) DeliverMessage(*lpubsub.Message)      {}
func (t streamTracer) RejectMessage(m *lpubsub.Message, reason string) {
	t.a.waiting.release(m)
	if reason == lpubsub.RejectValidationQueueFull || reason == lpubsub.RejectValidationThrottled {
		t.a.droppedValidation.Add(1)
	}
}
func (t streamTracer) DuplicateMessage(m *lpubsub.Message)                 { t.a.waiting.release(m) }
func (streamTracer) ThrottlePeer(peer.ID)                                  {}
func (streamTracer) RecvRPC(*lpubsub.RPC)                                  {}
func (streamTracer) SendRPC(*lpubsub.RPC, peer.ID)                         {}
func (streamTracer) SendRPCCompleted(*lpubsub.RPC, peer.ID, time.Duration) {}
func (t streamTracer) DropRPC(rpc *lpubsub.RPC, p peer.ID) {
	n := uint64(len(rpc.GetPublish()))
	if n == 0 {
		return
	}
	if !t.a.HasStream(p) {
		t.a.requeue(p)
		own := uint64(0)
		for _, m := range rpc.GetPublish() {
			if t.a.own.has(MessageID(m.GetData())) {
				own++
			}
		}
		if own > 0 {
			t.a.leftOut.Add(own)
			t.a.update(p, func(st *peerState) { st.missed = true })
		}
		n -= own
		t.a.droppedNoStream.Add(n)
	}
	t.a.droppedOutbound.Add(n)
}
func (streamTracer) UndeliverableMessage(*lpubsub.Message) {}

// Dropped returns how many messages gossipsub dropped under load:
// received messages it had no room to check (the validation queue full,
// or validateConcurrency checks running), and messages it did not send to
// a peer (its outbound queue full, or no queue yet: see DroppedNoStream).
// Both are lost to that node or peer, unless a duplicate, a sync or the
// next announcement brings the record again.
func (a *Announcer) Dropped() (validation, outbound uint64) {
	return a.droppedValidation.Load(), a.droppedOutbound.Load()
}

// DroppedNoStream returns how many of the outbound drops (Dropped) were
// for a peer this node had no gossip stream to yet: gossipsub counted it
// in the topic (its subscription had come) but had no queue for it (see
// earlyQueues), or it had just gone. The rest were for a full queue.
// Forwards to a peer without a queue are not sent at all
// (queuelessFeatures): gossipsub would send a gossipsub peer outside its
// mesh none, and used to take a peer it has no queue for for a floodsub
// peer, sent every one. This node's own publications are not counted here
// but in LeftOut. A drop for a peer gossipsub has no queue for has the node
// make one (requeue): gossipsub makes none again by itself for a peer
// whose first stream failed to open while it stays subscribed and
// connected.
func (a *Announcer) DroppedNoStream() uint64 { return a.droppedNoStream.Load() }

// LeftOut returns how many of this node's own publications (its record, a
// revocation, a record it relays on a newcomer's behalf) gossipsub had no
// send queue to put in for a topic peer: it floods them to every peer it
// counts in the topic, and counts a peer from its subscription on, which
// arrives on the peer's own stream, before this node has a queue to the
// peer (earlyQueues) or after the peer's first stream from this node
// failed to open; or the peer had just gone. Such a peer is marked missed
// and has its queue made (requeue), and its greeting, once the stream
// opens, says it missed a publication (WithPeerJoin): the node pushes its
// record to it then (node's onPeerJoin), where the message was lost to the
// peer before. They are not drops (Dropped) for that reason. The push
// carries the node's own record only: a revocation or a relayed record the
// peer missed so reaches it through its mesh or a sync, as before.
func (a *Announcer) LeftOut() uint64 { return a.leftOut.Load() }

// recent is a bounded set of the message IDs published last.
type recent struct {
	mu   sync.Mutex
	ids  map[string]struct{}
	ring [recentIDs]string
	next int
}

// recentIDs bounds recent.
const recentIDs = 256

func (r *recent) add(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil {
		r.ids = make(map[string]struct{}, recentIDs)
	}
	if _, ok := r.ids[id]; ok {
		return
	}
	delete(r.ids, r.ring[r.next])
	r.ring[r.next] = id
	r.ids[id] = struct{}{}
	r.next = (r.next + 1) % recentIDs
}

func (r *recent) has(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.ids[id]
	return ok
}
