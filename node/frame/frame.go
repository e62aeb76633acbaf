package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/libp2p/go-libp2p/core/network"
)

// HeaderLen is the length prefix of every frame: four bytes, big-endian,
// so a reader takes it in one read and compares it with its limit before
// it allocates the body.
const HeaderLen = 4

// ReserveThreshold is the body size from which Read reserves the body's
// memory in the stream's resource scope first: smaller frames are not
// worth the accounting.
const ReserveThreshold = 64 << 10

// Sentinel errors of a frame; test them with errors.Is.
var (
	// ErrTooLarge means a frame claims, or would need, more bytes than the
	// limit. It is checked before anything is allocated.
	ErrTooLarge = errors.New("message too large")
	// ErrTruncated means the stream ended in the middle of a frame.
	ErrTruncated = errors.New("message truncated")
	// ErrMalformed means a frame is not a valid message: an empty frame
	// here, a bad field to the protocols that decode the body.
	ErrMalformed = errors.New("malformed message")
)

// Memory is the part of a libp2p resource scope that accounts memory
// (network.StreamScope has it).
type Memory interface {
	ReserveMemory(size int, prio uint8) error
	ReleaseMemory(size int)
}

// Read reads one frame of 1 to limit bytes and returns its body. A body of
// ReserveThreshold bytes or more is reserved in mem (when not nil), and the
// caller releases the returned reserved bytes when done with the body. A
// stream that ends before the first byte gives io.EOF (a clean end between
// messages); one that ends inside the frame gives ErrTruncated. Other read
// errors are returned as they are.
//
// The body's memory follows the bytes that arrived, not the length the
// header claims: it starts at GrowStep bytes and doubles as it fills (up
// to the claimed length, and to it at once from a step that comes within
// a quarter of it), each growth reserved in mem before it is made.
// A sender that claims a large frame and sends little of it holds little;
// all that the read reserved is given back when it fails.
func Read(r io.Reader, limit int, mem Memory) (body []byte, reserved int, err error) {
	var h Header
	return h.read(r, limit, mem, 2)
}

// Header is room for a frame's length prefix. A reader of many frames
// (a work stream) keeps one and reads with its methods, so that a frame
// costs one allocation, its body: the prefix read through an io.Reader
// would otherwise be allocated too.
type Header [HeaderLen]byte

// Read is frame.Read, the prefix read into h.
func (h *Header) Read(r io.Reader, limit int, mem Memory) (body []byte, reserved int, err error) {
	return h.read(r, limit, mem, 2)
}

// ReadFast is frame.ReadFast, the prefix read into h.
func (h *Header) ReadFast(r io.Reader, limit int, mem Memory) (body []byte, reserved int, err error) {
	return h.read(r, limit, mem, 4)
}

// AccountFrom is the body size from which ReadBounded accounts a body in
// mem: a smaller one is read into one allocation of its claimed length.
const AccountFrom = 8 << 10

// ReadBounded is Header.Read for a reader whose mem bounds what all its
// streams hold with bodies still arriving (the work server's bounds on
// incomplete requests): a body over AccountFrom bytes, not only one of
// ReserveThreshold or more, grows from AccountFrom as its bytes arrive,
// every growth reserved in mem. What a sender holds beyond AccountFrom a
// stream is then accounted whatever length it claims: unaccounted, a
// body claimed just under ReserveThreshold held up to that much memory a
// stream, and one claimed at SmallFrame held it from its header on.
func (h *Header) ReadBounded(r io.Reader, limit int, mem Memory) (body []byte, reserved int, err error) {
	return h.readSized(r, limit, mem, 2, AccountFrom, AccountFrom)
}

// read is Read and ReadFast, a large body's buffer growing by factor.
func (h *Header) read(r io.Reader, limit int, mem Memory, factor int) (body []byte, reserved int, err error) {
	return h.readSized(r, limit, mem, factor, SmallFrame, ReserveThreshold)
}

