package authority

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRevocationRoundTripAndRules(t *testing.T) {
	a, other := newAuthority(t), newAuthority(t)
	p, q := newPeer(t), newPeer(t)
	r, err := a.Revoke("prod", p, t0.Add(700*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRevocation(r.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.Network() != "prod" || got.Peer() != p || !got.IssuedAt().Equal(t0) || !got.Authority().Equal(a.Public()) {
		t.Errorf("decoded %q %s %s", got.Network(), got.Peer(), got.IssuedAt())
	}
	if !IsRevocation(r.Encode()) {
		t.Error("IsRevocation false for a revocation")
	}
	foreign, err := other.Revoke("prod", p, t0)
	if err != nil {
		t.Fatal(err)
	}
	tampered := r.Encode()
	tampered[len(revocationHeader)+1] = 'P' // "prod" -> "Prod"... then not a valid name
	if _, err := DecodeRevocation(tampered); !errors.Is(err, ErrMalformed) {
		t.Errorf("revocation for network Prod decoded: %v", err)
	}
	// A change inside the signed part that still decodes: the issue time.
	moved := r.Encode()
	ts := uvarintBytes(uint64(t0.Unix()))
	i := strings.Index(string(moved), string(ts))
	moved[i] ^= 0x02
	bad, err := DecodeRevocation(moved)
	if err != nil {
		t.Fatalf("revocation with another time must decode: %v", err)
	}
	want := Expect{Authority: a.Public(), Network: "prod"}
	for _, tc := range []struct {
		name  string
		r     *Revocation
		want  Expect
		class error
		msg   string
	}{
		{"good", got, want, nil, ""},
		{"tampered", bad, want, ErrBadSignature, "signature does not verify"},
		{"other authority", foreign, want, ErrOtherAuthority, "signed by another authority"},
		{"no authority", got, Expect{Network: "prod"}, ErrOtherAuthority, "no network authority"},
		{"wrong network", got, Expect{Authority: a.Public(), Network: "dev"}, ErrWrongNetwork, `for network "prod", not "dev"`},
		{"wrong peer", got, Expect{Authority: a.Public(), Network: "prod", Peer: q}, ErrWrongPeer, "it revokes peer " + p.String()},
	} {
		err := tc.r.Verify(tc.want)
		switch {
		case tc.class == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.class != nil && (!errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.msg)):
			t.Errorf("%s: %v, want %v with %q", tc.name, err, tc.class, tc.msg)
		}
	}
	c, err := a.Admit("prod", p, nil, t0, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"a certificate", c.Encode(), "this is a membership certificate, not a revocation"},
		{"cut", r.Encode()[:len(r.Encode())-1], "(field signature): length"},
		{"trailing", append(r.Encode(), 1), "1 bytes after the signature"},
	} {
		if _, err := DecodeRevocation(tc.in); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := a.Revoke("", p, t0); err == nil {
		t.Error("revoke with no network")
	}
	if _, err := a.Revoke("prod", "", t0); err == nil {
		t.Error("revoke with no peer")
	}
}

func TestRevocationList(t *testing.T) {
	a, other := newAuthority(t), newAuthority(t)
	p, q := newPeer(t), newPeer(t)
	l := NewRevocationList(Expect{Authority: a.Public(), Network: "prod"})
	certExpiry := t0.Add(720 * time.Hour)
	old, err := a.Admit("prod", p, nil, t0.Add(-time.Hour), certExpiry)
	if err != nil {
		t.Fatal(err)
	}
	r, err := a.Revoke("prod", p, t0)
	if err != nil {
		t.Fatal(err)
	}
	if l.IsRevoked(p, t0) {
		t.Fatal("revoked before any revocation")
	}
	if changed, err := l.Add(r, certExpiry); err != nil || !changed {
		t.Fatalf("Add: %v %v", changed, err)
	}
	if changed, _ := l.Add(r, certExpiry); changed {
		t.Error("the same revocation twice changed the list")
	}
	// Kept for the certificate's lifetime, and only then dropped.
	for _, tc := range []struct {
		at   time.Time
		want bool
	}{{t0, true}, {certExpiry.Add(-time.Second), true}, {certExpiry, false}} {
		if got := l.IsRevoked(p, tc.at); got != tc.want {
			t.Errorf("IsRevoked at %s = %v, want %v", tc.at, got, tc.want)
		}
	}
	if l.IsRevoked(q, t0) {
		t.Error("an unrelated peer is revoked")
	}
	if !l.Revokes(old, t0) {
		t.Error("a certificate issued before the revocation is not revoked")
	}
	again, err := a.Admit("prod", p, nil, t0.Add(time.Minute), certExpiry)
	if err != nil {
		t.Fatal(err)
	}
	if l.Revokes(again, t0.Add(2*time.Minute)) {
		t.Error("a certificate issued after the revocation (peer admitted again) is revoked")
	}
	// A later expiry extends the keeping; an earlier one does not shorten it.
	if changed, _ := l.Add(r, certExpiry.Add(time.Hour)); !changed || !l.IsRevoked(p, certExpiry) {
		t.Error("a later expiry did not extend the revocation")
	}
	if changed, _ := l.Add(r, t0); changed {
		t.Error("an earlier expiry changed the list")
	}
	// Refuses a revocation it cannot trust.
	foreign, _ := other.Revoke("prod", q, t0)
	if _, err := l.Add(foreign, certExpiry); !errors.Is(err, ErrOtherAuthority) || l.IsRevoked(q, t0) {
		t.Errorf("foreign revocation: %v", err)
	}
	wrongNet, _ := a.Revoke("dev", q, t0)
	if _, err := l.Add(wrongNet, certExpiry); !errors.Is(err, ErrWrongNetwork) || l.IsRevoked(q, t0) {
		t.Errorf("other network's revocation: %v", err)
	}
	if k := l.Kept(certExpiry); len(k) != 1 || k[0].Peer() != p {
		t.Errorf("Kept before the kept expiry: %v, want the revocation of p", k)
	}
	if k := l.Kept(certExpiry.Add(time.Hour)); len(k) != 0 {
		t.Errorf("Kept at the kept expiry: %d revocations, want none", len(k))
	}
	if n := l.Prune(certExpiry); n != 0 || l.Len() != 1 {
		t.Errorf("Prune before the kept expiry dropped %d, len %d", n, l.Len())
	}
	if n := l.Prune(certExpiry.Add(time.Hour)); n != 1 || l.Len() != 0 {
		t.Errorf("Prune at the kept expiry dropped %d, len %d", n, l.Len())
	}
}
