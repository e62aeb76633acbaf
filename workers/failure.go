package workers

import "time"

// MaxDetailText bounds each text of a Detail (a command's stderr, a
// service's response body), in bytes; longer texts are cut when encoded.
const MaxDetailText = 2048

// Detail is what a run of an operator's own work type adds to its result
// beyond the error message: the exit code and the last lines of stderr of
// a command, the HTTP status and the body of a local service, and how long
// a busy service asked to be left alone. The submitter sees it next to the
// error, so that a failure says why in the program's own words.
type Detail struct {
	// ExitCode is the command's exit code; meaningful when HasExitCode.
	ExitCode int
	// HasExitCode tells an exit code of 0 from none at all.
	HasExitCode bool
	// Stderr is the end of the command's standard error, at most
	// MaxDetailText bytes.
	Stderr string
	// HTTPStatus is the local service's HTTP status; 0 means none.
	HTTPStatus int
	// Body is the start of the local service's response body, at most
	// MaxDetailText bytes.
	Body string
	// RetryAfter is the wait a busy service asked for (Retry-After); 0
	// means none.
	RetryAfter time.Duration
}

// Empty reports whether d carries nothing.
func (d *Detail) Empty() bool {
	return d == nil || !d.HasExitCode && d.Stderr == "" && d.HTTPStatus == 0 && d.Body == "" && d.RetryAfter == 0
}

// WithDetail returns r carrying d.
func (r Result) WithDetail(d Detail) Result {
	r.Detail = &d
	return r
}
