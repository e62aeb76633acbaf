package authority

import (
	"errors"
	"fmt"
)

// Sentinel errors every error of this package wraps, for callers that
// branch on what is wrong (a refusal reason, an exit code).
var (
	// ErrMalformed marks bytes that are not a statement of this package.
	ErrMalformed = errors.New("malformed")
	// ErrBadSignature marks a statement whose signature does not verify
	// under the authority it names: it was changed after signing.
	ErrBadSignature = errors.New("bad signature")
	// ErrOtherAuthority marks a statement signed by an authority other
	// than the network's.
	ErrOtherAuthority = errors.New("signed by another authority")
	// ErrWrongNetwork marks a statement about another network.
	ErrWrongNetwork = errors.New("wrong network")
	// ErrWrongPeer marks a certificate issued to another peer.
	ErrWrongPeer = errors.New("wrong peer")
	// ErrExpired marks a certificate past its expiry.
	ErrExpired = errors.New("expired")
)

// MalformedError says where encoded bytes stop making sense.
type MalformedError struct {
	// Kind is "membership certificate" or "revocation".
	Kind string
	// Offset is the byte (from 0) where the problem starts.
	Offset int
	// Field names the field read there, "" when none.
	Field string
	// Reason says what is wrong.
	Reason string
}

func (e *MalformedError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s: malformed at byte %d: %s", e.Kind, e.Offset, e.Reason)
	}
	return fmt.Sprintf("%s: malformed at byte %d (field %s): %s", e.Kind, e.Offset, e.Field, e.Reason)
}

// Unwrap returns ErrMalformed.
func (e *MalformedError) Unwrap() error { return ErrMalformed }

// verifyError is a verification failure: its message says what, it
// unwraps to its class.
type verifyError struct {
	class error
	msg   string
}

func (e *verifyError) Error() string { return e.msg }
func (e *verifyError) Unwrap() error { return e.class }

func verifyErrorf(class error, format string, args ...any) error {
	return &verifyError{class: class, msg: fmt.Sprintf(format, args...)}
}
