package selection

import "fmt"

// Outcome is what came of one attempt on one peer.
type Outcome uint8

const (
	// Success: the peer did the work and returned a result.
	Success Outcome = iota
	// Empty: the peer answered with nothing (it lacks the data asked for).
	// Above every head that is the answer; at or below a head it is a miss.
	Empty
	// Retryable: the attempt failed in a way another peer may not.
	Retryable
	// Permanent: the request itself cannot succeed; retrying elsewhere is pointless.
	Permanent
	// Busy: the peer refused at once because it is full or rate limited.
	Busy
	// Unreachable: the peer could not be dialed or did not answer at all.
	Unreachable
	// Cancelled: the attempt was abandoned (a hedge that lost the race, or a
	// request that ended); it says nothing about the peer and is not counted.
	Cancelled
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	Success:     "success",
	Empty:       "empty",
	Retryable:   "retryable-error",
	Permanent:   "permanent-error",
	Busy:        "busy",
	Unreachable: "unreachable",
	Cancelled:   "cancelled",
}

// String returns the outcome's name as it appears in results and logs.
func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// ParseOutcome returns the Outcome named s.
func ParseOutcome(s string) (Outcome, error) {
	for o, name := range outcomeNames {
		if name == s {
			return Outcome(o), nil
		}
	}
	return 0, fmt.Errorf("unknown outcome %q", s)
}

// isError reports whether the outcome is a failure of the peer for rating.
func (o Outcome) isError() bool { return o == Retryable || o == Unreachable }

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
