package authority

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/peer"
)

// The encoding, version 1. A string or byte string is a uvarint length
// and that many bytes; a number is a uvarint; a time is a uvarint of Unix
// seconds. A certificate is
//
//	"workmesh-membership-v1\n" network peer-id label-count label... issued expires authority signature
//
// and a revocation is
//
//	"workmesh-revocation-v1\n" network peer-id issued authority signature
//
// where peer-id is the binary peer ID, authority the libp2p-marshalled
// public key of the signer and signature its signature over every byte
// before the signature field. Labels are sorted and unique, nothing
// follows the signature, and every number has its shortest form: a
// statement has exactly one encoding, which decoding checks.
//
// The headers that open an encoded certificate and revocation. Each is
// also the domain separation of the signature, which covers it: a
// signature over one kind of statement can never pass for the other, nor
// for anything else the key might sign.
const (
	certificateHeader = "workmesh-membership-v1\n"
	revocationHeader  = "workmesh-revocation-v1\n"
)

// Bounds of an encoded statement and its fields.
const (
	// MaxEncoded bounds an encoded certificate or revocation.
	MaxEncoded = 8 << 10
	// MaxLabels bounds the attested labels of a certificate.
	MaxLabels = 64
	// maxLabelLen bounds one label.
	maxLabelLen = 64
	// maxNetworkLen is the longest network name, as config allows.
	maxNetworkLen = 64
	// maxPeerLen bounds a binary peer ID.
	maxPeerLen = 128
	// maxSignatureLen bounds a signature.
	maxSignatureLen = 512
)

// encoder appends the fields of a statement: strings and byte strings
// with a uvarint length first, numbers as uvarints.
type encoder struct{ b []byte }

