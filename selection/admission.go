package selection

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Admission is the bounded queue where a request waits at the node that
// took it while every worker that could run it is busy: the remote ones
// answered busy and so did the local worker. A waiter tries again when
// capacity may have freed (Freed: an attempt of this node ended) or its
// backoff has passed, whichever comes first, and leaves when its deadline
// can no longer be met (Wait says when). Freed wakes the longest waiting first, so
// the requests that came first are placed first.
//
// It holds no timer: the dispatcher waits on a waiter's Wake channel and
// on a timer of its own for Backoff, which keeps the decisions here pure
// (the clock is injected).
type Admission struct {
	limit int
	clock Clock

	mu    sync.Mutex
	queue []*Waiter // in arrival order
	// waiting mirrors len(queue), so that Freed costs one atomic load when
	// nobody waits (every attempt's end calls it).
	waiting atomic.Int64
}

// Waiter is one request in the admission queue.
type Waiter struct {
	a     *Admission
	since time.Time
	// wake has room for one signal: Freed never blocks.
	wake chan struct{}
	// trying: the waiter is placing its request again, so Freed passes it
	// over (guarded by a.mu).
	trying bool
	rounds int
	gone   bool
}

// Backoff bounds of a waiter: the first wait is about backoffMin, each
// later one twice the last, up to about backoffMax; each is jittered by up
// to half of it either way.
const (
	backoffMin = 10 * time.Millisecond
	backoffMax = 250 * time.Millisecond
)

// needSlack is added to a tenth more than a request's need: what it must
// have left of its deadline to be placed again. It covers the 20ms a remote
// worker's time budget keeps back for its answer's way home (the
// dispatcher's workBudget) and a few milliseconds more.
const needSlack = 25 * time.Millisecond

// NewAdmission returns an admission queue for at most limit waiting
// requests (0: none waits) on clock (nil: the system clock).
func NewAdmission(limit int, clock Clock) *Admission {
	if clock == nil {
		clock = SystemClock{}
	}
	return &Admission{limit: max(0, limit), clock: clock}
}

// Limit returns the most requests that may wait at once.
func (a *Admission) Limit() int { return a.limit }

// Waiting returns the number of requests waiting now.
func (a *Admission) Waiting() int { return int(a.waiting.Load()) }

// Enter puts a request in the queue, placing its request already (not
// waiting for a signal). It returns false when the queue is full.
func (a *Admission) Enter() (*Waiter, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.queue) >= a.limit {
		return nil, false
	}
	w := &Waiter{a: a, since: a.clock.Now(), wake: make(chan struct{}, 1), trying: true}
	a.queue = append(a.queue, w)
	a.waiting.Store(int64(len(a.queue)))
	return w, true
}

// Freed says that capacity may have freed for a waiting request (an
// attempt of this node ended, a slot was released): it wakes the longest
// waiting request that is not placing its request already.
func (a *Admission) Freed() {
	if a.waiting.Load() == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.freedLocked()
}

// Since returns when the request entered the queue.
func (w *Waiter) Since() time.Time { return w.since }

// Rounds returns how often the request waited.
func (w *Waiter) Rounds() int {
	w.a.mu.Lock()
	defer w.a.mu.Unlock()
	return w.rounds
}

// Wait marks the request as waiting again after an attempt to place it
// found every worker busy, and returns how long it may wait before it
// tries again by itself (the dispatcher's timer), and whether it must
// leave instead: at now, with its deadline and need (the least time its
// work is expected to take), it leaves when less than need is left, since
// work started later cannot end in time. The wait is the waiter's jittered
// backoff (rnd draws the jitter), never past the time it must leave.
func (w *Waiter) Wait(deadline time.Time, need time.Duration, rnd uint64) (time.Duration, bool) {
	a := w.a
	a.mu.Lock()
	defer a.mu.Unlock()
	left := Spare(deadline.Sub(a.clock.Now()), need)
	if left <= 0 {
		return 0, true
	}
	b := backoffMin << min(w.rounds, 8)
	b = min(b, backoffMax)
	// Jitter: b/2 to 3b/2, so that waiters woken alike do not come back alike.
	b = b/2 + time.Duration(rnd%uint64(b))
	w.rounds++
	// A wake-up still pending came as its backoff passed: it is passed on
	// to the next waiter rather than spent on this one's next wait.
	select {
	case <-w.wake:
		a.freedLocked()
	default:
	}
	w.trying = false
	return min(b, left), false
}

// Spare returns how much of left, the time left of a request's deadline,
// is to spare once its work, which takes need at the least, is placed:
// not more than 0 means the work cannot end in time. A tenth more than
// need and a few milliseconds are kept back: work placed with just its
// need left ends a little after its deadline, not on it.
func Spare(left, need time.Duration) time.Duration {
	return left - need - need/10 - needSlack
}

// Wake returns the channel on which Freed wakes the waiter.
func (w *Waiter) Wake() <-chan struct{} { return w.wake }

// Try marks the request as placing itself again (its backoff passed).
func (w *Waiter) Try() {
	w.a.mu.Lock()
	w.trying = true
	w.a.mu.Unlock()
}

// Leave takes the request out of the queue, placed or not; it is safe to
// call more than once.
func (w *Waiter) Leave() {
	a := w.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.gone {
		return
	}
	w.gone = true
	if i := slices.Index(a.queue, w); i >= 0 {
		a.queue = slices.Delete(a.queue, i, i+1)
	}
	a.waiting.Store(int64(len(a.queue)))
	if w.trying {
		// A wake-up it took may have been meant for capacity it no longer
		// needs: pass it on.
		select {
		case <-w.wake:
			a.freedLocked()
		default:
		}
	}
}

// freedLocked wakes the longest waiting request that is not placing
// itself already, if any.
func (a *Admission) freedLocked() {
	for _, w := range a.queue {
		if !w.trying {
			w.trying = true
			select {
			case w.wake <- struct{}{}:
			default:
			}
			return
		}
	}
}
