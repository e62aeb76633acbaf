package authority

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func newAuthority(t testing.TB) *Authority {
	t.Helper()
	a, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func newPeer(t testing.TB) peer.ID {
	t.Helper()
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestKeySaveLoad(t *testing.T) {
	a := newAuthority(t)
	path := filepath.Join(t.TempDir(), "authority.key")
	if err := a.Save(path, false); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %04o, want 0600", st.Mode().Perm())
	}
	b, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Public().Equal(a.Public()) {
		t.Errorf("loaded key %s, saved %s", b.Public(), a.Public())
	}
	// Refuses to overwrite without force, and keeps the old key.
	other := newAuthority(t)
	if err := other.Save(path, false); err == nil || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Errorf("save over an existing key: %v, want a refusal", err)
	}
	if b, _ := Load(path); !b.Public().Equal(a.Public()) {
		t.Error("the refused save changed the key")
	}
	// With force it replaces the key and tightens a loose mode.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := other.Save(path, true); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("forced save left mode %04o", st.Mode().Perm())
	}
	if b, _ := Load(path); !b.Public().Equal(other.Public()) {
		t.Error("the forced save did not replace the key")
	}
}

func TestKeyLoadRefuses(t *testing.T) {
	dir := t.TempDir()
	loose := filepath.Join(dir, "loose.key")
	if err := newAuthority(t).Save(loose, false); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loose, 0o640); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(dir, "junk.key")
	if err := os.WriteFile(junk, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{loose, "mode 0640 lets others read"},
		{junk, "not a private key"},
		{filepath.Join(dir, "missing.key"), "no such file"},
	} {
		if _, err := Load(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load(%s) = %v, want %q", filepath.Base(tc.path), err, tc.want)
		}
	}
}

