package protocol

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

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
	all    waitList
	byPeer map[peer.ID]*waitList
	closed atomic.Uint64 // streams closed for a bound
}

// The lists a waiting stream is on: of all streams, of its peer's.
const (
	onAll = iota
	onPeer
)

// waitingPlace is where a stream is in a waitingSet, guarded by its mu:
// its neighbours on each list (the lists are linked through the streams,
// so that waiting costs no allocation).
type waitingPlace struct {
	in         bool
	prev, next [2]*wstream
}

// waitList is a list of waiting streams, oldest first, linked through
// their waitingPlace's links of one kind (onAll or onPeer).
type waitList struct {
	head, tail *wstream
	n          int
}

func (l *waitList) push(c *wstream, k int) {
	c.waiting.prev[k], c.waiting.next[k] = l.tail, nil
	if l.tail != nil {
		l.tail.waiting.next[k] = c
	} else {
		l.head = c
	}
	l.tail = c
	l.n++
}

func (l *waitList) remove(c *wstream, k int) {
	p, n := c.waiting.prev[k], c.waiting.next[k]
	if p != nil {
		p.waiting.next[k] = n
	} else {
		l.head = n
	}
	if n != nil {
		n.waiting.prev[k] = p
	} else {
		l.tail = p
	}
	c.waiting.prev[k], c.waiting.next[k] = nil, nil
	l.n--
}

func newWaitingSet(lim bounds) *waitingSet {
	return &waitingSet{lim: lim, byPeer: map[peer.ID]*waitList{}}
}

