package node

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ErrFrameTooLarge is returned when a peer announces a message larger than
// the protocol allows; nothing is allocated for it.
var ErrFrameTooLarge = errors.New("message larger than allowed")

// writeFrame writes b with a 4-byte big-endian length in front.
func writeFrame(w io.Writer, b []byte) error {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(b)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(b)
	return err
}

// readFrame reads one length-prefixed message of at most max bytes. The
// length is checked before the buffer is allocated. io.EOF means the peer
// closed the stream cleanly before a new message.
func readFrame(r io.Reader, max int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(max) {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrFrameTooLarge, n, max)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return b, nil
}

// writeJSONFrame encodes v as JSON in one frame.
func writeJSONFrame(w io.Writer, v any, max int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > max {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrFrameTooLarge, len(b), max)
	}
	return writeFrame(w, b)
}

// readJSONFrame reads one frame of at most max bytes and decodes it into v,
// refusing unknown fields.
func readJSONFrame(r io.Reader, v any, max int) error {
	b, err := readFrame(r, max)
	if err != nil {
		return err
	}
	return decodeStrict(b, v)
}

// decodeStrict decodes exactly one JSON value from b into v; unknown fields
// and trailing data are errors.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}
