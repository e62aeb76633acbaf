package protocol

import (
	"context"
	"time"

	"github.com/workmesh/workmesh/workers/reqctx"
)

// A request's context on the work server is a reqctx.Ctx whose parent is
// the stream's request context (wstream.reqs), ended as
// context.WithDeadline(reqs, deadline) would be: at the deadline by the
// stream's one timer, and with reqs by the
// stream's hooks (its cancelRequests, and contextEnded). A stream carries
// one request at a time.

// begin returns the context of the stream's next request, which ends at
// deadline. finish ends it.
func (c *wstream) begin(deadline time.Time) *reqctx.Ctx {
	parent := c.requests()
	r := reqctx.New(parent, deadline)
	c.dmu.Lock()
	c.cur, c.curEndParent = r, c.endRequests
	// The timer is set only when it would fire after this deadline, or
	// not at all: one request after another on the stream, each with its
	// deadline seconds away, costs it nothing (deadlinePassed sets it
	// again for the request running when it fires early).
	switch {
	case c.deadline == nil:
		c.deadline = time.AfterFunc(time.Until(deadline), c.deadlinePassed)
		c.deadlineAt = deadline
	case c.deadlineAt.IsZero() || deadline.Before(c.deadlineAt):
		c.deadline.Reset(time.Until(deadline))
		c.deadlineAt = deadline
	}
	c.dmu.Unlock()
	if parent.Err() != nil {
		r.End(context.Canceled)
	}
	return r
}

// finish ends the context of a request that is done with, as the cancel
// of WithDeadline would. The timer stays set, for a request to come.
func (c *wstream) finish(r *reqctx.Ctx) {
	c.dmu.Lock()
	c.cur, c.curEndParent = nil, nil
	c.dmu.Unlock()
	r.End(context.Canceled)
}

// deadlinePassed runs when the stream's deadline timer fires. It ends the
// running request's context, and the stream's request context with it
// (so that DeadlineExceeded stays the cause), once that request's
// deadline has passed; it sets the timer again for a request whose
// deadline is still to come (the timer was set for an earlier one), and
// leaves it for a stream between requests.
func (c *wstream) deadlinePassed() {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	c.deadlineAt = time.Time{}
	r := c.cur
	if r == nil {
		return
	}
	dl, _ := r.Deadline()
	if wait := time.Until(dl); wait > 0 {
		c.deadline.Reset(wait)
		c.deadlineAt = dl
		return
	}
	// The parent first: r's cause is its parent's, and a Ticket's Cancel
	// coming as the deadline passes must not be the one it keeps.
	c.curEndParent(context.DeadlineExceeded)
	r.End(context.DeadlineExceeded)
}

// stopDeadline stops the deadline timer of a stream done with.
func (c *wstream) stopDeadline() {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if c.deadline != nil {
		c.deadline.Stop()
		c.deadlineAt = time.Time{}
	}
}

// endCurrent ends the running request's context, once the stream's
// request context or the stream's own has ended.
func (c *wstream) endCurrent() {
	c.dmu.Lock()
	r := c.cur
	c.dmu.Unlock()
	if r != nil {
		r.End(context.Canceled)
	}
}
