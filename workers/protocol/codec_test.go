package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/node/frame"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/workertest"
)

func TestCodec_RequestRoundTrip(t *testing.T) {
	tests := []Request{
		{ID: "r-1", Type: "echo", Payload: []byte("hello"), Timeout: 1500 * time.Millisecond, AcceptTimeout: 250 * time.Millisecond},
		{ID: "", Type: "sha256", Payload: nil},
		{ID: strings.Repeat("i", MaxRequestIDLen), Type: strings.Repeat("t", workers.MaxTypeLen), Payload: bytes.Repeat([]byte{0, 0xff}, 1000), Timeout: time.Hour},
		{ID: "sub-ms", Type: "sleep", Payload: []byte("1ms"), Timeout: 10 * time.Microsecond}, // rounds up, never to "none"
	}
	for _, want := range tests {
		workertest.Must(t, checkRequest(&want, workers.DefaultMaxPayload))
		msg := appendRequest([]byte("prefix"), &want)[len("prefix"):]
		body, _, err := frame.Read(bytes.NewReader(msg), frameLimit(workers.DefaultMaxPayload), nil)
		workertest.Must(t, err)
		got, err := decodeRequest(body, workers.DefaultMaxPayload)
		workertest.Must(t, err)
		wantTimeout := (want.Timeout + time.Millisecond - 1).Truncate(time.Millisecond)
		if got.ID != want.ID || got.Type != want.Type || !bytes.Equal(got.Payload, want.Payload) ||
			got.Timeout != wantTimeout || got.AcceptTimeout != want.AcceptTimeout {
			t.Errorf("round trip of %q: got %+v", want.ID, got)
		}
	}
}

func TestCodec_ResponseRoundTrip(t *testing.T) {
	for o := workers.Success; o <= workers.Denied; o++ { // the outcomes a worker answers
		want := Response{ID: "r-" + o.String(), Result: workers.Result{Outcome: o, Output: []byte("out " + o.String()), Error: "why " + o.String()}}
		msg := appendResponse(nil, &want)
		body, _, err := frame.Read(bytes.NewReader(msg), frameLimit(workers.DefaultMaxPayload), nil)
		workertest.Must(t, err)
		got, accepted, err := decodeServerFrame(body, workers.DefaultMaxPayload)
		workertest.Must(t, err)
		if accepted || got.ID != want.ID || got.Outcome != o || string(got.Output) != string(want.Output) || got.Error != want.Error {
			t.Errorf("round trip of %v: got %+v accepted=%v", o, got, accepted)
		}
	}
	// An over-long error message is cut to fit, not refused.
	long := Response{ID: "x", Result: workers.Result{Outcome: workers.PermanentError, Error: strings.Repeat("e", 3*workers.MaxErrorLen)}}
	body, _, err := frame.Read(bytes.NewReader(appendResponse(nil, &long)), frameLimit(workers.DefaultMaxPayload), nil)
	workertest.Must(t, err)
	got, _, err := decodeServerFrame(body, workers.DefaultMaxPayload)
	workertest.Must(t, err)
	if len(got.Error) > workers.MaxErrorLen || !strings.HasSuffix(got.Error, "...") {
		t.Errorf("long error came back with %d bytes", len(got.Error))
	}

	body, _, err = frame.Read(bytes.NewReader(appendAccept(nil)), frameLimit(workers.DefaultMaxPayload), nil)
	workertest.Must(t, err)
	if _, accepted, err := decodeServerFrame(body, workers.DefaultMaxPayload); err != nil || !accepted {
		t.Errorf("accept frame: accepted=%v err=%v", accepted, err)
	}
}

