package protocol

import (
	"errors"
	"io"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// The client's pool of idle work streams: a call takes the stream to its
// peer used last and gives it back when its exchange went whole; an idle
// stream is watched, so that one the worker ended is not taken, and closed
// after the client's idle timeout.

// idleWatch is the read an idle stream's watch keeps pending, and its
// result, set before done is closed.
type idleWatch struct {
	done chan struct{}
	b    [1]byte
	n    int
	err  error
}

// watchDelay is how long a stream stays in the pool before it is watched.
const watchDelay = 10 * time.Millisecond

// take returns the most recently used idle stream to p, or nil.
func (c *Client) take(p peer.ID) *cstream {
	var broken []*cstream
	defer func() {
		for _, cs := range broken {
			c.discard(cs)
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	list := c.idle[p]
	for len(list) > 0 {
		cs := list[len(list)-1]
		list[len(list)-1] = nil
		list = list[:len(list)-1]
		cs.inPool = false
		// The call takes a pending watch over.
		cs.takeover, cs.watch = cs.watch, nil
		// A closed connection took the stream with it.
		if cs.dead.Load() || cs.str.Conn().IsClosed() {
			broken = append(broken, cs)
			continue
		}
		c.setIdle(p, list)
		return cs
	}
	c.setIdle(p, list)
	return nil
}

// setIdle stores p's idle streams. An empty list stays (its array serves
// the next put) until closeIdle finds it empty.
func (c *Client) setIdle(p peer.ID, list []*cstream) { c.idle[p] = list }

// closeIdleTo closes the idle streams to p and says how many there were.
func (c *Client) closeIdleTo(p peer.ID) int {
	c.mu.Lock()
	list := c.idle[p]
	delete(c.idle, p)
	for _, cs := range list {
		cs.inPool = false
	}
	c.mu.Unlock()
	for _, cs := range list {
		_ = cs.str.Close()
	}
	return len(list)
}

// put gives a stream whose exchange went well back to the pool, idle
// since now, or closes it when the pool is full, the client closed, or
// its reader ended.
func (c *Client) put(cs *cstream, now time.Time) {
	c.mu.Lock()
	list := c.idle[cs.p]
	if c.closed || cs.dead.Load() || len(list) >= c.cfg.maxIdle {
		c.mu.Unlock()
		_ = cs.str.Close() // its exchange is whole: the server sees the end of the stream
		return
	}
	cs.inPool, cs.idleSince = true, now
	c.idle[cs.p] = append(list, cs)
	if c.sweep == nil {
		c.sweep = time.AfterFunc(c.cfg.clientIdle, c.closeIdle)
	}
	// The watch timer is set when it is not running; when it fires on a
	// stream idle for less than watchDelay it is set for the rest
	// (watchIdle), so a stream in use again and again costs no timer each
	// time.
	if !cs.watchArmed {
		cs.watchArmed = true
		if cs.watchTimer == nil {
			cs.watchTimer = time.AfterFunc(watchDelay, func() { c.watchIdle(cs) })
		} else {
			cs.watchTimer.Reset(watchDelay)
		}
	}
	c.mu.Unlock()
}

// discard ends a stream that broke: Close when it ended at the server's
// FIN, so that the server sees the client's end (a draining server waits
// for it), Reset otherwise (the server cancels the work of a request it
// is running).
func (c *Client) discard(cs *cstream) {
	if cs.watchTimer != nil {
		cs.watchTimer.Stop()
	}
	if cs.eof.Load() {
		_ = cs.str.Close()
		return
	}
	_ = cs.str.Reset()
}

// closeIdle closes the streams idle for the client's idle timeout, and
// comes back while some are left.
func (c *Client) closeIdle() {
	var old []*cstream
	c.mu.Lock()
	now := time.Now()
	next := time.Duration(0)
	for p, list := range c.idle {
		i := 0
		for ; i < len(list); i++ { // oldest first
			if left := c.cfg.clientIdle - now.Sub(list[i].idleSince); left > 0 {
				if next == 0 || left < next {
					next = left
				}
				break
			}
			list[i].inPool = false
			old = append(old, list[i])
		}
		if list = slices.Delete(list, 0, i); len(list) == 0 {
			delete(c.idle, p)
		} else {
			c.idle[p] = list
		}
	}
	c.sweep = nil
	if next > 0 && !c.closed {
		c.sweep = time.AfterFunc(next, c.closeIdle)
	}
	c.mu.Unlock()
	for _, cs := range old {
		_ = cs.str.Close()
	}
}

// watchIdle starts the watch of a stream idle for watchDelay, on the
// timer's goroutine: a read that ends when the stream does, or when a
// byte nobody asked for comes in. A call that took the stream meanwhile
// leaves nothing to watch; one that takes it while the read is pending
// takes the read over (Read). The read is never abandoned: it ends with
// the stream, which every path ends.
func (c *Client) watchIdle(cs *cstream) {
	c.mu.Lock()
	cs.watchArmed = false
	if !cs.inPool || cs.watch != nil {
		c.mu.Unlock()
		return // in use: its next put sets the timer again
	}
	if left := watchDelay - time.Since(cs.idleSince); left > 0 {
		cs.watchArmed = true
		cs.watchTimer.Reset(left)
		c.mu.Unlock()
		return
	}
	w := &idleWatch{done: make(chan struct{})}
	cs.watch = w
	c.mu.Unlock()
	n, err := cs.str.Read(w.b[:])
	if errors.Is(err, io.EOF) {
		cs.eof.Store(true) // before the call that took it can see the result
	}
	c.mu.Lock()
	w.n, w.err = n, err
	// Not taken over, and still in the pool: the stream ended while idle,
	// and is this watch's to end. (One the client's Close or idle sweep
	// took out of the pool, that closed it, is done with.)
	mine := cs.watch == w && cs.inPool
	if cs.watch == w {
		cs.watch = nil
		cs.dead.Store(true)
	}
	if mine {
		cs.inPool = false
		list := c.idle[cs.p]
		if i := slices.Index(list, cs); i >= 0 {
			c.setIdle(cs.p, slices.Delete(list, i, i+1))
		}
	}
	c.mu.Unlock()
	close(w.done)
	if !mine {
		return
	}
	if n > 0 {
		_ = cs.str.Reset() // a frame nobody asked for
		return
	}
	c.discard(cs)
}
