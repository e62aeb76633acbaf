package reqctx

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type key struct{}

// ended waits for ctx to end, within a bound.
func ended(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not done", what)
	}
}

// TestWithDeadlineBehavesAsContextWithDeadline: a request context made by
// WithDeadline says what context.WithDeadline's says, for itself and for
// a context derived from it (Err, Cause, Deadline, values), when its
// deadline passes, when its parent is cancelled with a cause, when it is
// stopped, when the parent's deadline is the earlier, and when it is made
// already ended. Each case runs on both, side by side.
func TestWithDeadlineBehavesAsContextWithDeadline(t *testing.T) {
	errGone := errors.New("caller gone")
	type side struct {
		ctx, child context.Context
		stop       func()
		cancel     context.CancelCauseFunc // the parent's
	}
	type pair struct{ std, own side }
	start := func(t *testing.T, d time.Duration, parentD time.Duration, cancelFirst bool) *pair {
		t.Helper()
		deadline, parentDeadline := time.Now().Add(d), time.Now().Add(parentD)
		mk := func(own bool) side {
			var parent context.Context = context.WithValue(context.Background(), key{}, "v")
			parent, pcancel := context.WithCancelCause(parent)
			if parentD > 0 {
				var c context.CancelFunc
				parent, c = context.WithDeadline(parent, parentDeadline)
				t.Cleanup(c)
			}
			if cancelFirst {
				pcancel(errGone)
			}
			s := side{cancel: pcancel}
			if own {
				c := WithDeadline(parent, deadline)
				s.ctx, s.stop = c, c.Stop
			} else {
				var c context.CancelFunc
				s.ctx, c = context.WithDeadline(parent, deadline)
				s.stop = c
			}
			var cc context.CancelFunc
			s.child, cc = context.WithCancel(s.ctx)
			t.Cleanup(cc)
			t.Cleanup(s.stop)
			t.Cleanup(func() { pcancel(nil) })
			return s
		}
		return &pair{std: mk(false), own: mk(true)}
	}
	same := func(t *testing.T, p *pair, when string) {
		t.Helper()
		for _, c := range []struct {
			name     string
			std, own context.Context
		}{{"request", p.std.ctx, p.own.ctx}, {"derived", p.std.child, p.own.child}} {
			if s, o := c.std.Err(), c.own.Err(); s != o {
				t.Errorf("%s, %s context: Err %v, want %v", when, c.name, o, s)
			}
			if s, o := context.Cause(c.std), context.Cause(c.own); s != o {
				t.Errorf("%s, %s context: Cause %v, want %v", when, c.name, o, s)
			}
			sd, sok := c.std.Deadline()
			od, ook := c.own.Deadline()
			if sok != ook || !sd.Equal(od) {
				t.Errorf("%s, %s context: Deadline %v %v, want %v %v", when, c.name, od, ook, sd, sok)
			}
			if v := c.own.Value(key{}); v != "v" {
				t.Errorf("%s, %s context: Value %v, want the parent's v", when, c.name, v)
			}
		}
	}

	t.Run("running", func(t *testing.T) {
		p := start(t, time.Minute, 0, false)
		select {
		case <-p.own.ctx.Done():
			t.Fatal("done while running")
		default:
		}
		same(t, p, "running")
	})
	t.Run("deadline", func(t *testing.T) {
		p := start(t, 30*time.Millisecond, 0, false)
		ended(t, p.std.child, "std")
		ended(t, p.own.child, "own")
		same(t, p, "at the deadline")
		p.std.stop()
		p.own.stop()
		same(t, p, "stopped after the deadline")
	})
	t.Run("parent cancelled", func(t *testing.T) {
		p := start(t, time.Minute, 0, false)
		p.std.cancel(errGone)
		p.own.cancel(errGone)
		ended(t, p.own.child, "own") // a moment later: context.AfterFunc's goroutine
		same(t, p, "parent cancelled")
	})
	t.Run("stopped", func(t *testing.T) {
		p := start(t, time.Minute, 0, false)
		p.std.stop()
		p.own.stop()
		select {
		case <-p.own.child.Done(): // at once, as the standard's
		default:
			t.Fatal("derived context not done when Stop returned")
		}
		same(t, p, "stopped")
	})
	t.Run("parent deadline first", func(t *testing.T) {
		p := start(t, time.Minute, 30*time.Millisecond, false)
		// The parent's deadline, read before it passes (once it has, the
		// standard's ends within the parent's cancel, this one a moment
		// later: Err is compared once both have ended).
		sd, _ := p.std.ctx.Deadline()
		if od, _ := p.own.ctx.Deadline(); !od.Equal(sd) {
			t.Errorf("Deadline %v, want the parent's %v", od, sd)
		}
		ended(t, p.std.child, "std")
		ended(t, p.own.child, "own")
		same(t, p, "at the parent's deadline")
	})
	t.Run("parent already cancelled", func(t *testing.T) {
		p := start(t, time.Minute, 0, true)
		same(t, p, "made under a cancelled parent")
	})
	t.Run("deadline already passed", func(t *testing.T) {
		p := start(t, -time.Second, 0, false)
		same(t, p, "made past its deadline")
	})
}

