package selection

import (
	"sync/atomic"
	"time"
)

// budgetBuckets is the number of slices a retry budget's window is cut
// into: the window slides a slice at a time.
const budgetBuckets = 10

// retryBudget bounds the retries of all requests together, as service
// meshes bound them: in the last window, retries may be at most ratio of
// the requests plus minPerSecond for every second of the window. A
// network where many first attempts fail then sends a bounded share more
// work, not one retry per request at once, while a lone failure among few
// requests is still retried. It is a ring of per-slice atomic counters, so
// a request costs two atomic adds and no lock.
type retryBudget struct {
	ratio  float64
	floor  float64 // minPerSecond times the window in seconds
	slice  int64   // nanoseconds of one bucket
	ring   [budgetBuckets]budgetBucket
	origin time.Time
}

type budgetBucket struct {
	epoch    atomic.Int64 // the slice index the counts belong to
	requests atomic.Int64
	retries  atomic.Int64
}

// newRetryBudget returns a budget over window; nil when window is zero
// (no budget: only the per-request caps bound retries).
func newRetryBudget(window time.Duration, ratio float64, minPerSecond float64, origin time.Time) *retryBudget {
	if window <= 0 {
		return nil
	}
	b := &retryBudget{ratio: ratio, floor: minPerSecond * window.Seconds(), slice: max(1, int64(window)/budgetBuckets), origin: origin}
	for i := range b.ring {
		b.ring[i].epoch.Store(-1)
	}
	return b
}

// bucket returns the bucket of now's slice, emptied when it last held an
// older slice.
func (b *retryBudget) bucket(now time.Time) *budgetBucket {
	idx := int64(now.Sub(b.origin)) / b.slice
	bk := &b.ring[((idx%budgetBuckets)+budgetBuckets)%budgetBuckets]
	if old := bk.epoch.Load(); old != idx && bk.epoch.CompareAndSwap(old, idx) {
		// A count racing with the reset may be lost: the budget is an
		// estimate, not a ledger.
		bk.requests.Store(0)
		bk.retries.Store(0)
	}
	return bk
}

// request counts one request that made a first remote attempt.
func (b *retryBudget) request(now time.Time) { b.bucket(now).requests.Add(1) }

// sums returns the requests and retries of the window ending at now.
func (b *retryBudget) sums(now time.Time) (requests, retries int64) {
	idx := int64(now.Sub(b.origin)) / b.slice
	for i := range b.ring {
		bk := &b.ring[i]
		if e := bk.epoch.Load(); e <= idx && e > idx-budgetBuckets {
			requests += bk.requests.Load()
			retries += bk.retries.Load()
		}
	}
	return requests, retries
}

// allows reports whether one more retry fits the budget at now, and the
// retries in the window and the number allowed, for an explanation.
func (b *retryBudget) allows(now time.Time) (bool, int64, int64) {
	requests, retries := b.sums(now)
	allowed := int64(b.ratio*float64(requests) + b.floor)
	return retries < allowed, retries, allowed
}

// retry counts one retry at now.
func (b *retryBudget) retry(now time.Time) { b.bucket(now).retries.Add(1) }