func TestPublicKeyLine(t *testing.T) {
	a := newAuthority(t)
	line := a.Public().String()
	if !strings.HasPrefix(line, "u") || strings.ContainsAny(line, " \n\t") {
		t.Fatalf("public key line %q: want one multibase base64url word", line)
	}
	k, err := ParsePublicKey("  " + line + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if !k.Equal(a.Public()) {
		t.Error("parsed key differs")
	}
	for _, tc := range []struct{ in, want string }{
		{"", "empty"},
		{"z" + line[1:], "starting with \"u\""},
		{"u!!!", "not base64url"},
		{"u" + "AAAA", "authority public key"},
	} {
		if _, err := ParsePublicKey(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePublicKey(%q) = %v, want %q", tc.in, err, tc.want)
		}
	}
	if (PublicKey{}).String() != "" || !(PublicKey{}).IsZero() || (PublicKey{}).Equal(a.Public()) {
		t.Error("the zero PublicKey is not empty")
	}
}

func TestCertificateRoundTrip(t *testing.T) {
	a := newAuthority(t)
	p := newPeer(t)
	c, err := a.Admit("prod", p, []string{"staked", "archive", "staked"}, t0.Add(300*time.Millisecond), t0.Add(720*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeCertificate(c.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.Network() != "prod" || got.Peer() != p || !got.Authority().Equal(a.Public()) {
		t.Errorf("decoded network %q peer %s", got.Network(), got.Peer())
	}
	if l := strings.Join(got.Labels(), ","); l != "archive,staked" {
		t.Errorf("labels %q, want archive,staked (sorted, deduplicated)", l)
	}
	if !got.HasLabel("staked") || got.HasLabel("full") {
		t.Error("HasLabel wrong")
	}
	if !got.IssuedAt().Equal(t0) || !got.Expires().Equal(t0.Add(720*time.Hour)) {
		t.Errorf("issued %s expires %s", got.IssuedAt(), got.Expires())
	}
	if string(got.Encode()) != string(c.Encode()) {
		t.Error("re-encoding differs")
	}
	want := Expect{Authority: a.Public(), Network: "prod", Peer: p}
	if err := got.Verify(want, t0.Add(time.Hour)); err != nil {
		t.Errorf("Verify: %v", err)
	}
	// Labels() is a copy.
	got.Labels()[0] = "x"
	if got.Labels()[0] != "archive" {
		t.Error("Labels shares its slice")
	}
}

// TestCertificateVerifyRules breaks each rule of Verify once.
func TestCertificateVerifyRules(t *testing.T) {
	a, other := newAuthority(t), newAuthority(t)
	p, q := newPeer(t), newPeer(t)
	exp := t0.Add(24 * time.Hour)
	good, err := a.Admit("prod", p, []string{"staked"}, t0, exp)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.Admit("prod", p, nil, t0, exp)
	if err != nil {
		t.Fatal(err)
	}
	tampered := good.Encode()
	// The label "staked" is in the signed part; flip one of its letters.
	i := strings.Index(string(tampered), "staked")
	tampered[i] = 'S'
	bad, err := DecodeCertificate(tampered)
	if err != nil {
		t.Fatalf("tampered certificate must still decode: %v", err)
	}
	want := Expect{Authority: a.Public(), Network: "prod", Peer: p}
	for _, tc := range []struct {
		name  string
		c     *Certificate
		want  Expect
		now   time.Time
		class error
		msg   string
	}{
		{"good", good, want, t0, nil, ""},
		{"good for any peer", good, Expect{Authority: a.Public(), Network: "prod"}, t0, nil, ""},
		{"good just before expiry", good, want, exp.Add(-time.Nanosecond), nil, ""},
		{"tampered", bad, want, t0, ErrBadSignature, "signature does not verify"},
		{"other authority", foreign, want, t0, ErrOtherAuthority, "signed by another authority"},
		{"no authority", good, Expect{Network: "prod"}, t0, ErrOtherAuthority, "no network authority"},
		{"wrong network", good, Expect{Authority: a.Public(), Network: "staging", Peer: p}, t0, ErrWrongNetwork, `for network "prod", not "staging"`},
		{"wrong peer", good, Expect{Authority: a.Public(), Network: "prod", Peer: q}, t0, ErrWrongPeer, "it is for peer " + p.String()},
		{"expired at expiry", good, want, exp, ErrExpired, "expired at 2026-12-02T12:00:00Z"},
		{"expired later", good, want, exp.Add(time.Hour), ErrExpired, "expired at"},
	} {
		err := tc.c.Verify(tc.want, tc.now)
		switch {
		case tc.class == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.class != nil && (!errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.msg)):
			t.Errorf("%s: %v, want %v with %q", tc.name, err, tc.class, tc.msg)
		}
	}
}

func TestAdmitRefuses(t *testing.T) {
	a := newAuthority(t)
	p := newPeer(t)
	for _, tc := range []struct {
		name    string
		network string
		peer    peer.ID
		labels  []string
		expires time.Time
		want    string
	}{
		{"empty network", "", p, nil, t0.Add(time.Hour), "network name is empty"},
		{"bad network", "Prod!", p, nil, t0.Add(time.Hour), "may only hold"},
		{"no peer", "prod", "", nil, t0.Add(time.Hour), "peer"},
		{"empty label", "prod", p, []string{"a", ""}, t0.Add(time.Hour), "label 2 is empty"},
		{"comma label", "prod", p, []string{"a,b"}, t0.Add(time.Hour), "a comma"},
		{"long label", "prod", p, []string{strings.Repeat("x", 65)}, t0.Add(time.Hour), "at most 64"},
		{"expiry not after issue", "prod", p, nil, t0, "is not after the issue time"},
	} {
		if _, err := a.Admit(tc.network, tc.peer, tc.labels, t0, tc.expires); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	many := make([]string, MaxLabels+1)
	for i := range many {
		many[i] = string(rune('a'+i/26)) + string(rune('a'+i%26))
	}
	if _, err := a.Admit("prod", p, many, t0, t0.Add(time.Hour)); err == nil || !strings.Contains(err.Error(), "65 labels, at most 64") {
		t.Errorf("too many labels: %v", err)
	}
}

// TestDecodeMalformed breaks the encoding once per field and checks the
// error names the byte and the field.
func TestDecodeMalformed(t *testing.T) {
	a := newAuthority(t)
	p := newPeer(t)
	c, err := a.Admit("prod", p, []string{"archive", "staked"}, t0, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	good := c.Encode()
	h := len(certificateHeader)
	r, err := a.Revoke("prod", p, t0)
	if err != nil {
		t.Fatal(err)
	}
	with := func(at int, b ...byte) []byte {
		out := append([]byte(nil), good[:at]...)
		return append(out, b...)
	}
	labelsAt := h + 1 + len("prod") + 1 + len(p)
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "malformed at byte 0 (field header): not a workmesh membership certificate"},
		{"other header", []byte("workmesh-membership-v2\n"), "malformed at byte 21 (field header)"},
		{"a revocation", r.Encode(), "this is a revocation, not a membership certificate"},
		{"cut in network", good[:h+2], "malformed at byte " + strconv.Itoa(h) + " (field network): length 4 but only 1 bytes follow"},
		{"empty network", with(h, 0), "(field network): network name is empty"},
		{"long network", with(h, 65), "(field network): length 65, at most 64"},
		{"bad peer", append(with(h, good[h:h+5]...), 1, 7), "(field peer): not a peer ID"},
		{"too many labels", with(labelsAt, 65), "malformed at byte " + strconv.Itoa(labelsAt) + " (field labels): 65 labels, at most 64"},
		{"unsorted labels", append(with(labelsAt, 2, 1, 'b'), 1, 'a'), "(field labels[2]): label 2 \"a\" is out of order"},
		{"empty label", append(with(labelsAt, 1), 0), "(field labels[1]): label 1 is empty"},
		{"cut before issued", good[:labelsAt+1+1+7+1+6], "(field issued): ends before the field"},
		{"overflow", append(with(labelsAt+1+1+7+1+6), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), "(field issued): number overflows 64 bits"},
		{"trailing bytes", append(append([]byte(nil), good...), 0), "1 bytes after the signature"},
		{"too long", make([]byte, MaxEncoded+1), "at most 8192"},
	} {
		_, err := DecodeCertificate(tc.in)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestDecodeCanonical refuses a certificate whose number is encoded the
// long way, though it means the same.
func TestDecodeCanonical(t *testing.T) {
	a := newAuthority(t)
	c, err := a.Admit("prod", newPeer(t), nil, t0, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	b := c.Encode()
	h := len(certificateHeader)
	// The network's length 4 as a two-byte uvarint: 0x84 0x00.
	long := append(append(append([]byte(nil), b[:h]...), 0x84, 0x00), b[h+1:]...)
	_, err = DecodeCertificate(long)
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "not in canonical form") {
		t.Errorf("long-form length: %v", err)
	}
}

func TestExpiryBeforeIssue(t *testing.T) {
	a := newAuthority(t)
	c, err := a.Admit("prod", newPeer(t), nil, t0, t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Swap issued and expires: both are uvarints of the same length.
	b := c.Encode()
	is := strings.Index(string(b), string(uvarintBytes(uint64(t0.Unix()))))
	n := len(uvarintBytes(uint64(t0.Unix())))
	copy(b[is+n:], uvarintBytes(uint64(t0.Unix())))
	_, err = DecodeCertificate(b)
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "(field expires): expiry") {
		t.Errorf("expiry equal to issue: %v", err)
	}
}

func uvarintBytes(n uint64) []byte {
	e := encoder{}
	e.uvarint(n)
	return e.b
}
