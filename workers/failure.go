package workers

import (
	"encoding/binary"
	"time"
)

// MaxDetailText bounds each text of a Detail (a command's stderr, a
// service's response body), in bytes; longer texts are cut when encoded.
const MaxDetailText = 2048

// Detail is what a run of an operator's own work type adds to a failed
// result beyond the error message: the exit code and the last lines of
// stderr of a command, the HTTP status and the body of a local service,
// and how long a busy service asked to be left alone. The submitter sees
// it next to the error, so that a failure says why in the program's own
// words.
//
// A failed result has no output of its own, so its Output carries the
// Detail, encoded behind a marker (WithDetail, DetailOf): the work
// protocol carries it as it carries any output, and Result, which every
// stream's goroutine holds on its stack, does not grow.
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

// detailMarker starts the Output of a failed result that carries a
// Detail; no handler's failure output starts with it by chance.
const detailMarker = "\x00workmesh.detail.v1\x00"

// WithDetail returns r, a result that is not a Success or Empty, carrying
// d in its Output. A successful result is returned as it is.
func (r Result) WithDetail(d Detail) Result {
	if r.Outcome == Success || r.Outcome == Empty {
		return r
	}
	b := append([]byte(nil), detailMarker...)
	var exit, status uint64
	var flags uint64
	if d.HasExitCode && d.ExitCode >= 0 {
		flags, exit = 1, uint64(d.ExitCode)
	}
	if d.HTTPStatus > 0 {
		status = uint64(d.HTTPStatus)
	}
	b = binary.AppendUvarint(b, flags)
	b = binary.AppendUvarint(b, exit)
	b = binary.AppendUvarint(b, status)
	b = binary.AppendUvarint(b, uint64(max(d.RetryAfter, 0)/time.Millisecond))
	for _, s := range []string{Truncate(d.Stderr, MaxDetailText), Truncate(d.Body, MaxDetailText)} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	r.Output = b
	return r
}

// DetailOf returns the Detail a failed result carries, or nil when it
// carries none (or its Output is not one WithDetail wrote).
func DetailOf(r Result) *Detail {
	if r.Outcome == Success || r.Outcome == Empty || len(r.Output) <= len(detailMarker) || string(r.Output[:len(detailMarker)]) != detailMarker {
		return nil
	}
	b := r.Output[len(detailMarker):]
	var nums [4]uint64
	for i := range nums {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return nil
		}
		nums[i], b = v, b[n:]
	}
	var texts [2]string
	for i := range texts {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > MaxDetailText || l > uint64(len(b)-n) {
			return nil
		}
		texts[i], b = string(b[n:n+int(l)]), b[n+int(l):]
	}
	if len(b) != 0 || nums[1] > 1<<16 || nums[2] > 999 || nums[3] > 1<<32 {
		return nil
	}
	d := &Detail{HTTPStatus: int(nums[2]), RetryAfter: time.Duration(nums[3]) * time.Millisecond, Stderr: texts[0], Body: texts[1]}
	if nums[0]&1 != 0 {
		d.HasExitCode, d.ExitCode = true, int(nums[1])
	}
	return d
}
