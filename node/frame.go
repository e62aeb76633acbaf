package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/workmesh/workmesh/node/frame"
)

// ErrFrameTooLarge is returned when a peer announces a message larger than
// the protocol allows; nothing is allocated for it.
var ErrFrameTooLarge = frame.ErrTooLarge

// writeFrame writes b as one frame.
func writeFrame(w io.Writer, b []byte) error { return frame.Write(w, b) }

// readFrame reads one frame of 1 to max bytes (frame.Read). io.EOF means
// the peer closed the stream cleanly before a new message.
func readFrame(r io.Reader, max int) ([]byte, error) {
	b, _, err := frame.Read(r, max, nil)
	return b, err
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
