package workers

import (
	"context"
	"sync"
	"sync/atomic"
)

// ErrShuttingDown is the error of a request a draining dispatcher refused
// (WorkResult.Error, status unavailable): the node is stopping and takes no
// new work.
const ErrShuttingDown = "node is shutting down: it takes no new work"

// Gate counts the work in progress, admits new work until it is shut,
// and lets a caller wait until the work it admitted has ended. The zero
// value is an open gate with no work.
type Gate struct {
	n    atomic.Int64
	shut atomic.Bool
	mu   sync.Mutex    // guards idle
	idle chan struct{} // closed when n drops to zero; nil while nobody waits
}

// Enter admits one piece of work, or reports false once the gate is shut.
// Admitted work must call Leave.
func (g *Gate) Enter() bool {
	g.n.Add(1)
	// Checked after counting: a waiter that shut the gate either sees this
	// work counted, or this work sees the gate shut.
	if g.shut.Load() {
		g.Leave()
		return false
	}
	return true
}

// Leave ends one piece of admitted work.
func (g *Gate) Leave() {
	if g.n.Add(-1) == 0 {
		g.mu.Lock()
		if g.idle != nil {
			close(g.idle)
			g.idle = nil
		}
		g.mu.Unlock()
	}
}

// Close shuts the gate: Enter admits nothing more.
func (g *Gate) Close() { g.shut.Store(true) }

// Wait returns nil once no admitted work is left, or ctx's error when ctx
// ends first.
func (g *Gate) Wait(ctx context.Context) error {
	for {
		g.mu.Lock()
		if g.n.Load() == 0 {
			g.mu.Unlock()
			return nil
		}
		if g.idle == nil {
			g.idle = make(chan struct{})
		}
		idle := g.idle
		g.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Active returns the work in progress.
func (g *Gate) Active() int64 { return g.n.Load() }
