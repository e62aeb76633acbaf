package protocol

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/workmesh/workmesh/node/frame"
	"github.com/workmesh/workmesh/workers"
)

// The work protocol's wire format. Every message is one frame:
//
//	frame    = length:uint32 (big-endian) body      1 <= length <= limit
//	body     = request | accept | response
//	request  = 0x01 timeout_ms:uvarint accept_ms:uvarint id:str type:str payload:rest
//	accept   = 0x02
//	response = 0x03 outcome:u8 id:str error:str output:rest
//	         | 0x04 outcome:u8 id:str error:str in_flight:uvarint queued:uvarint output:rest
//	str      = length:uvarint bytes
//
// The length is a fixed four bytes so a reader takes it in one read and
// compares it with the limit before allocating the body. The payload and
// output run to the end of the body, so they need no length of their own
// and are never copied twice. Durations are relative (milliseconds left,
// rounded up), so the two peers' clocks need not agree. A zero timeout
// means "none given" (the server applies its own cap); a zero accept_ms
// means the client wants no accept frame. A response of kind 0x04 also
// carries the server's load as it answered (Response.Load): requests
// running and queued there, which the dispatcher rates it by, so that load
// needs no gossip of its own.
const (
	kindRequest  byte = 0x01
	kindAccept   byte = 0x02
	kindResponse byte = 0x03
	// kindLoadResponse is a response with the server's load in it.
	kindLoadResponse byte = 0x04

	// MaxRequestIDLen is the longest request ID, in bytes.
	MaxRequestIDLen = 128

	// maxHeaderLen bounds everything in a body but the payload or output.
	maxHeaderLen = 2 + 5*binary.MaxVarintLen64 + MaxRequestIDLen + workers.MaxTypeLen + workers.MaxErrorLen
	// maxWireMillis bounds durations on the wire (about 35 years), far
	// below the point where a time.Duration would overflow.
	maxWireMillis = 1 << 40
	// maxMaxPayload is the largest payload limit one can configure: 256 MiB.
	maxMaxPayload = 256 << 20
)

// wireCode is an outcome's byte on the wire. The bytes never change; a
// new outcome takes a new byte. Only the outcomes of work travel: a
// worker never answers Unreachable or Cancelled, which a dispatcher
// concludes on its own.
func wireCode(o workers.Outcome) byte {
	switch o {
	case workers.Success:
		return 1
	case workers.Empty:
		return 2
	case workers.RetryableError:
		return 3
	case workers.PermanentError:
		return 4
	case workers.Busy:
		return 5
	case workers.Unsupported:
		return 6
	case workers.Denied:
		return 7
	}
	return 0
}

// outcomeOfCode is the outcome of a byte on the wire, and false for a
// byte this version does not know.
func outcomeOfCode(b byte) (workers.Outcome, bool) {
	switch b {
	case 1:
		return workers.Success, true
	case 2:
		return workers.Empty, true
	case 3:
		return workers.RetryableError, true
	case 4:
		return workers.PermanentError, true
	case 5:
		return workers.Busy, true
	case 6:
		return workers.Unsupported, true
	case 7:
		return workers.Denied, true
	}
	return 0, false
}

// Request is one unit of work sent to a remote worker.
type Request struct {
	// ID identifies the request in logs and results; the response echoes
	// it. At most MaxRequestIDLen bytes.
	ID string
	// Type is the work type, a name the worker's registry holds.
	Type string
	// Payload is the input of the work.
	Payload []byte
	// Timeout is how long the worker may spend on the work. The client
	// lowers it to what is left of its context's deadline; the server caps
	// it. Zero means the client gives none.
	Timeout time.Duration
	// AcceptTimeout, when positive, asks the worker to confirm it took the
	// work (an accept frame) and bounds how long the client waits for that
	// first frame; it is WorkerResponseTimeout. Zero means no accept frame
	// is wanted and only Timeout bounds the wait.
	AcceptTimeout time.Duration
}

// Response is a remote worker's answer to one Request.
type Response struct {
	// ID is the ID of the request it answers.
	ID string
	// Result is the outcome, output and error message of the work.
	workers.Result
	// Load is the serving node's load when it answered; Known is false
	// when the response carried none.
	Load Load
}

// Load is a serving node's load: requests running and queued.
type Load struct {
	InFlight, Queued int
	Known            bool
}

// frameLimit is the largest body accepted when payloads are bounded by
// maxPayload.
func frameLimit(maxPayload int) int { return maxPayload + maxHeaderLen }

// durationMillis encodes d as whole milliseconds, rounded up so that a
// short positive budget never reads as "none".
func durationMillis(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return min(uint64(ms), maxWireMillis)
}

