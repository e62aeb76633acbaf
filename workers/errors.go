package workers

import (
	"errors"

	"github.com/workmesh/workmesh/selection"
)

// Sentinel errors, for the cases callers branch on. They are always wrapped
// with context; test them with errors.Is.
var (
	// ErrInvalidType means a work type name is empty, too long or uses
	// characters other than letters, digits, '.', '_' and '-'.
	ErrInvalidType = errors.New("invalid work type name")
	// ErrDuplicateType means a handler is already registered under the name.
	ErrDuplicateType = errors.New("work type already registered")
	// ErrUnknownOutcome means an outcome this version does not know (on the
	// wire, or in text).
	ErrUnknownOutcome = selection.ErrUnknownOutcome
	// ErrDropped, as the cause of a request's context, means the request
	// is to be dropped without an answer: the work server resets its
	// stream (fault injection drops work this way).
	ErrDropped = errors.New("dropped")
)