// readSized reads a frame: a body of up to small bytes into one
// allocation, a larger one growing from small as its bytes arrive (from
// GrowStep from ReserveThreshold on), reserved in mem from account bytes
// on.
func (h *Header) readSized(r io.Reader, limit int, mem Memory, factor, small, account int) (body []byte, reserved int, err error) {
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, 0, fmt.Errorf("frame header: %w", ErrTruncated)
		}
		return nil, 0, err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n == 0 {
		return nil, 0, fmt.Errorf("empty frame: %w", ErrMalformed)
	}
	if uint64(n) > uint64(limit) {
		return nil, 0, fmt.Errorf("frame of %d bytes exceeds the limit of %d: %w", n, limit, ErrTooLarge)
	}
	if int(n) <= small {
		body = make([]byte, n)
		if got, err := io.ReadFull(r, body); err != nil {
			return nil, 0, bodyError(err, got, int(n))
		}
		return body, 0, nil
	}
	if n < ReserveThreshold {
		// Grown from small as bytes arrive, so a sender that claims most
		// of the threshold and sends nothing holds small, not the claim;
		// not reserved in mem below account.
		if int(n) < account {
			mem = nil
		}
		return readGrowing(r, int(n), mem, factor, small)
	}
	return readGrowing(r, int(n), mem, factor, GrowStep)
}

// SmallFrame is the largest body read into one allocation of its claimed
// length; a larger one grows as its bytes arrive (readGrowing).
const SmallFrame = 16 << 10

// ReadFast is Read for large frames whose memory may run further ahead of
// the bytes that arrived: the body's buffer grows fourfold instead of
// doubling, and straight to the claimed length once that is within a
// quarter of the next step, so a body of 1 MiB takes three allocations
// (1.3 MiB) and copies 320 KiB on its way instead of five (2 MiB) and
// 960 KiB. A sender that
// claims a large frame and sends little of it holds at most about five
// times what it sent, all of it reserved in mem first as with Read.
func ReadFast(r io.Reader, limit int, mem Memory) (body []byte, reserved int, err error) {
	var h Header
	return h.read(r, limit, mem, 4)
}

// GrowStep is the first allocation of a large body (Read), which then
// doubles as bytes arrive.
const GrowStep = 64 << 10

// readGrowing reads a body of n bytes into a buffer that grows with the
// bytes received, from first bytes by factor at each step, reserving each
// growth in mem (when not nil). A
// step that would leave less than a quarter of itself to go grows to n at
// once.
func readGrowing(r io.Reader, n int, mem Memory, factor, first int) (body []byte, reserved int, err error) {
	fail := func(err error) ([]byte, int, error) {
		if reserved > 0 {
			mem.ReleaseMemory(reserved)
		}
		return nil, 0, err
	}
	for len(body) < n {
		if len(body) == cap(body) {
			size := min(n, max(first, factor*cap(body)))
			if size+size/4 >= n {
				size = n // not one more step for the last few bytes
			}
			if mem != nil {
				if err := mem.ReserveMemory(size-reserved, network.ReservationPriorityHigh); err != nil {
					return fail(fmt.Errorf("reserve %d bytes for a frame of %d (%d in): %w", size-reserved, n, len(body), err))
				}
				reserved = size
			}
			grown := make([]byte, len(body), size)
			copy(grown, body)
			body = grown
		}
		got, err := io.ReadFull(r, body[len(body):cap(body)])
		body = body[:len(body)+got]
		if err != nil {
			return fail(bodyError(err, len(body), n))
		}
	}
	return body, reserved, nil
}

// bodyError is the error of a body read that stopped at got of n bytes.
func bodyError(err error, got, n int) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("frame body: got %d of %d bytes: %w", got, n, ErrTruncated)
	}
	return err
}

// Write writes b as one frame.
func Write(w io.Writer, b []byte) error {
	var hdr [HeaderLen]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(b)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(b)
	return err
}
