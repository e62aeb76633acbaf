package protocol

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/workmesh/workmesh/node/frame"
	"github.com/workmesh/workmesh/workers/pool"
)

// The grace period of a request and the watchdog that takes over when the
// work outlasts it (execute): the accept frame, and a read that notices
// the client's reset while the work runs.

// arm starts the grace period of the request whose ticket is t. The
// grace timer is the stream's and is not stopped when a request ends in
// time: set while it is not pending (or pending for later than this
// grace period ends), it checks when it fires whether a request has
// outlasted its grace period and otherwise is set for the rest of the
// running one's (fire). So work done within the grace period allocates
// no watchdog, and a stream carrying request after request costs a timer
// change about once a grace period instead of two per request.
func (c *wstream) arm(t *pool.Ticket, accept bool, grace time.Duration) {
	c.ticket.Store(t)
	c.accept.Store(accept)
	// Read now, not taken from the request's arrival: the timer fires
	// grace from now, and timerAt must not say sooner.
	at := time.Now().Add(grace)
	c.gmu.Lock()
	defer c.gmu.Unlock()
	c.graceAt, c.running = at, true
	switch {
	case c.grace == nil:
		c.fired = make(chan *watchdog, 1)
		c.grace = time.AfterFunc(grace, c.fire)
	case c.timerAt.IsZero() || at.Before(c.timerAt):
		c.grace.Reset(grace)
	default:
		return // pending, and firing before at
	}
	c.timerAt = at
}

// disarm ends the running request's grace period. It reports false when
// the period ran out first: then the watchdog fire started is on c.fired.
func (c *wstream) disarm() bool {
	c.gmu.Lock()
	defer c.gmu.Unlock()
	expired := c.expired
	c.running, c.expired = false, false
	return !expired
}

// stopGrace stops the grace timer of a stream done with.
func (c *wstream) stopGrace() {
	c.gmu.Lock()
	defer c.gmu.Unlock()
	if c.grace != nil {
		c.grace.Stop()
		c.timerAt = time.Time{}
	}
}

// fire runs when the grace timer fires. With no request running it does
// nothing (the next arm sets the timer); with one whose grace period has
// not run out it sets the timer for the rest; otherwise it starts the
// request's watchdog, which execute takes from c.fired.
func (c *wstream) fire() {
	c.gmu.Lock()
	c.timerAt = time.Time{}
	if !c.running || c.expired {
		c.gmu.Unlock()
		return
	}
	if wait := time.Until(c.graceAt); wait > 0 {
		c.grace.Reset(wait)
		c.timerAt = c.graceAt
		c.gmu.Unlock()
		return
	}
	c.expired = true
	w := &watchdog{str: c.str, ticket: c.ticket.Load(), accept: c.accept.Load(), wrote: make(chan struct{}), done: make(chan struct{})}
	c.gmu.Unlock()
	c.fired <- w
	w.run()
}

// The states of a watchdog.
const (
	watchWatching  int32 = iota
	watchTakenOver       // the work is done: the read's result is the stream's
	watchEnded           // the read (or the accept frame's write) ended first
)

// watchdog watches a request's stream while its work runs. It is started
// by a timer; when the work is done, the stream's goroutine takes it over
// (takeOver), after its accept frame is written so that it always goes
// before the response.
type watchdog struct {
	str    network.Stream
	ticket *pool.Ticket // the work: its context is cancelled through it
	accept bool
	state  atomic.Int32
	wrote  chan struct{} // closed once the accept frame is written, or failed
	done   chan struct{} // closed once the read returned
	// The read's result, set before done is closed.
	b   [1]byte
	n   int
	err error
}

func (w *watchdog) run() {
	defer close(w.done)
	if w.accept {
		var accept [frame.HeaderLen + 1]byte
		if _, err := w.str.Write(appendAccept(accept[:0])); err != nil {
			w.err = err
			if w.state.CompareAndSwap(watchWatching, watchEnded) {
				w.ticket.Cancel(fmt.Errorf("%w: write accept frame: %v", ErrClientGone, err))
			}
			close(w.wrote)
			return
		}
	}
	close(w.wrote)
	// The client keeps its write side open while it waits and sends its
	// next request only once it has the response, so before the work is
	// done this read ends only with an error: its reset or a lost
	// connection. After, it is the first byte of the next request or the
	// client's end of the stream.
	w.n, w.err = w.str.Read(w.b[:])
	if !w.state.CompareAndSwap(watchWatching, watchEnded) {
		return // taken over: the result is the stream's next read
	}
	switch {
	case w.n > 0:
		w.ticket.Cancel(fmt.Errorf("unexpected bytes after the request: %w", ErrMalformed))
	case w.err != nil && !errors.Is(w.err, io.EOF):
		w.ticket.Cancel(fmt.Errorf("%w: %v", ErrClientGone, w.err))
	}
}

// takeOver waits for the accept frame to be written, then takes the
// pending read over for the stream; if the read has ended already, it
// waits until run has acted on it (the ticket's cause says how).
func (w *watchdog) takeOver() {
	<-w.wrote
	if !w.state.CompareAndSwap(watchWatching, watchTakenOver) {
		<-w.done
	}
}
