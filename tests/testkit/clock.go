package testkit

import (
	"sync"
	"time"
)

// FakeClock is a clock that moves only when a test moves it. It satisfies
// every clock interface of the form interface{ Now() time.Time } (those of
// selection and node) and is safe for concurrent use.
type FakeClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewFakeClock returns a clock at a fixed time, so that a test reads the
// same times on every run.
func NewFakeClock() *FakeClock { return NewFakeClockAt(time.Unix(1_700_000_000, 0)) }

// NewFakeClockAt returns a clock at start, for a test whose times must
// agree with something it does not control (a record's real timestamp).
func NewFakeClockAt(start time.Time) *FakeClock { return &FakeClock{now: start} }

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *FakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}
