package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"slices"
	"testing"
)

// frameOf wraps body in a frame header.
func frameOf(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// TestRead_EmptyFrameIsMalformed: a zero length is never a message.
func TestRead_EmptyFrameIsMalformed(t *testing.T) {
	if _, _, err := Read(bytes.NewReader(frameOf(nil)), 10, nil); !errors.Is(err, ErrMalformed) {
		t.Errorf("empty frame: %v, want ErrMalformed", err)
	}
}

func TestRead_OversizedLengthRejectedBeforeAllocation(t *testing.T) {
	claim := binary.BigEndian.AppendUint32(nil, 1<<30) // 1 GiB, then nothing
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := Read(bytes.NewReader(claim), 1<<20, nil)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("error = %v, want ErrTooLarge", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
		t.Fatalf("reading a 1 GiB claim allocated %d bytes", grew)
	}

	// The limit is exact: one byte over is refused, the limit itself is read.
	limit := 100
	if _, _, err := Read(bytes.NewReader(frameOf(make([]byte, limit+1))), limit, nil); !errors.Is(err, ErrTooLarge) {
		t.Errorf("limit+1: error = %v, want ErrTooLarge", err)
	}
	if _, _, err := Read(bytes.NewReader(frameOf(make([]byte, limit))), limit, nil); err != nil {
		t.Errorf("exactly the limit: %v", err)
	}
}

// countingScope records memory reservations.
type countingScope struct {
	reserved, released int
	refuse             bool
}

func (s *countingScope) ReserveMemory(n int, _ uint8) error {
	if s.refuse {
		return errors.New("resource limit exceeded")
	}
	s.reserved += n
	return nil
}
func (s *countingScope) ReleaseMemory(n int) { s.released += n }

func TestRead_LargeFramesReserveMemory(t *testing.T) {
	big := frameOf(make([]byte, ReserveThreshold))
	scope := &countingScope{}
	_, reserved, err := Read(bytes.NewReader(big), 1<<20, scope)
	if err != nil {
		t.Fatal(err)
	}
	if reserved != ReserveThreshold || scope.reserved != ReserveThreshold {
		t.Errorf("reserved %d (scope %d), want %d", reserved, scope.reserved, ReserveThreshold)
	}
	// Truncated after the reservation: it is given back.
	scope = &countingScope{}
	if _, _, err := Read(bytes.NewReader(big[:1000]), 1<<20, scope); !errors.Is(err, ErrTruncated) || scope.released != scope.reserved {
		t.Errorf("truncated: err=%v reserved=%d released=%d", err, scope.reserved, scope.released)
	}
	if _, _, err := Read(bytes.NewReader(big), 1<<20, &countingScope{refuse: true}); err == nil {
		t.Error("a refused reservation did not fail the read")
	}
}

func TestRead_RoundTripAndCleanEnd(t *testing.T) {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], 1<<30)
	// Only the header is there: reading the body would fail with EOF, so
	// ErrTooLarge proves the size was checked first.
	_, _, err := Read(bytes.NewReader(hdr[:]), 1024, nil)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err %v, want ErrTooLarge", err)
	}
	var buf bytes.Buffer
	if err := Write(&buf, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	b, _, err := Read(&buf, 5, nil)
	if err != nil || string(b) != "hello" {
		t.Fatalf("round trip: %q, %v", b, err)
	}
	if _, _, err := Read(&buf, 5, nil); !errors.Is(err, io.EOF) {
		t.Errorf("empty stream: %v, want EOF", err)
	}
}

