package protocol

import (
	"context"
	"errors"
	"testing"
	"time"
)

// reqCtxKey is a value key for TestRequestContextBehavesAsWithDeadline.
type reqCtxKey struct{}

// TestRequestContextBehavesAsWithDeadline: the context a work server gives
// a request (requestCtx) answers as context.WithDeadline on the stream's
// request context would, for the request, for a context derived from it,
// and for context.Cause: at its deadline, at its Ticket's Cancel, when the
// stream's context ends, and once the request is done with. Each case
// runs on both, side by side, and compares what they say.
func TestRequestContextBehavesAsWithDeadline(t *testing.T) {
	errGone := errors.New("client gone")
	errClosed := errors.New("server closed")
	type pair struct {
		std, own context.Context
		// stdCancel and ownCancel are the Ticket's Cancel of each.
		stdCancel, ownCancel context.CancelCauseFunc
		stdStream, ownStream context.CancelCauseFunc
		stdDone, ownDone     func()
		stdChild, ownChild   context.Context
	}
	start := func(t *testing.T, d time.Duration) *pair {
		t.Helper()
		base := context.WithValue(context.Background(), reqCtxKey{}, "v")
		deadline := time.Now().Add(d)
		p := &pair{}
		// The standard: a stream context, its request context, and the
		// request's WithDeadline.
		sctx, scancel := context.WithCancelCause(base)
		reqs, rcancel := context.WithCancelCause(sctx)
		std, stdDone := context.WithDeadline(reqs, deadline)
		p.std, p.stdCancel, p.stdStream, p.stdDone = std, rcancel, scancel, stdDone
		// The work server's.
		octx, ocancel := context.WithCancelCause(base)
		c := &wstream{ctx: octx}
		stop := context.AfterFunc(c.ctx, c.contextEnded) // as handle does
		own := c.begin(deadline)
		p.own, p.ownCancel, p.ownStream = own, c.cancelRequests, ocancel
		p.ownDone = func() { c.finish(own) }
		t.Cleanup(func() {
			stop()
			scancel(nil)
			ocancel(nil)
			if c.deadline != nil {
				c.deadline.Stop()
			}
		})
		var cancel context.CancelFunc
		p.stdChild, cancel = context.WithCancel(p.std)
		t.Cleanup(cancel)
		p.ownChild, cancel = context.WithCancel(p.own)
		t.Cleanup(cancel)
		return p
	}
	ended := func(t *testing.T, ctx context.Context, what string) {
		t.Helper()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: not done", what)
		}
	}
	same := func(t *testing.T, p *pair, when string) {
		t.Helper()
		for _, c := range []struct {
			name     string
			std, own context.Context
		}{{"request", p.std, p.own}, {"derived", p.stdChild, p.ownChild}} {
			if s, o := c.std.Err(), c.own.Err(); s != o {
				t.Errorf("%s, %s context: Err %v, want %v", when, c.name, o, s)
			}
			if s, o := context.Cause(c.std), context.Cause(c.own); s != o {
				t.Errorf("%s, %s context: Cause %v, want %v", when, c.name, o, s)
			}
			if v := c.own.Value(reqCtxKey{}); v != "v" {
				t.Errorf("%s, %s context: Value %v, want the stream's v", when, c.name, v)
			}
		}
	}

	t.Run("running", func(t *testing.T) {
		p := start(t, time.Minute)
		sd, _ := p.std.Deadline()
		od, ok := p.own.Deadline()
		if !ok || !od.Equal(sd) {
			t.Errorf("Deadline %v %v, want %v", od, ok, sd)
		}
		select {
		case <-p.own.Done():
			t.Fatal("done while running")
		default:
		}
		same(t, p, "running")
	})
	t.Run("deadline", func(t *testing.T) {
		p := start(t, 30*time.Millisecond)
		ended(t, p.std, "std")
		ended(t, p.own, "own")
		ended(t, p.ownChild, "own derived")
		same(t, p, "at the deadline")
		// The first cause is kept: a Cancel after the deadline changes
		// nothing.
		p.stdCancel(errGone)
		p.ownCancel(errGone)
		same(t, p, "cancelled after the deadline")
	})
	t.Run("ticket cancel", func(t *testing.T) {
		p := start(t, time.Minute)
		p.stdCancel(errGone)
		p.ownCancel(errGone)
		select {
		case <-p.own.Done(): // at once, as the standard's
		default:
			t.Fatal("not done when Cancel returned")
		}
		same(t, p, "cancelled")
	})
	t.Run("stream ended", func(t *testing.T) {
		p := start(t, time.Minute)
		p.stdStream(errClosed)
		p.ownStream(errClosed)
		ended(t, p.own, "own")
		ended(t, p.ownChild, "own derived")
		same(t, p, "stream ended")
	})
	t.Run("done with", func(t *testing.T) {
		p := start(t, time.Minute)
		p.stdDone()
		p.ownDone()
		same(t, p, "done with")
	})
}

