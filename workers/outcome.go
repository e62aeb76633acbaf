package workers

import (
	"fmt"
	"unicode/utf8"
)

// Outcome is how one execution of work ended. It is what the dispatcher,
// the rating and the caller branch on, and it travels on the wire as one
// byte, so its values never change; new outcomes are only ever appended.
type Outcome uint8

// The outcomes of work. The zero value is not an outcome: a Result that
// was never filled in must not read as a success.
const (
	// Success means the work ran and produced its output.
	Success Outcome = iota + 1
	// Empty means the work ran and there was nothing to return (no data at
	// the requested position, for example). It is not an error; whether it
	// is the final answer is the dispatcher's call (the beyond-head rule).
	Empty
	// RetryableError means this attempt failed in a way another attempt
	// (here later, or on another worker) may not: a timeout, a
	// cancellation, a worker shutting down.
	RetryableError
	// PermanentError means the request itself cannot succeed anywhere:
	// an invalid payload, or a handler that panicked on it.
	PermanentError
	// Busy means the worker did not take the work because its queue is
	// full; it says nothing about the request.
	Busy
	// Unsupported means the worker does not serve the work type. It is
	// final for this worker but says nothing about the request, so a
	// dispatcher may try another worker (the peer's advertisement was stale).
	Unsupported
	// Denied means the worker refused the requesting peer (the access
	// check said no). Like Unsupported it is final for this worker only.
	Denied

	// NumOutcomes is one past the last outcome; keep it last. Arrays
	// indexed by outcome have this length.
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
}

// String returns the outcome's kebab-case name, as used in logs and the API.
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
	for i := Outcome(1); i < NumOutcomes; i++ {
		if outcomeNames[i] == string(b) {
			*o = i
			return nil
		}
	}
	return fmt.Errorf("outcome %q: %w", b, ErrUnknownOutcome)
}

// Result is what one execution of work produced: the outcome, the output
// (for Success; may be empty) and, for every other outcome but Empty, a
// message saying why.
type Result struct {
	// Outcome is how the execution ended.
	Outcome Outcome
	// Output is the handler's output; meaningful for Success.
	Output []byte
	// Error says why the work did not succeed; empty for Success and Empty.
	Error string
}

// Limits of a result, as the work protocol carries it.
const (
	// MaxErrorLen is the longest error message of a result, in bytes;
	// longer messages are cut (at a rune boundary) when encoded.
	MaxErrorLen = 4096
	// DefaultMaxPayload is the default limit on a request payload and a
	// result's output: 1 MiB.
	DefaultMaxPayload = 1 << 20
)

// OK returns a Success result carrying out.
func OK(out []byte) Result { return Result{Outcome: Success, Output: out} }

// Fail returns a result of the given outcome whose message is formatted
// like fmt.Sprintf.
func Fail(o Outcome, format string, args ...any) Result {
	return Result{Outcome: o, Error: fmt.Sprintf(format, args...)}
}

// Truncate shortens s to at most n bytes without splitting a rune, so a
// message cut to fit the wire limit is still valid text.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "..."
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
