package selection

import (
	"errors"
	"fmt"
)

// Outcome is how one attempt of work on one worker ended: what the worker
// answered, or what the dispatcher concluded when it got no answer. It is
// the one vocabulary from the work protocol to the API's answer (the
// workers package and the API's bodies use this type), and it is what
// rating and the plan branch on. The zero value is not an outcome: a
// result that was never filled in must not read as a success. Values may
// be added, never renumbered (the work protocol maps them to its own
// bytes, and arrays indexed by outcome have NumOutcomes elements).
type Outcome uint8

// The outcomes.
const (
	// Success: the work ran and produced its output.
	Success Outcome = iota + 1
	// Empty: the work ran and there was nothing to return (no data at the
	// requested position). Above every head that is the answer; at or
	// below a head it is a miss.
	Empty
	// RetryableError: the attempt failed in a way another attempt (here
	// later, or on another worker) may not: a timeout, a cancellation, a
	// worker shutting down.
	RetryableError
	// PermanentError: the request itself cannot succeed anywhere (an
	// invalid payload, a handler that panicked on it); retrying elsewhere
	// is pointless.
	PermanentError
	// Busy: the worker refused at once because it is full or rate
	// limited; it says nothing about the request.
	Busy
	// Unsupported: the worker does not serve the work type. It is final
	// for this worker but says nothing about the request, so another may
	// serve it (the worker's advertisement was stale).
	Unsupported
	// Denied: the worker refused the requesting peer (its access check
	// said no). Like Unsupported it is final for this worker only.
	Denied
	// Unreachable: the worker could not be dialed or did not answer at
	// all. Only a dispatcher concludes it; no worker answers it.
	Unreachable
	// Cancelled: the attempt was abandoned (a hedge that lost the race, or
	// a request that ended); it says nothing about the worker and is not
	// counted. Only a dispatcher concludes it.
	Cancelled

	// NumOutcomes is one past the last outcome; keep it last.
	NumOutcomes
)

var outcomeNames = [NumOutcomes]string{
	Success:        "success",
	Empty:          "empty",
	RetryableError: "retryable-error",
	PermanentError: "permanent-error",
	Busy:           "busy",
	Unsupported:    "unsupported",
	Denied:         "denied",
	Unreachable:    "unreachable",
	Cancelled:      "cancelled",
}

// ErrUnknownOutcome means an outcome this version does not know (on the
// wire, or in text).
var ErrUnknownOutcome = errors.New("unknown outcome")

// String returns the outcome's name as it appears in results and logs.
func (o Outcome) String() string {
	if o.Valid() {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Valid reports whether o is one of the defined outcomes.
func (o Outcome) Valid() bool { return o > 0 && o < NumOutcomes }

// MarshalText encodes the outcome by name, so JSON carries "busy", not 5.
func (o Outcome) MarshalText() ([]byte, error) {
	if !o.Valid() {
		return nil, fmt.Errorf("marshal %v: %w", o, ErrUnknownOutcome)
	}
	return []byte(outcomeNames[o]), nil
}

// UnmarshalText decodes an outcome from its name.
func (o *Outcome) UnmarshalText(b []byte) error {
	parsed, err := ParseOutcome(string(b))
	if err != nil {
		return err
	}
	*o = parsed
	return nil
}

// ParseOutcome returns the Outcome named s.
func ParseOutcome(s string) (Outcome, error) {
	for o := Success; o < NumOutcomes; o++ {
		if outcomeNames[o] == s {
			return o, nil
		}
	}
	return 0, fmt.Errorf("outcome %q: %w", s, ErrUnknownOutcome)
}

// isError reports whether the outcome is a failure of the worker for
// rating: it failed the work, could not be reached, or turned out not to
// take it after all.
func (o Outcome) isError() bool {
	return o == RetryableError || o == Unreachable || o == Unsupported || o == Denied
}

// Verdict tells the dispatcher what to do after an attempt was reported.
type Verdict uint8

const (
	// Done: the reported result is the request's answer (a success, a
	// permanent error, or an empty answer beyond every head). Cancel any
	// other attempt still running.
	Done Verdict = iota
	// Retry: ask the plan for the next peer (Plan.Next); the budget allows it.
	Retry
	// Exhausted: no further remote attempt is allowed; fall back to the local
	// worker if Plan.FallbackAllowed says so.
	Exhausted
	// Ignored: the report changed nothing (a cancelled hedge, or an attempt
	// that finished after the request was already decided).
	Ignored
)

var verdictNames = [...]string{Done: "done", Retry: "retry", Exhausted: "exhausted", Ignored: "ignored"}

// String returns the verdict's name.
func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return fmt.Sprintf("verdict(%d)", uint8(v))
}
