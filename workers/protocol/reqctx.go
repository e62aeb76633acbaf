package protocol

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// requestCtx is the context a work server gives one request: it ends at
// the request's deadline, when the stream's request context (wstream.reqs)
// ends, or when the request is done with (wstream.finish), and behaves
// as context.WithDeadline(reqs, deadline) would:
//   - Deadline reports the deadline; Err is DeadlineExceeded once it has
//     passed, Canceled once reqs ended or the request was done with,
//     whichever came first.
//   - context.Cause finds the cause of reqs (a Ticket's Cancel, the stream
//     or the server ending); a passed deadline ends reqs too, with
//     DeadlineExceeded, so that the first cause is the one kept.
//   - Values are reqs'; contexts derived from it end with it (AfterFunc,
//     which the context package uses for them).
//
// What it saves over WithDeadline is the work of one on every request: it
// is one allocation, and its deadline is the stream's one timer, set
// again for each request (wstream.begin), not a timer and a link to reqs
// made and undone each time. A stream carries one request at a time.
type requestCtx struct {
	parent   context.Context // the stream's reqs
	deadline time.Time
	// endParent ends parent (its context.CancelCauseFunc) when the
	// deadline passes.
	endParent context.CancelCauseFunc

	done atomic.Value // chan struct{}, made by the first Done
	mu   sync.Mutex
	err  error
	// after holds what AfterFunc registered, run when the context ends.
	after  []afterEntry
	nextID uint64
}

type afterEntry struct {
	id uint64
	f  func()
}

// closedchan is the Done channel of a context that ended before anyone
// asked for it.
var closedchan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

func (r *requestCtx) Deadline() (time.Time, bool) { return r.deadline, true }

func (r *requestCtx) Done() <-chan struct{} {
	if d := r.done.Load(); d != nil {
		return d.(chan struct{})
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.done.Load()
	if d == nil {
		d = make(chan struct{})
		r.done.Store(d)
	}
	return d.(chan struct{})
}

func (r *requestCtx) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *requestCtx) Value(key any) any { return r.parent.Value(key) }

func (r *requestCtx) String() string { return "workmesh request context" }

// AfterFunc arranges for f to run once the context ends, at once if it
// has; stop undoes that, reporting whether it did before f ran. The
// context package calls it for a context derived from this one, so that
// no goroutine waits on Done for it; f runs on the goroutine that ends the
// context (context.AfterFunc still runs its function on one of its own).
func (r *requestCtx) AfterFunc(f func()) (stop func() bool) {
	r.mu.Lock()
	if r.err != nil {
		r.mu.Unlock()
		f()
		return func() bool { return false }
	}
	r.nextID++
	id := r.nextID
	r.after = append(r.after, afterEntry{id: id, f: f})
	r.mu.Unlock()
	return func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, a := range r.after {
			if a.id == id {
				r.after = append(r.after[:i], r.after[i+1:]...)
				return true
			}
		}
		return false
	}
}

// end ends the context with err unless it has ended already, and runs
// what AfterFunc registered.
func (r *requestCtx) end(err error) {
	r.mu.Lock()
	if r.err != nil {
		r.mu.Unlock()
		return
	}
	r.err = err
	if d, _ := r.done.Load().(chan struct{}); d != nil {
		close(d)
	} else {
		r.done.Store(closedchan)
	}
	after := r.after
	r.after = nil
	r.mu.Unlock()
	for _, a := range after {
		a.f()
	}
}

// begin returns the context of the stream's next request, which ends at
// deadline. finish ends it.
func (c *wstream) begin(deadline time.Time) *requestCtx {
	parent := c.requests()
	r := &requestCtx{parent: parent, deadline: deadline, endParent: c.endRequests}
	c.dmu.Lock()
	c.cur = r
	c.dmu.Unlock()
	if parent.Err() != nil {
		r.end(context.Canceled)
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
func (c *wstream) finish(r *requestCtx) {
	c.deadline.Stop()
	c.dmu.Lock()
	c.cur = nil
	c.dmu.Unlock()
	r.end(context.Canceled)
}

// deadlinePassed runs when the stream's deadline timer fires: it ends the
// running request's context, and the stream's request context with it,
// if that request's deadline has passed (the timer may fire late, for a
// request done with meanwhile).
func (c *wstream) deadlinePassed() {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if r := c.cur; r != nil && !time.Now().Before(r.deadline) {
		r.end(context.DeadlineExceeded)
		r.endParent(context.DeadlineExceeded)
	}
}

// endCurrent ends the running request's context, once the stream's
// request context or the stream's own has ended.
func (c *wstream) endCurrent() {
	c.dmu.Lock()
	r := c.cur
	c.dmu.Unlock()
	if r != nil {
		r.end(context.Canceled)
	}
}
