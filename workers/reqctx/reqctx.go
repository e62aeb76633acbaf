package reqctx

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Ctx is one request's context. The zero value is not usable: make one
// with New or WithDeadline.
type Ctx struct {
	parent   context.Context
	deadline time.Time

	done atomic.Value // chan struct{}, made by the first Done
	mu   sync.Mutex
	err  error
	// after holds what AfterFunc registered; watch is what Watch set.
	// Both run, on the goroutine that ends the context, once it ends.
	after  []afterEntry
	nextID uint64
	watch  func()

	// Set by WithDeadline: its link (timer and parent's hook), and the
	// function that undoes the hook. Only the owner, which calls
	// WithDeadline and Stop, touches them.
	link       *link
	stopParent func() bool
}

// link is what a context WithDeadline makes needs to end on its own: its
// timer and the functions the timer and the parent's end run, which end
// the context link points to. Stop gives it back for the next context
// when neither function has run or can run, so that a request spends no
// allocation on them (a timer, and two functions bound to the context).
type link struct {
	c        atomic.Pointer[Ctx]
	timer    *time.Timer // made at the first use with a deadline of its own
	armed    bool        // the timer was set for the context served now
	expire   func()
	parentFn func()
}

// links holds the links Stop gave back.
var links = sync.Pool{New: func() any {
	l := &link{}
	l.expire = func() {
		if c := l.c.Load(); c != nil {
			c.End(context.DeadlineExceeded)
		}
	}
	l.parentFn = func() {
		if c := l.c.Load(); c != nil {
			c.End(c.parent.Err())
		}
	}
	return l
}}

// linkTo returns c's link, taking one for it first.
func (c *Ctx) linkTo() *link {
	if c.link == nil {
		c.link = links.Get().(*link)
		c.link.c.Store(c)
	}
	return c.link
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

// New returns a request context with parent's values and the given
// deadline that ends only when End is called: the caller ends it at the
// deadline and when parent ends (the work server does, with a timer and a
// hook of the stream's).
func New(parent context.Context, deadline time.Time) *Ctx {
	return &Ctx{parent: parent, deadline: deadline}
}

// WithDeadline returns a request context that ends at deadline (or at
// parent's, when that is earlier) or when parent ends, as
// context.WithDeadline's would; Stop ends it when the request is done
// with, as WithDeadline's cancel would. It ends after parent on a
// goroutine of its own, as context.AfterFunc runs: a moment after parent's
// cancel returns, not within it.
//
// The one difference from context.WithDeadline: once the context has
// ended by its deadline or Stop, a cause parent is cancelled with
// afterwards is what context.Cause reports, where WithDeadline's would
// keep reporting DeadlineExceeded or Canceled (Err is unchanged).
func WithDeadline(parent context.Context, deadline time.Time) *Ctx {
	c := &Ctx{parent: parent, deadline: deadline}
	own := true
	if pd, ok := parent.Deadline(); ok && pd.Before(deadline) {
		c.deadline, own = pd, false // parent ends first, with DeadlineExceeded
	}
	if parent.Done() != nil {
		if err := parent.Err(); err != nil {
			c.End(err)
			return c
		}
		c.stopParent = context.AfterFunc(parent, c.linkTo().parentFn)
	}
	if own {
		wait := time.Until(deadline)
		if wait <= 0 {
			c.End(context.DeadlineExceeded)
			return c
		}
		l := c.linkTo()
		if l.timer == nil {
			l.timer = time.AfterFunc(wait, l.expire)
		} else {
			l.timer.Reset(wait) // stopped before it fired: see Stop
		}
		l.armed = true
	}
	return c
}

// Stop ends a context WithDeadline made, with Canceled unless it has
// ended already, and releases its timer and its link to the parent. The
// owner calls it once; later calls do nothing more.
func (c *Ctx) Stop() {
	l, stopParent := c.link, c.stopParent
	c.link, c.stopParent = nil, nil
	// The link is reused only if neither of its functions ran or can
	// still run: one that did would end the next context it serves.
	reuse := l != nil
	if l != nil && l.armed {
		l.armed = false
		reuse = l.timer.Stop()
	}
	if stopParent != nil && !stopParent() {
		reuse = false
	}
	c.End(context.Canceled)
	if reuse {
		l.c.Store(nil)
		links.Put(l)
	}
}

func (c *Ctx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *Ctx) Done() <-chan struct{} {
	if d := c.done.Load(); d != nil {
		return d.(chan struct{})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.done.Load()
	if d == nil {
		d = make(chan struct{})
		c.done.Store(d)
	}
	return d.(chan struct{})
}

func (c *Ctx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *Ctx) Value(key any) any { return c.parent.Value(key) }

func (c *Ctx) String() string { return "workmesh request context" }

// AfterFunc arranges for f to run once the context ends, at once if it
// has (then on a goroutine of its own); stop undoes that, reporting
// whether it did before f ran. The context package calls it for a context
// derived from this one, so that no goroutine waits on Done for it; f runs
// on the goroutine that ends the context (context.AfterFunc, called with
// this context, still runs its function on one of its own).
func (c *Ctx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		// On a goroutine of its own, as context.AfterFunc runs it: the
		// context package calls this holding the lock of the context it
		// derives, which f (that context's cancel) takes.
		go f()
		return func() bool { return false }
	}
	c.nextID++
	id := c.nextID
	c.after = append(c.after, afterEntry{id: id, f: f})
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, a := range c.after {
			if a.id == id {
				c.after = append(c.after[:i], c.after[i+1:]...)
				return true
			}
		}
		return false
	}
}

// Watch has f run when the context ends, as AfterFunc does, with no
// allocation: there is one place for it, for the one caller that blocks
// on the request at a time. It reports false, and does nothing, when the
// context has ended or another function is watching.
func (c *Ctx) Watch(f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.watch != nil {
		return false
	}
	c.watch = f
	return true
}

// Unwatch undoes Watch, reporting whether it did before the function ran
// (false: the context ended meanwhile, and the function ran or runs).
func (c *Ctx) Unwatch() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.watch == nil {
		return false
	}
	c.watch = nil
	return true
}

// End ends the context with err unless it has ended already, and runs
// what AfterFunc and Watch registered.
func (c *Ctx) End(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	if d, _ := c.done.Load().(chan struct{}); d != nil {
		close(d)
	} else {
		c.done.Store(closedchan)
	}
	after, watch := c.after, c.watch
	c.after, c.watch = nil, nil
	c.mu.Unlock()
	if watch != nil {
		watch()
	}
	for _, a := range after {
		a.f()
	}
}
