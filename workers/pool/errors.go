package pool

import "errors"

// Sentinel errors of the local worker; test them with errors.Is.
var (
	// ErrPoolClosed means the local worker pool was closed; work that was
	// queued or submitted afterwards did not run.
	ErrPoolClosed = errors.New("local worker closed")
)