// frameOf wraps body in a frame header.
func frameOf(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

func TestCodec_Truncated(t *testing.T) {
	req := Request{ID: "r", Type: "echo", Payload: []byte("payload")}
	msg := appendRequest(nil, &req)
	for n := 1; n < len(msg); n++ {
		_, _, err := frame.Read(bytes.NewReader(msg[:n]), frameLimit(workers.DefaultMaxPayload), nil)
		if !errors.Is(err, ErrTruncated) {
			t.Fatalf("frame cut at %d of %d bytes: error = %v, want ErrTruncated", n, len(msg), err)
		}
	}
	if _, _, err := frame.Read(bytes.NewReader(nil), frameLimit(workers.DefaultMaxPayload), nil); !errors.Is(err, io.EOF) {
		t.Errorf("no bytes at all: error = %v, want io.EOF", err)
	}
}

func TestCodec_MalformedBodies(t *testing.T) {
	validReq := appendRequest(nil, &Request{ID: "id", Type: "echo", Payload: []byte("p")})[frame.HeaderLen:]
	validResp := appendResponse(nil, &Response{ID: "id", Result: workers.OK([]byte("o"))})[frame.HeaderLen:]
	uv := func(v uint64) []byte { return binary.AppendUvarint(nil, v) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

	requests := []struct {
		name string
		body []byte
		want error
	}{
		{"wrong kind", cat([]byte{kindResponse}, validReq[1:]), ErrMalformed},
		{"only a kind", []byte{kindRequest}, ErrMalformed},
		{"bad varint", cat([]byte{kindRequest}, bytes.Repeat([]byte{0xff}, 11)), ErrMalformed},
		{"timeout out of range", cat([]byte{kindRequest}, uv(maxWireMillis+1), uv(0), uv(0), uv(4), []byte("echo")), ErrMalformed},
		{"id longer than its limit", cat([]byte{kindRequest}, uv(0), uv(0), uv(MaxRequestIDLen+1), make([]byte, MaxRequestIDLen+1), uv(4), []byte("echo")), ErrMalformed},
		{"type longer than its limit", cat([]byte{kindRequest}, uv(0), uv(0), uv(0), uv(workers.MaxTypeLen+1), make([]byte, workers.MaxTypeLen+1)), ErrMalformed},
		{"string past the end", cat([]byte{kindRequest}, uv(0), uv(0), uv(50), []byte("short")), ErrMalformed},
		{"payload over the limit", cat(validReq, make([]byte, 10)), ErrPayloadTooLarge},
	}
	for _, tt := range requests {
		if _, err := decodeRequest(tt.body, 5); !errors.Is(err, tt.want) {
			t.Errorf("request %s: error = %v, want %v", tt.name, err, tt.want)
		}
	}

	responses := []struct {
		name string
		body []byte
		want error
	}{
		{"unknown outcome", cat([]byte{kindResponse, 8}, validResp[2:]), workers.ErrUnknownOutcome},
		{"a dispatcher's outcome", cat([]byte{kindResponse, 255}, validResp[2:]), workers.ErrUnknownOutcome},
		{"zero outcome", cat([]byte{kindResponse, 0}, validResp[2:]), workers.ErrUnknownOutcome},
		{"outcome 255", cat([]byte{kindResponse, 255}, validResp[2:]), workers.ErrUnknownOutcome},
		{"request kind", validReq, ErrMalformed},
		{"unknown kind", []byte{0x7f}, ErrMalformed},
		{"accept with extra bytes", []byte{kindAccept, 1}, ErrMalformed},
		{"missing outcome", []byte{kindResponse}, ErrMalformed},
		{"error longer than its limit", cat([]byte{kindResponse, byte(workers.Success)}, uv(0), uv(workers.MaxErrorLen+1), make([]byte, workers.MaxErrorLen+1)), ErrMalformed},
		{"output over the limit", cat(validResp, make([]byte, 10)), ErrPayloadTooLarge},
	}
	for _, tt := range responses {
		if _, _, err := decodeServerFrame(tt.body, 5); !errors.Is(err, tt.want) {
			t.Errorf("response %s: error = %v, want %v", tt.name, err, tt.want)
		}
	}
	if _, _, err := frame.Read(bytes.NewReader(frameOf(nil)), 100, nil); !errors.Is(err, ErrMalformed) {
		t.Errorf("empty frame: error = %v, want ErrMalformed", err)
	}
}

func TestCheckRequest(t *testing.T) {
	tests := []struct {
		name string
		req  Request
		want error
	}{
		{"bad type", Request{Type: "no spaces"}, workers.ErrInvalidType},
		{"long id", Request{Type: "echo", ID: strings.Repeat("x", MaxRequestIDLen+1)}, ErrMalformed},
		{"payload too large", Request{Type: "echo", Payload: make([]byte, 11)}, ErrPayloadTooLarge},
		{"negative timeout", Request{Type: "echo", Timeout: -1}, ErrMalformed},
	}
	for _, tt := range tests {
		if err := checkRequest(&tt.req, 10); !errors.Is(err, tt.want) {
			t.Errorf("%s: error = %v, want %v", tt.name, err, tt.want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(appendRequest(nil, &Request{ID: "id", Type: "echo", Payload: []byte("p"), Timeout: time.Second})[frame.HeaderLen:])
	f.Add(appendResponse(nil, &Response{ID: "id", Result: workers.Fail(workers.Busy, "full")})[frame.HeaderLen:])
	f.Fuzz(func(t *testing.T, body []byte) {
		if req, err := decodeRequest(body, 64); err == nil {
			if len(req.ID) > MaxRequestIDLen || len(req.Type) > workers.MaxTypeLen || len(req.Payload) > 64 {
				t.Fatalf("decoded a request over its limits: %+v", req)
			}
		}
		if resp, _, err := decodeServerFrame(body, 64); err == nil && resp.Outcome != 0 && !resp.Outcome.Valid() {
			t.Fatalf("decoded an invalid outcome %d", resp.Outcome)
		}
	})
}

// A request of the work type its stream carried last decodes with one
// allocation, its id: the type is the stream's string, the field names of
// errors are put together only for an error. One of another type gets
// its own type.
func TestCodec_RequestOfTheStreamsLastTypeAllocatesOnlyItsID(t *testing.T) {
	msg := appendRequest(nil, &Request{ID: "r-7", Type: "echo", Payload: []byte("hi"), Timeout: time.Second})
	body := msg[frame.HeaderLen:]
	last := strings.Clone("echo")
	allocs := testing.AllocsPerRun(200, func() {
		got, err := decodeRequestAs(body, workers.DefaultMaxPayload, last)
		if err != nil || got.Type != "echo" || got.ID != "r-7" {
			t.Fatalf("decoded %+v, %v", got, err)
		}
	})
	if allocs > 1 {
		t.Errorf("%.0f allocations to decode a request of the stream's last type, want 1 (its id)", allocs)
	}
	got, err := decodeRequestAs(body, workers.DefaultMaxPayload, "sha256")
	if err != nil || got.Type != "echo" {
		t.Fatalf("a request of another type than the last: decoded %+v, %v", got, err)
	}
	if _, err := decodeRequestAs([]byte{kindRequest, 0x80}, workers.DefaultMaxPayload, last); err == nil || !strings.Contains(err.Error(), "timeout: bad varint") {
		t.Fatalf("a bad varint: %v, want the field named", err)
	}
	if _, err := decodeRequestAs([]byte{kindRequest, 1, 1, 0x80}, workers.DefaultMaxPayload, last); err == nil || !strings.Contains(err.Error(), "request id length: bad varint") {
		t.Fatalf("a bad length: %v, want the field named", err)
	}
}
