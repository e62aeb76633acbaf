package selection

import (
	"container/heap"
	"sort"
	"time"
)

// The poll schedule. A dispatcher asks for the due polls on every tick of
// its loop (every 50ms), and most ticks find a few due among many peers: a
// scan of every peer on every tick grew the idle cost of a node with the
// network. The peers are kept instead in two heaps, ordered by when they
// are due, and a tick reads only the due ones:
//
//   - alive peers by their last poll: an alive peer is due poll-interval
//     (or the longer interval of poll-budget) after it, the same interval
//     for all of them, so the order holds when the interval changes;
//   - unreachable peers by their next redial, probing ones by their last
//     poll plus their own interval (pollInterval).
//
// Every change of what a peer's turn depends on (its state, last poll,
// next redial, whether it is fresh or was cordoned) ends with
// reschedLocked, under Liveness.mu.

// dueQueue is a min-heap of peers by health.key.
type dueQueue []*health

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return q[i].key.Before(q[j].key) }
func (q dueQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].qi, q[j].qi = i, j
}
func (q *dueQueue) Push(x any) {
	h := x.(*health)
	h.qi = len(*q)
	*q = append(*q, h)
}
func (q *dueQueue) Pop() any {
	old := *q
	h := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	h.qi = -1
	return h
}

// reschedLocked puts h in the queue its state says, at its turn: alive
// peers by last poll, probing ones by when their next poll is due,
// unreachable ones by their next redial; with polling off only unreachable
// peers are scheduled (redials).
func (l *Liveness) reschedLocked(h *health) {
	var q *dueQueue
	var key time.Time
	switch h.load() {
	case StateUnreachable:
		q, key = &l.redialQ, h.nextAttempt
	case StateAlive:
		if l.cfg.PollInterval > 0 {
			q, key = &l.aliveQ, h.lastPoll
		}
	default:
		if l.cfg.PollInterval > 0 {
			q, key = &l.redialQ, h.lastPoll.Add(l.pollInterval(h))
		}
	}
	if h.queue != nil && h.queue != q {
		heap.Remove(h.queue, h.qi)
		h.queue = nil
	}
	if q == nil {
		return
	}
	if h.queue == q {
		if !h.key.Equal(key) {
			h.key = key
			heap.Fix(q, h.qi)
		}
		return
	}
	h.key, h.queue = key, q
	heap.Push(q, h)
}

// unschedLocked takes h out of its queue (a peer forgotten).
func (l *Liveness) unschedLocked(h *health) {
	if h.queue != nil {
		heap.Remove(h.queue, h.qi)
		h.queue = nil
	}
}

// Due returns, sorted, the peers to poll now: StateAlive and StateProbing peers whose
// last poll is poll-interval old (none when polling is off; for alive peers
// longer when there are more than poll-budget of them), and StateUnreachable
// peers whose redial backoff has passed.
func (l *Liveness) Due() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dueLocked()
}

func (l *Liveness) dueLocked() []string {
	now := l.clock.Now()
	var out []string
	if l.cfg.PollInterval > 0 {
		out = l.aliveQ.appendDue(out, now.Add(-l.aliveIntervalLocked()))
	}
	out = l.redialQ.appendDue(out, now)
	sort.Strings(out)
	return out
}

// appendDue appends the peers whose key is at or before limit: a walk of
// the heap that goes below a peer only when the peer is due, so it reads
// the due peers and at most two more for each.
func (q dueQueue) appendDue(out []string, limit time.Time) []string {
	if len(q) == 0 || limit.Before(q[0].key) {
		return out
	}
	stack := []int{0}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if limit.Before(q[i].key) {
			continue
		}
		out = append(out, q[i].id)
		for _, c := range [2]int{2*i + 1, 2*i + 2} {
			if c < len(q) {
				stack = append(stack, c)
			}
		}
	}
	return out
}

// aliveIntervalLocked returns the time between two polls of an alive
// peer: poll-interval, or, with more alive peers than poll-budget, that
// much longer, so that the polls of alive peers stay within poll-budget
// per poll-interval however large the network. With polling on, every
// alive peer is in aliveQ.
func (l *Liveness) aliveIntervalLocked() time.Duration {
	budget, alive := l.cfg.PollBudget, len(l.aliveQ)
	if budget <= 0 || alive <= budget {
		return l.cfg.PollInterval
	}
	return time.Duration(float64(l.cfg.PollInterval) * float64(alive) / float64(budget))
}