// TestWatch: a watched function runs once when the context ends, and
// Unwatch says whether it was undone in time; there is one watcher at a
// time, and none on an ended context.
func TestWatch(t *testing.T) {
	c := WithDeadline(context.Background(), time.Now().Add(time.Minute))
	ran := 0
	if !c.Watch(func() { ran++ }) {
		t.Fatal("Watch refused on a running context")
	}
	if c.Watch(func() {}) {
		t.Fatal("a second watcher was taken")
	}
	if !c.Unwatch() || ran != 0 {
		t.Fatalf("Unwatch before the end: ran %d", ran)
	}
	if !c.Watch(func() { ran++ }) {
		t.Fatal("Watch refused after Unwatch")
	}
	c.Stop()
	if ran != 1 {
		t.Fatalf("watched function ran %d times at the end, want once", ran)
	}
	if c.Unwatch() {
		t.Fatal("Unwatch after the function ran reported it undone")
	}
	if c.Watch(func() { ran++ }) {
		t.Fatal("Watch taken on an ended context")
	}
	if !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("Err after Stop: %v", c.Err())
	}

	// At the deadline.
	d := WithDeadline(context.Background(), time.Now().Add(20*time.Millisecond))
	defer d.Stop()
	fired := make(chan struct{})
	if !d.Watch(func() { close(fired) }) {
		t.Fatal("Watch refused on a running context")
	}
	ended(t, d, "deadline")
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("the watched function did not run at the deadline")
	}
}

// TestDerivedContextStartsNoGoroutine: a context derived from a request
// context is linked through its AfterFunc, not a goroutine the context
// package starts for a context type it does not know; stopping the
// derived one unlinks it.
func TestDerivedContextStartsNoGoroutine(t *testing.T) {
	c := WithDeadline(context.Background(), time.Now().Add(time.Minute))
	defer c.Stop()
	child, cancel := context.WithCancel(c)
	c.mu.Lock()
	n := len(c.after)
	c.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d functions registered by a derived context, want 1", n)
	}
	cancel()
	c.mu.Lock()
	n = len(c.after)
	c.mu.Unlock()
	if n != 0 || child.Err() == nil {
		t.Fatalf("after the derived context's cancel: %d registered, Err %v", n, child.Err())
	}
}

// TestDeriveAsItEnds: contexts derived from a request context at the
// moment it ends (a hedge's, or a dial's, as its deadline passes) do not
// hang: the context package asks for AfterFunc holding the derived
// context's lock, so a function for an ended context runs on a goroutine
// of its own. (Run on the ended context's goroutine, it hung within some
// thousands of rounds.)
func TestDeriveAsItEnds(t *testing.T) {
	done := make(chan struct{})
	var rounds atomic.Int64
	go func() {
		defer close(done)
		for range 20000 {
			rounds.Add(1)
			c := WithDeadline(context.Background(), time.Now().Add(20*time.Microsecond))
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					_, cancel := context.WithCancel(c)
					cancel()
				})
			}
			wg.Wait()
			c.Stop()
		}
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("hung after %d rounds", rounds.Load())
	}
}

// TestStopReusesOnlyALinkNothingCanFire: a context whose deadline passed,
// or whose parent ended, before Stop gives its link (timer and parent's
// hook) to no later context, while one stopped before either keeps
// serving the next ones. A link whose function had started would end the
// context it serves next.
func TestStopReusesOnlyALinkNothingCanFire(t *testing.T) {
	// taken reports whether l comes out of the pool among the next few
	// links the pool hands out (which go back after).
	taken := func(l *link) bool {
		var got []*link
		defer func() {
			for _, g := range got {
				links.Put(g)
			}
		}()
		for range 8 {
			g := links.Get().(*link)
			got = append(got, g)
			if g == l {
				return true
			}
		}
		return false
	}
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()

	reused := false
	for i := 0; i < 100 && !reused; i++ {
		c := WithDeadline(parent, time.Now().Add(time.Minute))
		l := c.link
		c.Stop()
		reused = taken(l)
	}
	if !reused {
		t.Fatal("a link stopped before anything fired is never reused")
	}

	c := WithDeadline(parent, time.Now().Add(time.Millisecond))
	l := c.link
	ended(t, c, "deadline")
	c.Stop()
	if taken(l) {
		t.Fatal("the link of a context whose deadline passed is reused")
	}

	p2, cancel2 := context.WithCancel(context.Background())
	c = WithDeadline(p2, time.Now().Add(time.Minute))
	l = c.link
	cancel2()
	ended(t, c, "parent's cancel")
	c.Stop()
	if taken(l) {
		t.Fatal("the link of a context whose parent ended is reused")
	}
}

// TestStopRacingItsEndLeavesTheNextContext: Stop racing the context's
// deadline or its parent's cancel never ends a context made after it.
// Each round's next context has a live parent and a far deadline, so
// nothing of its own ends it.
func TestStopRacingItsEndLeavesTheNextContext(t *testing.T) {
	live, cancelLive := context.WithCancel(context.Background())
	defer cancelLive()
	var next []*Ctx
	for i := range 5000 {
		var c *Ctx
		if i%2 == 0 {
			c = WithDeadline(live, time.Now().Add(time.Duration(i%7)*time.Microsecond))
		} else {
			// The parent's cancel starts the context's end on a
			// goroutine of its own, which may run after Stop.
			p, cancel := context.WithCancel(context.Background())
			c = WithDeadline(p, time.Now().Add(time.Minute))
			cancel()
		}
		c.Stop()
		next = append(next, WithDeadline(live, time.Now().Add(time.Hour)))
	}
	// A late function of an earlier context runs on a goroutine of its
	// own; by now most have, and any that ended a later context shows.
	for i, c := range next {
		select {
		case <-c.Done():
			t.Fatalf("context %d ended (Err %v): a function of the context before it ran for it", i, c.Err())
		default:
		}
		c.Stop()
	}
}