// enter adds c, which is about to wait for a request, and takes out and
// returns the streams that have waited longest beyond the bounds, for
// close.
func (w *waitingSet) enter(c *wstream) (over []*wstream) {
	w.mu.Lock()
	pl := w.byPeer[c.peer]
	if pl == nil {
		pl = &waitList{}
		w.byPeer[c.peer] = pl
	}
	w.all.push(c, onAll)
	pl.push(c, onPeer)
	c.waiting.in = true
	for pl.n > w.lim.perPeer {
		over = append(over, w.removeLocked(pl.head))
	}
	for w.all.n > w.lim.total {
		over = append(over, w.removeLocked(w.all.head))
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
	if c.waiting.in {
		w.removeLocked(c)
	}
	w.mu.Unlock()
}

func (w *waitingSet) removeLocked(c *wstream) *wstream {
	w.all.remove(c, onAll)
	pl := w.byPeer[c.peer]
	pl.remove(c, onPeer)
	if pl.n == 0 {
		delete(w.byPeer, c.peer)
	}
	c.waiting.in = false
	return c
}

// counts returns the streams waiting, and those closed for a bound so far.
func (w *waitingSet) counts() (waiting int, closed uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.n, w.closed.Load()
}

// A stream between requests: waiting for the next one (next), ended by
// the idle timeout (idleCheck) or the bounds and the server (endIdle).

// next waits for the first byte of the stream's next request (its first
// one when fresh), which serveOne then reads on. While it waits the stream
// is idle: it holds no work slot, counts as no incomplete request and is
// not being served for Drain; it is one of the streams waiting, the one
// that waited longest of which the server closes beyond their bounds
// (WithWaitingLimits). It reports false when the stream ended instead:
// the client closed it (or broke it), or the server ended it, by the idle
// timeout (the read timeout for a fresh stream), for the bounds (Close:
// the client learns that no request of its was taken) or because the
// server is closing.
func (s *Server) next(c *wstream, fresh bool) bool {
	c.idleFrom.Store(time.Now().UnixNano()) // before the state says idle (idleCheck)
	c.state.Store(streamIdle)
	if s.ctx.Err() != nil {
		c.endIdle()
		return false
	}
	if over := s.waiting.enter(c); len(over) > 0 {
		// Closed on a goroutine of their own: a close can wait for the
		// transport (a peer that stopped reading), and this stream's
		// request is not theirs to wait for. The handler's count in wg
		// keeps Close waiting for it too.
		s.wg.Go(func() { s.waiting.close(over) })
	}
	defer s.waiting.leave(c)
	// The idle timeout is a timer of the stream's, not a read deadline: a
	// read that blocks with a deadline set costs the transport a timer of
	// its own every time (QUIC's does). It is set once and checks, when
	// it fires, how long the stream has been idle (idleCheck), so a
	// stream that carries request after request costs no timer at all.
	// On a stream idle for the timeout, endIdle closes it, which ends the
	// read.
	switch {
	case fresh:
		// A new stream: its first request is due within the read
		// timeout, and no timer of the stream's is set yet.
		_ = c.str.SetDeadline(time.Now().Add(s.cfg.readTimeout))
	case c.idle == nil:
		_ = c.str.SetDeadline(time.Time{})
		c.idleTimeout = s.cfg.idleTimeout
		c.idle = time.AfterFunc(c.idleTimeout, c.idleCheck)
	default:
		_ = c.str.SetDeadline(time.Time{})
	}
	var n int
	var err error
	if w := c.watch; w != nil {
		// The watchdog's read, pending since the last request outlasted
		// its grace period, is this one.
		c.watch = nil
		<-w.done
		n, err, c.first[0] = w.n, w.err, w.b[0]
	} else {
		n, err = c.str.Read(c.first[:])
	}
	if !c.state.CompareAndSwap(streamIdle, streamBusy) {
		return false // endIdle ended it (the idle timeout, the bounds, or the server closing); whatever arrived is not taken
	}
	if n == 0 && fresh {
		s.noRequest(c, err)
		return false
	}
	if n == 0 {
		switch {
		case errors.Is(err, io.EOF):
			_ = c.str.Close() // the client is done with it
		default:
			_ = c.str.Reset()
			s.cfg.log.WithField("peer", c.peer).Debugf("idle work stream ended: %v", err)
		}
		return false
	}
	c.pending = true
	if !fresh {
		// A fresh stream's request keeps the deadline it got on arrival:
		// the whole of it is due within the read timeout.
		_ = c.str.SetDeadline(time.Now().Add(s.cfg.readTimeout))
	}
	return true
}

// noRequest ends a fresh stream that ended, or passed its read timeout,
// before the first byte of a request: reset, counted as malformed and
// observed as a request that could not be read.
func (s *Server) noRequest(c *wstream, err error) {
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("stream closed before a request: %w", ErrTruncated)
	}
	_ = c.str.Reset()
	s.malformed.Add(1)
	sr := ServedRequest{Peer: c.peer, Err: fmt.Errorf("read request: %w", err),
		Duration: time.Since(time.Unix(0, c.idleFrom.Load()))}
	s.cfg.log.WithField("peer", sr.Peer).Debugf("work stream ended without a response: %v", sr.Err)
	if s.cfg.observe != nil {
		s.cfg.observe(sr)
	}
}

// idleCheck runs when the stream's idle timer fires: it ends a stream that
// has waited for a request for the whole idle timeout, and otherwise sets
// the timer again for when it would have.
func (c *wstream) idleCheck() {
	if c.ended.Load() {
		return
	}
	wait := c.idleTimeout
	if c.state.Load() == streamIdle {
		if wait -= time.Since(time.Unix(0, c.idleFrom.Load())); wait <= 0 {
			c.endIdle()
			return
		}
	}
	c.idle.Reset(wait)
}

// contextEnded ends the stream once its context has ended (the server
// is closing): at once if it is waiting for a request, or else the
// request running, whose response then ends it.
func (c *wstream) contextEnded() {
	c.endIdle()
	c.endCurrent()
}

// endIdle ends the stream if it is waiting for a request: the server is
// closing, the stream has been idle for the idle timeout, or it is beyond
// the bounds on waiting streams. A stream carrying a request ends after
// its response (next).
func (c *wstream) endIdle() { c.closeIfIdle() }

// closeIfIdle is endIdle, reporting whether it ended the stream.
func (c *wstream) closeIfIdle() bool {
	if c.state.CompareAndSwap(streamIdle, streamEnded) {
		_ = c.str.Close()
		return true
	}
	return false
}
