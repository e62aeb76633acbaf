package testkit

import (
	"reflect"
	"testing"
	"time"
)

// The interval between two checks of a condition starts short, so that a
// condition about to hold is seen at once, and doubles up to a bound, so
// that a long wait (one that runs a command on every check) does not take
// the CPU from what it waits for. (Variables only for testkit's own tests.)
var (
	firstPoll = time.Millisecond
	maxPoll   = 50 * time.Millisecond
)

// WaitFor waits until cond returns nil and returns how long that took. It
// fails the test, naming what it waited for and cond's last error, if cond
// does not hold within the given time. cond is checked again at once when
// a channel one of wake returns is closed (as node.PeerTable.Changed's
// is), so that a condition on state that announces its changes is seen as
// it changes, and otherwise at a short interval for changes that announce
// nothing.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() error, wake ...func() <-chan struct{}) time.Duration {
	t.Helper()
	took, err := Poll(within, cond, wake...)
	if err != nil {
		t.Fatalf("%s: not within %s: %v", what, within, err)
	}
	return took
}

// Poll is WaitFor that leaves the failing to its caller, for a test whose
// message must add what is known only when the wait failed (a goroutine
// dump, a process's log) or that goes on after the wait. It returns how
// long it waited and, if cond did not hold within the given time, cond's
// last error. cond is checked once more as the time runs out.
func Poll(within time.Duration, cond func() error, wake ...func() <-chan struct{}) (time.Duration, error) {
	start := time.Now()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	// Cases: the deadline, the next check, then one per wake channel.
	cases := make([]reflect.SelectCase, 2+len(wake))
	cases[0] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(deadline.C)}
	interval := firstPoll
	for expired := false; ; {
		// The channels are taken before cond is checked, so that a change
		// between the check and the wait is not missed.
		for i, w := range wake {
			cases[2+i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w())}
		}
		err := cond()
		if err == nil {
			return time.Since(start), nil
		}
		if expired {
			return time.Since(start), err
		}
		next := time.NewTimer(interval)
		cases[1] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(next.C)}
		chosen, _, _ := reflect.Select(cases)
		next.Stop()
		switch chosen {
		case 0:
			expired = true
		case 1:
			interval = min(2*interval, maxPoll)
		}
	}
}
