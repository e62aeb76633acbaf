package pool

import (
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/workers"
)

// LocalState tells the node what its local worker can take and is doing,
// for the NodeData it advertises and the health answers it gives.
type LocalState struct {
	pool   *Pool
	checks []workers.HealthChecker
}

// NewLocalState returns the node-facing view of pool. Its health is that of
// every registered work type that is a workers.HealthChecker, and of checks.
func NewLocalState(pool *Pool, checks ...workers.HealthChecker) LocalState {
	return LocalState{pool: pool, checks: checks}
}

// Health returns the first failing check: the extra checks first (fault
// injection decides a ping's fate before anything else), then the work
// types in name order. Nil means the worker can work. It is the node's
// health check (node.WithHealthCheck); who pings makes no difference.
func (s LocalState) Health(peer.ID) error {
	for _, c := range s.checks {
		if c == nil {
			continue
		}
		if err := c.Healthy(); err != nil {
			return err
		}
	}
	reg := s.pool.Registry()
	for _, name := range reg.Names() {
		h, _ := reg.Get(name)
		if hc, ok := h.(workers.HealthChecker); ok {
			if err := hc.Healthy(); err != nil {
				return fmt.Errorf("work type %s: %w", name, err)
			}
		}
	}
	return nil
}

// Capacity returns the pool's concurrency and queue size.
func (s LocalState) Capacity() node.Capacity {
	st := s.pool.Stats()
	return node.Capacity{MaxConcurrent: st.MaxConcurrent, QueueSize: st.QueueSize}
}

// Load returns the requests running and waiting now.
func (s LocalState) Load() node.Load {
	st := s.pool.Stats()
	return node.Load{InFlight: st.InFlight, Queued: st.Queued}
}

// Heads returns the head of every served work type that reports one.
func (s LocalState) Heads() map[string]uint64 {
	reg := s.pool.Registry()
	var heads map[string]uint64
	for _, name := range reg.Names() {
		if h, ok := reg.Head(name); ok {
			if heads == nil {
				heads = make(map[string]uint64)
			}
			heads[name] = h
		}
	}
	return heads
}
