package selection

import (
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

func woken(w *Waiter) bool {
	select {
	case <-w.Wake():
		return true
	default:
		return false
	}
}

// TestAdmission_BoundedFIFOAndLeavesAtItsDeadline drives the admission
// queue on a fake clock: it takes at most its limit, wakes the longest
// waiting first and only waiters that wait, backs off within its bounds,
// and has a request leave once less than its work's need is left of its
// deadline.
func TestAdmission_BoundedFIFOAndLeavesAtItsDeadline(t *testing.T) {
	clk := testkit.NewFakeClock()
	a := NewAdmission(2, clk)
	w1, ok1 := a.Enter()
	clk.Advance(time.Millisecond)
	w2, ok2 := a.Enter()
	if !ok1 || !ok2 {
		t.Fatal("a queue of 2 refused one of its first two waiters")
	}
	if _, ok := a.Enter(); ok {
		t.Fatal("a queue of 2 took a third waiter")
	}
	deadline := clk.Now().Add(time.Second)
	const need = 200 * time.Millisecond

	// Placing themselves (just entered): Freed wakes nobody.
	a.Freed()
	if woken(w1) || woken(w2) {
		t.Fatal("Freed woke a waiter that was placing its request already")
	}
	d1, leave1 := w1.Wait(deadline, need, 0)
	d2, leave2 := w2.Wait(deadline, need, 0)
	if leave1 || leave2 {
		t.Fatal("a waiter with 1s left of its deadline and 200ms of need was told to leave")
	}
	if d1 < backoffMin/2 || d1 > backoffMin*3/2 || d2 < backoffMin/2 || d2 > backoffMin*3/2 {
		t.Fatalf("first waits %s and %s, want about %s", d1, d2, backoffMin)
	}
	// The longest waiting first, one per Freed.
	a.Freed()
	if !woken(w1) || woken(w2) {
		t.Fatal("Freed did not wake the longest waiting (and only it)")
	}
	a.Freed()
	if !woken(w2) {
		t.Fatal("the second Freed did not wake the second waiter")
	}

	// Backoff grows and stays bounded, jitter included.
	var last time.Duration
	for i := range 12 {
		d, leave := w1.Wait(deadline, need, ^uint64(0))
		if leave {
			t.Fatalf("wait %d: told to leave early", i)
		}
		if d > backoffMax*3/2 {
			t.Fatalf("wait %d: %s, more than the bound %s", i, d, backoffMax*3/2)
		}
		if d < last {
			t.Fatalf("wait %d: %s after %s, want growing to the bound", i, d, last)
		}
		last = d
	}
	// Never past the moment it must leave: with its need left, and a
	// tenth of it and needSlack to spare.
	leaveAt := deadline.Add(-need - need/10 - needSlack)
	clk.Set(leaveAt.Add(-5 * time.Millisecond))
	if d, leave := w1.Wait(deadline, need, ^uint64(0)); leave || d != 5*time.Millisecond {
		t.Fatalf("5ms before it must leave: wait %s, leave %v; want 5ms", d, leave)
	}
	clk.Set(leaveAt.Add(time.Millisecond))
	if _, leave := w1.Wait(deadline, need, 0); !leave {
		t.Fatal("less than its need left of the deadline: not told to leave")
	}

	// A wake-up taken by a waiter that leaves is passed on to the next.
	w1.Leave()
	w1.Leave() // safe twice
	w3, ok := a.Enter()
	if !ok || a.Waiting() != 2 {
		t.Fatalf("after one left: enter %v, %d waiting; want room for one more and 2 waiting", ok, a.Waiting())
	}
	w3.Wait(deadline.Add(time.Hour), need, 0)
	w2.Try()
	w2.wake <- struct{}{} // woken as it placed itself: pending when it leaves
	w2.Leave()
	if !woken(w3) {
		t.Fatal("the wake-up of a leaving waiter was not passed on")
	}
	w3.Leave()
	if a.Waiting() != 0 {
		t.Fatalf("%d waiting after all left", a.Waiting())
	}

	// A queue of 0 takes nobody.
	if _, ok := NewAdmission(0, clk).Enter(); ok {
		t.Fatal("admission-queue-size 0 took a waiter")
	}
}
