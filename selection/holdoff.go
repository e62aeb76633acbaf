package selection

import "time"

// maxHoldOff bounds how long a peer's Retry-After keeps it a last resort.
const maxHoldOff = 5 * time.Minute

// HoldOff records that the picked peer asked, in a busy answer, to be left
// alone for d for this plan's work type (a local service's Retry-After, as
// the worker passed it on): until then every plan of that work type picks
// it only as a last resort, as a peer without free capacity, so requests
// go to the others instead of collecting its refusals. Its other work
// types are not affected.
func (p *Plan) HoldOff(pk Pick, d time.Duration) {
	if d <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.tried {
		if t.e.id == pk.Peer {
			t.e.stats.hold(p.req.WorkType, p.s.clock.Now().Add(min(d, maxHoldOff)))
			return
		}
	}
}

// hold keeps the peer a last resort for workType until until.
func (s *stats) hold(workType string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.heldUntil == nil {
		s.heldUntil = make(map[string]time.Time)
	}
	if _, ok := s.heldUntil[workType]; !ok {
		s.held.Add(1)
	}
	s.heldUntil[workType] = until
}

// heldFor reports whether the peer asked to be left alone for workType at
// now; an ended hold is forgotten.
func (s *stats) heldFor(workType string, now time.Time) bool {
	if s.held.Load() == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	until, ok := s.heldUntil[workType]
	if !ok {
		return false
	}
	if !now.Before(until) {
		delete(s.heldUntil, workType)
		s.held.Add(-1)
		return false
	}
	return true
}