// beginFrame appends a frame header placeholder and the kind byte; endFrame
// fills the length in.
func beginFrame(dst []byte, kind byte) ([]byte, int) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, kind)
	return dst, start
}

func endFrame(dst []byte, start int) []byte {
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-frame.HeaderLen))
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// checkRequest validates what the encoder cannot fix itself.
func checkRequest(r *Request, maxPayload int) error {
	if err := workers.ValidateTypeName(r.Type); err != nil {
		return err
	}
	if len(r.ID) > MaxRequestIDLen {
		return fmt.Errorf("request ID of %d bytes is longer than %d: %w", len(r.ID), MaxRequestIDLen, ErrMalformed)
	}
	if len(r.Payload) > maxPayload {
		return fmt.Errorf("payload of %d bytes exceeds the limit of %d: %w", len(r.Payload), maxPayload, ErrPayloadTooLarge)
	}
	if r.Timeout < 0 || r.AcceptTimeout < 0 {
		return fmt.Errorf("negative timeout: %w", ErrMalformed)
	}
	return nil
}

// appendRequest appends r as one frame. r must have passed checkRequest.
func appendRequest(dst []byte, r *Request) []byte {
	dst, start := beginFrame(dst, kindRequest)
	dst = binary.AppendUvarint(dst, durationMillis(r.Timeout))
	dst = binary.AppendUvarint(dst, durationMillis(r.AcceptTimeout))
	dst = appendString(dst, r.ID)
	dst = appendString(dst, r.Type)
	dst = append(dst, r.Payload...)
	return endFrame(dst, start)
}

// appendAccept appends an accept frame.
func appendAccept(dst []byte) []byte {
	dst, start := beginFrame(dst, kindAccept)
	return endFrame(dst, start)
}

// appendResponse appends r as one frame, cutting an over-long error
// message and the ID to their limits. The caller bounds the output.
func appendResponse(dst []byte, r *Response) []byte {
	kind := kindResponse
	if r.Load.Known {
		kind = kindLoadResponse
	}
	dst, start := beginFrame(dst, kind)
	dst = append(dst, wireCode(r.Outcome))
	dst = appendString(dst, workers.Truncate(r.ID, MaxRequestIDLen))
	dst = appendString(dst, workers.Truncate(r.Error, workers.MaxErrorLen))
	if r.Load.Known {
		dst = binary.AppendUvarint(dst, uint64(max(r.Load.InFlight, 0)))
		dst = binary.AppendUvarint(dst, uint64(max(r.Load.Queued, 0)))
	}
	dst = append(dst, r.Output...)
	return endFrame(dst, start)
}

// decoder reads the fields of one frame body; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format+": %w", append(args, ErrMalformed)...)
	}
}