// A frame's memory follows the bytes that arrived, not the length its
// header claims: a sender that claims 1 MiB and sends 100 bytes makes the
// reader allocate and reserve one GrowStep, one that sends 300 KiB hold at
// most twice that; what was reserved is given back when the stream ends short.
func TestRead_MemoryFollowsTheBytesReceived(t *testing.T) {
	const claim = 1 << 20
	hdr := binary.BigEndian.AppendUint32(nil, claim)
	for _, sent := range []int{100, 300 << 10} {
		scope := &countingScope{}
		in := append(slices.Clone(hdr), make([]byte, sent)...)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _, err := Read(bytes.NewReader(in), claim, scope)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrTruncated) {
			t.Fatalf("sent %d of %d: err %v, want ErrTruncated", sent, claim, err)
		}
		// Doubling: what is held is at most twice what arrived, and all
		// that was allocated on the way at most four times.
		held := max(GrowStep, 2*sent)
		if grew, limit := after.TotalAlloc-before.TotalAlloc, uint64(GrowStep+4*sent+16<<10); grew > limit {
			t.Errorf("sent %d of a claimed %d: allocated %d bytes, want at most %d", sent, claim, grew, limit)
		}
		if scope.reserved > held || scope.released != scope.reserved {
			t.Errorf("sent %d: reserved %d, released %d", sent, scope.reserved, scope.released)
		}
	}
	// A whole frame still reads whole, reserved at its length.
	scope := &countingScope{}
	body := make([]byte, claim)
	body[claim-1] = 7
	got, reserved, err := Read(bytes.NewReader(frameOf(body)), claim, scope)
	if err != nil || len(got) != claim || got[claim-1] != 7 || reserved != claim || scope.reserved != claim {
		t.Fatalf("whole 1 MiB frame: len %d err %v reserved %d (scope %d)", len(got), err, reserved, scope.reserved)
	}
}

// ReadFast grows a body fourfold, and to its length once that is near: a
// whole 1 MiB frame costs at most 64 KiB + 256 KiB + 1 MiB of allocations
// on its way (Read's doubling about 2 MiB, with no step of its own for the
// message's last bytes), and a sender that claims 1 MiB and sends 100 KiB
// holds at most five times that.
func TestReadFast_FewerCopiesAndMemoryStillFollowsTheBytes(t *testing.T) {
	const claim = 1<<20 + 20 // a 1 MiB payload and its message's fields
	body := make([]byte, claim)
	body[claim-1] = 7
	in := frameOf(body)
	scope := &countingScope{}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got, reserved, err := ReadFast(bytes.NewReader(in), claim, scope)
	runtime.ReadMemStats(&after)
	if err != nil || len(got) != claim || got[claim-1] != 7 || reserved != claim || scope.reserved != claim {
		t.Fatalf("whole frame: len %d err %v reserved %d (scope %d)", len(got), err, reserved, scope.reserved)
	}
	if grew, limit := after.TotalAlloc-before.TotalAlloc, uint64(GrowStep+4*GrowStep+claim+16<<10); grew > limit {
		t.Errorf("whole frame of %d: allocated %d bytes, want at most %d", claim, grew, limit)
	}
	for _, sent := range []int{100, 100 << 10} {
		scope := &countingScope{}
		_, _, err := ReadFast(bytes.NewReader(in[:HeaderLen+sent]), claim, scope)
		if !errors.Is(err, ErrTruncated) {
			t.Fatalf("sent %d of %d: err %v, want ErrTruncated", sent, claim, err)
		}
		if held := max(GrowStep, 5*sent); scope.reserved > held || scope.released != scope.reserved {
			t.Errorf("sent %d: reserved %d (want at most %d), released %d", sent, scope.reserved, held, scope.released)
		}
	}
	// Read doubles, but takes no step of its own for the last few bytes.
	runtime.ReadMemStats(&before)
	if got, _, err := Read(bytes.NewReader(in), claim, nil); err != nil || len(got) != claim {
		t.Fatalf("Read of the whole frame: len %d err %v", len(got), err)
	}
	runtime.ReadMemStats(&after)
	if grew, limit := after.TotalAlloc-before.TotalAlloc, uint64(15*GrowStep+claim+16<<10); grew > limit {
		t.Errorf("Read of a whole frame of %d: allocated %d bytes, want at most %d", claim, grew, limit)
	}
	if _, _, err := ReadFast(bytes.NewReader(in), claim-1, nil); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the limit: %v, want ErrTooLarge", err)
	}
}

