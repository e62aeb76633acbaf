package workers

import "github.com/workmesh/workmesh/node"

// LocalState tells the node what its local worker can take and is doing,
// for the NodeData it advertises and the health answers it gives.
type LocalState struct {
	pool *Pool
}

// NewLocalState returns the node-facing view of pool.
func NewLocalState(pool *Pool) LocalState { return LocalState{pool: pool} }

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