func (d *decoder) byte(field string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("%s: missing", field)
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint(field string) uint64 { return d.uvarintOf(field, "") }

// uvarintOf is uvarint for a field named field+suffix, the name put
// together only for an error: a decoded message allocates nothing for it.
func (d *decoder) uvarintOf(field, suffix string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("%s%s: bad varint", field, suffix)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) millis(field string) time.Duration {
	ms := d.uvarint(field)
	if ms > maxWireMillis {
		d.fail("%s: %d ms is out of range", field, ms)
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

func (d *decoder) string(field string, max int) string { return d.stringAs(field, max, "") }

// stringAs is string for a field expected to be want: when it is, want
// itself is returned and nothing is allocated.
func (d *decoder) stringAs(field string, max int, want string) string {
	n := d.uvarintOf(field, " length")
	if d.err != nil {
		return ""
	}
	if n > uint64(max) {
		d.fail("%s: %d bytes is longer than %d", field, n, max)
		return ""
	}
	if n > uint64(len(d.b)) {
		d.fail("%s: %d bytes but only %d left in the message", field, n, len(d.b))
		return ""
	}
	b := d.b[:n]
	d.b = d.b[n:]
	if string(b) == want {
		return want
	}
	return string(b)
}

// rest returns the remaining bytes (payload or output), or nil when none
// are left, so an empty output is always nil.
func (d *decoder) rest(max int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) > max {
		d.err = fmt.Errorf("%s of %d bytes exceeds the limit of %d: %w", what, len(d.b), max, ErrPayloadTooLarge)
		return nil
	}
	if len(d.b) == 0 {
		return nil
	}
	b := d.b
	d.b = nil
	return b
}

// decodeRequest parses a request body. The payload aliases body.
func decodeRequest(body []byte, maxPayload int) (Request, error) {
	return decodeRequestAs(body, maxPayload, "")
}

// decodeRequestAs is decodeRequest for a request expected to be of work
// type wantType (a stream's last one): when it is, the request's Type is
// wantType itself, not a copy.
func decodeRequestAs(body []byte, maxPayload int, wantType string) (Request, error) {
	d := decoder{b: body}
	if k := d.byte("kind"); d.err == nil && k != kindRequest {
		return Request{}, fmt.Errorf("frame kind 0x%02x where a request was expected: %w", k, ErrMalformed)
	}
	var r Request
	r.Timeout = d.millis("timeout")
	r.AcceptTimeout = d.millis("accept timeout")
	r.ID = d.string("request id", MaxRequestIDLen)
	r.Type = d.stringAs("work type", workers.MaxTypeLen, wantType)
	r.Payload = d.rest(maxPayload, "payload")
	if d.err != nil {
		return Request{}, fmt.Errorf("decode request: %w", d.err)
	}
	return r, nil
}

// decodeServerFrame parses a frame sent by a server: an accept frame
// (accepted is true) or a response. The output aliases body.
func decodeServerFrame(body []byte, maxPayload int) (resp Response, accepted bool, err error) {
	return decodeServerFrameFor(body, maxPayload, "")
}

// decodeServerFrameFor is decodeServerFrame for the response to the
// request wantID: its ID, when it is that, costs no allocation.
func decodeServerFrameFor(body []byte, maxPayload int, wantID string) (resp Response, accepted bool, err error) {
	d := decoder{b: body}
	switch k := d.byte("kind"); {
	case d.err != nil:
	case k == kindAccept:
		if len(d.b) != 0 {
			return Response{}, false, fmt.Errorf("decode accept: %d unexpected bytes: %w", len(d.b), ErrMalformed)
		}
		return Response{}, true, nil
	case k == kindLoadResponse:
		resp.Load.Known = true
	case k != kindResponse:
		return Response{}, false, fmt.Errorf("frame kind 0x%02x where a response was expected: %w", k, ErrMalformed)
	}
	code := d.byte("outcome")
	o, known := outcomeOfCode(code)
	if d.err == nil && !known {
		return Response{}, false, fmt.Errorf("decode response: outcome %d: %w", code, workers.ErrUnknownOutcome)
	}
	resp.Outcome = o
	resp.ID = d.stringAs("request id", MaxRequestIDLen, wantID)
	resp.Error = d.string("error", workers.MaxErrorLen)
	if resp.Load.Known {
		resp.Load.InFlight = loadCount(d.uvarint("in flight"))
		resp.Load.Queued = loadCount(d.uvarint("queued"))
	}
	resp.Output = d.rest(maxPayload, "output")
	if d.err != nil {
		return Response{}, false, fmt.Errorf("decode response: %w", d.err)
	}
	return resp, false, nil
}

// loadCount bounds a count of a peer's load read from the wire to what an
// int holds on every platform.
func loadCount(v uint64) int { return int(min(v, 1<<31-1)) }

// bufPool recycles the buffers frames are encoded into. Only small buffers
// go back, so one large payload does not pin a megabyte per P.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

const maxPooledBuf = 64 << 10

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > maxPooledBuf {
		return
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

// largeWrite is the payload or output size from which a frame is written
// as its head and then the caller's bytes, instead of being copied into
// one buffer first.
const largeWrite = 16 << 10

// writeRequest writes r as one frame on w.
func writeRequest(w io.Writer, r *Request) error {
	if len(r.Payload) < largeWrite {
		buf := getBuf()
		*buf = appendRequest((*buf)[:0], r)
		_, err := w.Write(*buf)
		putBuf(buf)
		return err
	}
	head := *r
	head.Payload = nil
	return writeFrame(w, appendRequest, &head, r.Payload)
}

// writeResponse writes r as one frame on w.
func writeResponse(w io.Writer, r *Response) error {
	if len(r.Output) < largeWrite {
		buf := getBuf()
		*buf = appendResponse((*buf)[:0], r)
		_, err := w.Write(*buf)
		putBuf(buf)
		return err
	}
	head := *r
	head.Output = nil
	return writeFrame(w, appendResponse, &head, r.Output)
}

// writeFrame writes the frame appendHead makes of head, whose last field
// (the payload or output) is left out, with its length counting tail, then
// tail itself.
func writeFrame[M any](w io.Writer, appendHead func([]byte, *M) []byte, head *M, tail []byte) error {
	buf := getBuf()
	defer putBuf(buf)
	*buf = appendHead((*buf)[:0], head)
	b := *buf
	binary.BigEndian.PutUint32(b, uint32(len(b)-frame.HeaderLen+len(tail)))
	if _, err := w.Write(b); err != nil {
		return err
	}
	_, err := w.Write(tail)
	return err
}
