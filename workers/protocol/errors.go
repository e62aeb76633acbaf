package protocol

import (
	"errors"

	"github.com/workmesh/workmesh/node/frame"
)

// Sentinel errors of the work protocol, for the cases callers branch on.
// They are always wrapped with context; test them with errors.Is.
var (
	// ErrFrameTooLarge means a wire message claims, or would need, more
	// bytes than the limit. It is checked before anything is allocated.
	ErrFrameTooLarge = frame.ErrTooLarge
	// ErrPayloadTooLarge means a request payload or a response output is
	// larger than the configured maximum payload.
	ErrPayloadTooLarge = errors.New("payload too large")
	// ErrTruncated means the stream ended in the middle of a message.
	ErrTruncated = frame.ErrTruncated
	// ErrMalformed means a message is not a valid work-protocol message:
	// an unknown kind, a bad length, a field over its limit, a response to
	// another request.
	ErrMalformed = frame.ErrMalformed

	// ErrAcceptTimeout means the remote worker sent nothing (neither an
	// accept frame nor the response) within the request's AcceptTimeout.
	ErrAcceptTimeout = errors.New("remote worker did not accept the work in time")
	// ErrClientGone is the cause of a served request's context when the
	// requesting peer reset the stream or its connection went away.
	ErrClientGone = errors.New("requesting peer went away")
	// ErrServerClosed is the cause of a served request's context when the
	// work protocol server is closed.
	ErrServerClosed = errors.New("work protocol server closed")
)