func (e *encoder) str(s string) {
	e.b = binary.AppendUvarint(e.b, uint64(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) bytes(p []byte) {
	e.b = binary.AppendUvarint(e.b, uint64(len(p)))
	e.b = append(e.b, p...)
}

func (e *encoder) uvarint(n uint64) { e.b = binary.AppendUvarint(e.b, n) }

func (e *encoder) time(t time.Time) { e.uvarint(uint64(t.Unix())) }

// decoder reads what encoder wrote, naming the byte and the field of the
// first thing that is wrong.
type decoder struct {
	kind string
	b    []byte
	off  int
}

func (d *decoder) fail(at int, field, format string, args ...any) error {
	return &MalformedError{Kind: d.kind, Offset: at, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func (d *decoder) header(want, other, otherKind string) error {
	switch {
	case len(d.b) > MaxEncoded:
		return d.fail(MaxEncoded, "", "%d bytes, at most %d", len(d.b), MaxEncoded)
	case bytes.HasPrefix(d.b, []byte(want)):
		d.off = len(want)
		return nil
	case bytes.HasPrefix(d.b, []byte(other)):
		return d.fail(0, "header", "this is a %s, not a %s", otherKind, d.kind)
	}
	n := 0
	for n < len(d.b) && n < len(want) && d.b[n] == want[n] {
		n++
	}
	return d.fail(n, "header", "not a workmesh %s: it does not start with %q", d.kind, strings.TrimSpace(want))
}

func (d *decoder) uvarint(field string) (uint64, error) {
	n, k := binary.Uvarint(d.b[d.off:])
	switch {
	case k == 0:
		return 0, d.fail(d.off, field, "ends before the field")
	case k < 0:
		return 0, d.fail(d.off, field, "number overflows 64 bits")
	}
	d.off += k
	return n, nil
}

// bytes reads a length and that many bytes, at most max.
func (d *decoder) bytes(field string, max int) ([]byte, error) {
	at := d.off
	n, err := d.uvarint(field)
	if err != nil {
		return nil, err
	}
	if n > uint64(max) {
		return nil, d.fail(at, field, "length %d, at most %d", n, max)
	}
	if n > uint64(len(d.b)-d.off) {
		return nil, d.fail(at, field, "length %d but only %d bytes follow", n, len(d.b)-d.off)
	}
	p := d.b[d.off : d.off+int(n)]
	d.off += int(n)
	return p, nil
}

func (d *decoder) network() (string, error) {
	at := d.off
	b, err := d.bytes("network", maxNetworkLen)
	if err != nil {
		return "", err
	}
	if err := checkNetwork(string(b)); err != nil {
		return "", d.fail(at, "network", "%v", err)
	}
	return string(b), nil
}

func (d *decoder) peer() (peer.ID, error) {
	at := d.off
	b, err := d.bytes("peer", maxPeerLen)
	if err != nil {
		return "", err
	}
	id, err := peer.IDFromBytes(b)
	if err != nil {
		return "", d.fail(at, "peer", "not a peer ID: %v", err)
	}
	return id, nil
}

func (d *decoder) time(field string) (time.Time, error) {
	at := d.off
	n, err := d.uvarint(field)
	if err != nil {
		return time.Time{}, err
	}
	if n > maxUnix {
		return time.Time{}, d.fail(at, field, "time %d is after the year 9999", n)
	}
	return time.Unix(int64(n), 0).UTC(), nil
}

// maxUnix is 9999-12-31T23:59:59Z, the latest time a statement may name.
const maxUnix = 253402300799

func (d *decoder) authority() (PublicKey, error) {
	at := d.off
	b, err := d.bytes("authority", maxKeyBytes)
	if err != nil {
		return PublicKey{}, err
	}
	k, err := unmarshalPublicKey(b)
	if err != nil {
		return PublicKey{}, d.fail(at, "authority", "%v", err)
	}
	return k, nil
}

// end checks that nothing follows the last field.
func (d *decoder) end() error {
	if d.off != len(d.b) {
		return d.fail(d.off, "", "%d bytes after the signature", len(d.b)-d.off)
	}
	return nil
}

// canonical checks that b is exactly what encoding the decoded statement
// gives (no over-long number, for one): a statement has one encoding, so
// its bytes can be compared and deduplicated.
func (d *decoder) canonical(again []byte) error {
	if bytes.Equal(d.b, again) {
		return nil
	}
	n := 0
	for n < len(d.b) && n < len(again) && d.b[n] == again[n] {
		n++
	}
	return d.fail(n, "", "not in canonical form (a number or list is encoded the long way)")
}

// checkNetwork holds a network name to the rule config has for it.
func checkNetwork(n string) error {
	switch {
	case n == "":
		return fmt.Errorf("network name is empty")
	case len(n) > maxNetworkLen:
		return fmt.Errorf("network name is %d bytes, at most %d", len(n), maxNetworkLen)
	}
	for _, r := range n {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("network name %q may only hold a-z, 0-9, '-', '_' and '.'", n)
		}
	}
	return nil
}

// checkLabels holds attested labels to their rule: at most MaxLabels, each
// non-empty, printable UTF-8 of at most 64 bytes, sorted and unique (the
// canonical order, which Admit puts them in).
func checkLabels(labels []string) error {
	if len(labels) > MaxLabels {
		return fmt.Errorf("%d labels, at most %d", len(labels), MaxLabels)
	}
	for i, l := range labels {
		switch {
		case l == "":
			return fmt.Errorf("label %d is empty", i+1)
		case len(l) > maxLabelLen:
			return fmt.Errorf("label %d is %d bytes, at most %d", i+1, len(l), maxLabelLen)
		case !utf8.ValidString(l) || strings.IndexFunc(l, notLabelRune) >= 0:
			return fmt.Errorf("label %d %q holds a space, a comma or a control character", i+1, l)
		case i > 0 && labels[i-1] >= l:
			return fmt.Errorf("label %d %q is out of order or repeated (labels are sorted and unique)", i+1, l)
		}
	}
	return nil
}

func notLabelRune(r rune) bool {
	return r <= ' ' || r == ',' || r == 0x7f || r == utf8.RuneError
}

// ReadFile reads a certificate or revocation file: at most MaxEncoded
// bytes and one more, which the decoders refuse as too long, so that a
// wrong path to a large file costs no more than that.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxEncoded+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}