// A reader that keeps a Header pays one allocation per frame, its body;
// frame.Read, with the prefix on its own, pays two.
func TestHeader_ReadAllocatesOnlyTheBody(t *testing.T) {
	var msg bytes.Buffer
	if err := Write(&msg, []byte("a request")); err != nil {
		t.Fatal(err)
	}
	var h Header
	r := bytes.NewReader(msg.Bytes())
	allocs := testing.AllocsPerRun(200, func() {
		r.Reset(msg.Bytes())
		body, _, err := h.ReadFast(r, 64, nil)
		if err != nil || string(body) != "a request" {
			t.Fatalf("read %q, %v", body, err)
		}
	})
	if allocs != 1 {
		t.Errorf("%.0f allocations per frame read with a Header, want 1 (the body)", allocs)
	}
}

// Below ReserveThreshold a frame is not reserved in the stream's scope, so
// its memory must follow the bytes that arrived all the more: a header
// claiming just under 64 KiB followed by 4 bytes allocates SmallFrame, not
// the claim (256 such streams held 18.7 MB of one peer's unaccounted), and
// a whole frame of that size still reads whole.
func TestRead_SmallClaimsFollowTheBytesReceived(t *testing.T) {
	const claim = ReserveThreshold - 1
	in := append(binary.BigEndian.AppendUint32(nil, claim), 1, 2, 3, 4)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := Read(bytes.NewReader(in), claim, nil)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTruncated) {
		t.Fatalf("4 bytes of a claimed %d: err %v, want ErrTruncated", claim, err)
	}
	if grew, limit := after.TotalAlloc-before.TotalAlloc, uint64(SmallFrame+8<<10); grew > limit {
		t.Errorf("4 bytes of a claimed %d: allocated %d bytes, want at most %d", claim, grew, limit)
	}
	body := make([]byte, claim)
	body[claim-1] = 7
	got, reserved, err := Read(bytes.NewReader(frameOf(body)), claim, nil)
	if err != nil || len(got) != claim || got[claim-1] != 7 || reserved != 0 {
		t.Fatalf("whole frame of %d: %d bytes, reserved %d, err %v", claim, len(got), reserved, err)
	}
}

// ReadBounded reserves every body over AccountFrom, as its bytes arrive:
// a body of 20 KiB is reserved whole (Read reserves none of it), a body of
// AccountFrom bytes is not, and what a truncated one reserved is given back.
func TestHeader_ReadBoundedAccountsBodiesOverAccountFrom(t *testing.T) {
	const size = 20 << 10
	var h Header
	scope := &countingScope{}
	body, reserved, err := h.ReadBounded(bytes.NewReader(frameOf(make([]byte, size))), 1<<20, scope)
	if err != nil || len(body) != size || reserved != size || scope.reserved != size {
		t.Fatalf("body of %d: %d bytes, reserved %d (scope %d), err %v; want all of it reserved", size, len(body), reserved, scope.reserved, err)
	}
	if _, reserved, _ := h.Read(bytes.NewReader(frameOf(make([]byte, size))), 1<<20, &countingScope{}); reserved != 0 {
		t.Errorf("Read reserved %d for a body under ReserveThreshold, want 0", reserved)
	}
	if _, reserved, _ := h.ReadBounded(bytes.NewReader(frameOf(make([]byte, AccountFrom))), 1<<20, scope); reserved != 0 {
		t.Errorf("a body of AccountFrom reserved %d, want 0", reserved)
	}
	scope = &countingScope{}
	in := frameOf(make([]byte, size))
	if _, _, err := h.ReadBounded(bytes.NewReader(in[:HeaderLen+AccountFrom+100]), 1<<20, scope); !errors.Is(err, ErrTruncated) ||
		scope.reserved <= AccountFrom || scope.released != scope.reserved {
		t.Errorf("truncated after %d bytes: err %v, reserved %d, released %d; want more than AccountFrom reserved and all given back",
			AccountFrom+100, err, scope.reserved, scope.released)
	}
}
