package protocol

import (
	"container/list"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Defaults of the bound on streams waiting for a request
// (WithWaitingLimits).
const (
	// DefaultWaitingTotal bounds the streams, over all peers, that wait
	// for a request: new ones for their first, kept ones for their next.
	// Twenty dispatchers keeping their 32 idle streams each fit.
	DefaultWaitingTotal = 1024
	// DefaultWaitingPerPeer bounds them for one peer: a dispatcher's 32
	// idle streams (DefaultMaxIdleStreams) and the new streams of a burst
	// of a hundred requests at once, each waiting a moment for its first
	// byte (at 64, bursts of 150 callers from one peer had 400-1,000 of
	// their streams closed and opened again); half of the 256 streams one
	// QUIC connection may open.
	DefaultWaitingPerPeer = 128
)

// WithWaitingLimits bounds the streams that wait for a request, a new
// stream for its first and a kept one for its next: total over all peers,
// perPeer for one peer (defaults DefaultWaitingTotal and
// DefaultWaitingPerPeer). A stream that waits costs nothing to the peer
// that holds it open and a stream of the host's limits to the server, so
// that, unbounded, a few identities holding streams open took every work
// stream the host allows, and no one could send work at all. Beyond a
// bound, the stream that has waited longest (the peer's, or of all) is
// closed. Its client finds it closed where the response should begin,
// knows the request was not taken, and sends it once more on a new stream
// (Client.Do). A server option.
func WithWaitingLimits(total, perPeer int) Option {
	return func(c *settings) (err error) {
		c.waiting, err = newBounds("waiting stream", total, perPeer)
		return err
	}
}

// waitingSet holds a server's streams that wait for a request, oldest
// first, over all peers and per peer.
type waitingSet struct {
	lim bounds

	mu     sync.Mutex
	all    list.List // of *wstream
	byPeer map[peer.ID]*list.List
	closed atomic.Uint64 // streams closed for a bound
}

// waitingPlace is where a stream is in a waitingSet, guarded by its mu.
type waitingPlace struct {
	all, peer *list.Element
}

func newWaitingSet(lim bounds) *waitingSet {
	return &waitingSet{lim: lim, byPeer: map[peer.ID]*list.List{}}
}

// enter adds c, which is about to wait for a request, and takes out and
// returns the streams that have waited longest beyond the bounds, for
// close.
func (w *waitingSet) enter(c *wstream) (over []*wstream) {
	w.mu.Lock()
	pl := w.byPeer[c.peer]
	if pl == nil {
		pl = list.New()
		w.byPeer[c.peer] = pl
	}
	c.waiting.all, c.waiting.peer = w.all.PushBack(c), pl.PushBack(c)
	for pl.Len() > w.lim.perPeer {
		over = append(over, w.removeLocked(pl.Front().Value.(*wstream)))
	}
	for w.all.Len() > w.lim.total {
		over = append(over, w.removeLocked(w.all.Front().Value.(*wstream)))
	}
	w.mu.Unlock()
	return over
}

// close ends the streams enter took out that still wait (one that took
// a request meanwhile is left alone), counting them.
func (w *waitingSet) close(over []*wstream) {
	for _, o := range over {
		if o.closeIfIdle() {
			w.closed.Add(1)
		}
	}
}

// leave removes c, which no longer waits (a request came in, or the stream
// ended); it may have been removed already.
func (w *waitingSet) leave(c *wstream) {
	w.mu.Lock()
	if c.waiting.all != nil {
		w.removeLocked(c)
	}
	w.mu.Unlock()
}

func (w *waitingSet) removeLocked(c *wstream) *wstream {
	w.all.Remove(c.waiting.all)
	pl := w.byPeer[c.peer]
	pl.Remove(c.waiting.peer)
	if pl.Len() == 0 {
		delete(w.byPeer, c.peer)
	}
	c.waiting = waitingPlace{}
	return c
}

// counts returns the streams waiting, and those closed for a bound so far.
func (w *waitingSet) counts() (waiting int, closed uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.Len(), w.closed.Load()
}
