package workers

import (
	"fmt"
	"unicode/utf8"

	"github.com/workmesh/workmesh/selection"
)

// Outcome is how one execution of work ended. It is the selection
// core's type, the one vocabulary from the wire to the API's answer; the
// names below are the same values, for handlers to write.
type Outcome = selection.Outcome

// The outcomes of work (see selection.Outcome for each). A worker answers
// one of the first seven; Unreachable and Cancelled only a dispatcher
// concludes.
const (
	Success        = selection.Success
	Empty          = selection.Empty
	RetryableError = selection.RetryableError
	PermanentError = selection.PermanentError
	Busy           = selection.Busy
	Unsupported    = selection.Unsupported
	Denied         = selection.Denied
	Unreachable    = selection.Unreachable
	Cancelled      = selection.Cancelled
	NumOutcomes    = selection.NumOutcomes
)

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
