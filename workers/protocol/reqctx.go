package protocol

import (
	"context"
	"time"

	"github.com/workmesh/workmesh/workers/reqctx"
)

// A request's context on the work server is a reqctx.Ctx whose parent is
// the stream's request context (wstream.reqs), ended as
// context.WithDeadline(reqs, deadline) would be: at the deadline by the
// stream's one timer, set again for each request, and with reqs by the
// stream's hooks (its cancelRequests, and contextEnded). A stream carries
// one request at a time.

// begin returns the context of the stream's next request, which ends at
// deadline. finish ends it.
func (c *wstream) begin(deadline time.Time) *reqctx.Ctx {
	parent := c.requests()
	r := reqctx.New(parent, deadline)
	c.dmu.Lock()
	c.cur, c.curEndParent = r, c.endRequests
	c.dmu.Unlock()
	if parent.Err() != nil {
		r.End(context.Canceled)
	}
	if wait := time.Until(deadline); c.deadline == nil {
		c.deadline = time.AfterFunc(wait, c.deadlinePassed)
	} else {
		c.deadline.Reset(wait)
	}
	return r
}

// finish ends the context of a request that is done with, as the cancel
// of WithDeadline would.
func (c *wstream) finish(r *reqctx.Ctx) {
	c.deadline.Stop()
	c.dmu.Lock()
	c.cur, c.curEndParent = nil, nil
	c.dmu.Unlock()
	r.End(context.Canceled)
}

// deadlinePassed runs when the stream's deadline timer fires: it ends the
// running request's context, and the stream's request context with it
// (so that DeadlineExceeded stays the cause), if that request's deadline
// has passed (the timer may fire late, for a request done with meanwhile).
func (c *wstream) deadlinePassed() {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if r := c.cur; r != nil {
		if dl, _ := r.Deadline(); !time.Now().Before(dl) {
			r.End(context.DeadlineExceeded)
			c.curEndParent(context.DeadlineExceeded)
		}
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
