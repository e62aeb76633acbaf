package selection

import (
	"errors"
	"fmt"
	"time"
)

// A peer's liveness states, the moves between them that the table
// (allowedFrom) allows, and what each move resets.

// State is a peer's liveness state.
type State int32

const (
	// StateAlive: the peer answers its polls; it may be selected. A failed poll
	// adds one to its failure count, a good one takes one away.
	StateAlive State = iota
	// StateUnreachable: the failure count reached poll-failure-threshold, or a
	// probe failed. The peer is not selected; it is redialed with a doubling
	// backoff.
	StateUnreachable
	// StateProbing: a redial succeeded; the peer must answer
	// poll-success-threshold polls in a row before it is StateAlive again. Any
	// failure sends it back to StateUnreachable. It is not selected meanwhile.
	StateProbing
	numStates
)

var stateNames = [numStates]string{StateAlive: "alive", StateUnreachable: "unreachable", StateProbing: "probing"}

// String returns the state's name.
func (s State) String() string {
	if s >= 0 && s < numStates && stateNames[s] != "" {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", int32(s))
}

// States lists every state, in order.
func States() []State {
	out := make([]State, numStates)
	for i := range out {
		out[i] = State(i)
	}
	return out
}

// allowedFrom is the transition table: for each target state, the states it
// may be entered from. Anything else is refused and leaves the state as it is.
var allowedFrom = [numStates][]State{
	StateAlive:       {StateProbing, StateUnreachable}, // StateUnreachable -> StateAlive only when no success threshold is set.
	StateUnreachable: {StateAlive, StateProbing},
	StateProbing:     {StateUnreachable},
}

// ErrTransition is returned for a transition the table does not allow.
var ErrTransition = errors.New("liveness transition not allowed")

// Transition records one change of state.
type Transition struct {
	Peer     string
	From, To State
	// First: the peer's first good poll made it alive (AwaitFirstPoll),
	// no recovery.
	First bool
}

// transition moves h to target if the table allows it from its current state.
func transition(h *health, target State) error {
	from := h.load()
	for _, s := range allowedFrom[target] {
		if s == from {
			h.state.Store(int32(target))
			return nil
		}
	}
	return fmt.Errorf("%w: %s -> %s", ErrTransition, from, target)
}

func (l *Liveness) toAlive(_ string, h *health) error {
	if err := transition(h, StateAlive); err != nil {
		return err
	}
	h.failures, h.successes, h.redials = 0, 0, 0
	h.fresh, h.reason = false, ""
	return nil
}

func (l *Liveness) toUnreachable(_ string, h *health, now time.Time) error {
	if err := transition(h, StateUnreachable); err != nil {
		return err
	}
	h.failures, h.successes = 0, 0
	h.nextAttempt = now.Add(l.backoff(h.redials))
	return nil
}

func (l *Liveness) toProbing(_ string, h *health) error {
	if err := transition(h, StateProbing); err != nil {
		return err
	}
	h.successes, h.redials = 0, 0
	return nil
}

// setState forces a transition through the table; tests use it to walk the
// transition matrix.
func (l *Liveness) setState(id string, target State) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.handleLocked(id)
	defer l.reschedLocked(h)
	switch target {
	case StateAlive:
		return l.toAlive(id, h)
	case StateUnreachable:
		return l.toUnreachable(id, h, l.clock.Now())
	case StateProbing:
		return l.toProbing(id, h)
	}
	return fmt.Errorf("%w: unknown target %s", ErrTransition, target)
}
