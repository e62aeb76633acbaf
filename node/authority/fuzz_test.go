package authority

import (
	"bytes"
	"testing"
	"time"
)

// FuzzDecode feeds both decoders arbitrary bytes. They must never panic,
// and whatever one accepts must encode back to exactly the same bytes
// (one encoding per statement). The seed corpus runs in every go test.
func FuzzDecode(f *testing.F) {
	a, err := Generate()
	if err != nil {
		f.Fatal(err)
	}
	p := newPeer(f)
	c, err := a.Admit("prod", p, []string{"archive", "staked"}, t0, t0.Add(720*time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	r, err := a.Revoke("prod", p, t0)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(c.Encode())
	f.Add(r.Encode())
	f.Add([]byte(certificateHeader))
	f.Add([]byte(revocationHeader))
	f.Add(append([]byte(certificateHeader), 0xff, 0xff, 0xff))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, err := DecodeCertificate(b); err == nil {
			if !bytes.Equal(c.Encode(), b) {
				t.Fatalf("certificate re-encodes differently")
			}
			_ = c.Verify(Expect{Authority: a.Public(), Network: "prod"}, t0)
		}
		if r, err := DecodeRevocation(b); err == nil {
			if !bytes.Equal(r.Encode(), b) {
				t.Fatalf("revocation re-encodes differently")
			}
			_ = r.Verify(Expect{Authority: a.Public(), Network: "prod"})
		}
	})
}
