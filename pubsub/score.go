package pubsub

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	lpubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"
)

// ScoreParams are the gossipsub peer-score parameters of the NodeData topic.
// Only what tells a hostile peer from an honest one counts:
//
//   - invalid messages (P4): the count of announcements the verifier
//     rejected (forged, malformed, from a peer beyond its rate), squared,
//     weighs -10, the count decaying to a tenth in a minute: 4 rejections
//     take a peer below the gossip threshold, 8 below the publish one, 10
//     to the graylist threshold. An honest peer sends none: it verifies
//     what it passes on, and stays within its rate;
//   - behaviour (P7): gossipsub's own penalty for broken promises and
//     backoff violations.
//
// IP colocation (P6) is off: many honest nodes behind one address (one
// machine, one NAT) are normal here. Mesh delivery rates (P3) are off too:
// announcements are rare, and a quiet honest peer must not look bad.
func ScoreParams(topic string) *lpubsub.PeerScoreParams {
	return &lpubsub.PeerScoreParams{
		SkipAtomicValidation:      true,
		AppSpecificScore:          func(peer.ID) float64 { return 0 },
		BehaviourPenaltyWeight:    -1,
		BehaviourPenaltyThreshold: 6,
		BehaviourPenaltyDecay:     lpubsub.ScoreParameterDecay(time.Minute),
		DecayInterval:             time.Second,
		DecayToZero:               0.01,
		RetainScore:               10 * time.Minute,
		Topics: map[string]*lpubsub.TopicScoreParams{topic: {
			SkipAtomicValidation:           true,
			TopicWeight:                    1,
			TimeInMeshQuantum:              time.Second, // P1 is off (weight 0), but the quantum divides
			InvalidMessageDeliveriesWeight: -10,
			InvalidMessageDeliveriesDecay:  lpubsub.ScoreParameterDecay(time.Minute),
		}},
	}
}

// ScoreThresholds are the score thresholds of the NodeData topic (see
// ScoreParams): below -100 a peer gets no gossip, below -500 no own
// publications, below -1000 its messages are ignored.
func ScoreThresholds() *lpubsub.PeerScoreThresholds {
	return &lpubsub.PeerScoreThresholds{
		SkipAtomicValidation: true,
		GossipThreshold:      -100,
		PublishThreshold:     -500,
		GraylistThreshold:    -1000,
	}
}

// maxLimitedPeers bounds the peers with a token bucket of their own in
// a PeerBuckets; at the bound the buckets start afresh (a peer needs a
// connection to be one).
const maxLimitedPeers = 4096

// PeerBuckets is one token bucket per peer: what bounds the gossip a peer
// passes on, and, in node, its syncs and the newcomers it introduces.
type PeerBuckets struct {
	r     rate.Limit
	burst int
	mu    sync.Mutex
	by    map[peer.ID]*rate.Limiter
}

// NewPeerBuckets returns buckets of burst tokens refilled at r per peer;
// rate.Inf allows everything.
func NewPeerBuckets(r rate.Limit, burst int) *PeerBuckets {
	return &PeerBuckets{r: r, burst: burst, by: make(map[peer.ID]*rate.Limiter)}
}

// Allow takes one token from p's bucket.
func (l *PeerBuckets) Allow(p peer.ID) bool { return l.AllowN(p, 1) }

// inspect is a gossipsub RPC inspector that refuses an RPC whose published
// messages p's bucket cannot pay for, counting them in shed.
func (l *PeerBuckets) inspect(shed *atomic.Uint64) func(peer.ID, *lpubsub.RPC) error {
	return func(p peer.ID, rpc *lpubsub.RPC) error {
		n := len(rpc.GetPublish())
		if n == 0 || l.AllowN(p, n) {
			return nil
		}
		shed.Add(uint64(n))
		return fmt.Errorf("peer %s: %d messages beyond its rate", p, n)
	}
}

// inspectControl is a gossipsub RPC inspector that refuses an RPC whose
// control part (IHAVE, IWANT, GRAFT, PRUNE, IDONTWANT), decoded, is larger
// than limit. Gossipsub bounds it before decoding, on the raw bytes, by
// reading the fields it expects where it expects them; a field encoded
// otherwise than it reads can carry past that check what the decoder
// then takes, so that the decoded RPC, whose control gossipsub acts on,
// is what this one measures.
func inspectControl(limit int) func(peer.ID, *lpubsub.RPC) error {
	return func(p peer.ID, rpc *lpubsub.RPC) error {
		if rpc.Control == nil {
			return nil
		}
		if n := proto.Size(rpc.Control); n > limit {
			return fmt.Errorf("peer %s: control part of %d bytes, more than %d", p, n, limit)
		}
		return nil
	}
}

// AllowN takes n tokens from p's bucket, or none when it has fewer.
func (l *PeerBuckets) AllowN(p peer.ID, n int) bool {
	if l.r == rate.Inf {
		return true
	}
	l.mu.Lock()
	lim := l.by[p]
	if lim == nil {
		if len(l.by) >= maxLimitedPeers {
			clear(l.by)
		}
		lim = rate.NewLimiter(l.r, l.burst)
		l.by[p] = lim
	}
	l.mu.Unlock()
	return lim.AllowN(time.Now(), n)
}