// TestRequestContextLateTimerLeavesNextRequest: the stream's deadline
// timer, firing late for a request already done with, does not end the
// next request's context, nor the stream's request context it descends
// from; a request that ran out of time leaves the next one a new request
// context; and the timer, left set for a later deadline, is set sooner
// for a request whose deadline is sooner.
func TestRequestContextLateTimerLeavesNextRequest(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &wstream{ctx: ctx}
	first := c.begin(time.Now().Add(time.Millisecond))
	c.finish(first)
	next := c.begin(time.Now().Add(time.Minute))
	firstDeadline, _ := first.Deadline()
	for time.Now().Before(firstDeadline) {
		<-time.After(time.Until(firstDeadline))
	}
	c.deadlinePassed() // the first request's timer, late
	if err := next.Err(); err != nil {
		t.Fatalf("next request ended by the first's timer: %v", err)
	}
	c.finish(next)

	late := c.begin(time.Now().Add(10 * time.Millisecond))
	<-late.Done()
	if !errors.Is(late.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err %v, want the deadline", late.Err())
	}
	c.finish(late)
	after := c.begin(time.Now().Add(time.Minute))
	if err := after.Err(); err != nil {
		t.Fatalf("the request after one that ran out of time starts ended: %v", err)
	}
	c.finish(after)

	// The timer, set for the last request's minute, is set sooner for a
	// request whose deadline comes sooner.
	sooner := c.begin(time.Now().Add(20 * time.Millisecond))
	select {
	case <-sooner.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a request with a sooner deadline than the last one's did not end at it")
	}
	if !errors.Is(sooner.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err %v, want the deadline", sooner.Err())
	}
	c.finish(sooner)

	// Set for a request done with, the timer fires while a later one runs
	// and is set again for its deadline.
	early := c.begin(time.Now().Add(20 * time.Millisecond))
	c.finish(early)
	later := c.begin(time.Now().Add(60 * time.Millisecond))
	defer c.finish(later)
	select {
	case <-later.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a request whose deadline came after the timer's did not end at it")
	}
	if !errors.Is(later.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err %v, want the deadline", later.Err())
	}
	c.stopDeadline()
}

// TestRequestContextEndsItsParentFirstAtTheDeadline: at a request's
// deadline the stream's request context, whose cause the request's
// reports, has ended with DeadlineExceeded by the time the request's
// context ends: a Ticket's Cancel that comes as the deadline passes finds
// the cause taken, as it would a WithDeadline's. (Ended the other way
// round, a Cancel in between became the request's cause; seen once under
// load in TestRequestContextBehavesAsWithDeadline.)
func TestRequestContextEndsItsParentFirstAtTheDeadline(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &wstream{ctx: ctx}
	defer c.stopDeadline()
	r := c.begin(time.Now().Add(10 * time.Millisecond))
	defer c.finish(r)
	parent := c.reqs
	seen := make(chan error, 1)
	r.AfterFunc(func() { seen <- context.Cause(parent) }) // runs as r ends
	select {
	case cause := <-seen:
		if !errors.Is(cause, context.DeadlineExceeded) {
			t.Fatalf("as the request's context ended, its parent's cause was %v, want the deadline", cause)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request's context did not end at its deadline")
	}
}
