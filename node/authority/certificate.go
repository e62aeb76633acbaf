package authority

import (
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Certificate is a membership certificate: the authority's statement that
// a peer belongs to a network until an expiry, with the labels the
// authority attests for it. It is immutable; Encode gives its bytes.
type Certificate struct {
	network   string
	peer      peer.ID
	labels    []string
	issued    time.Time
	expires   time.Time
	authority PublicKey
	signature []byte
	encoded   []byte
}

// Expect is what a statement must say to count for a node: signed by
// Authority, about Network and, for a certificate, issued to Peer (""
// accepts any peer, for a node whose identity is not known yet).
type Expect struct {
	Authority PublicKey
	Network   string
	Peer      peer.ID
}

// Admit issues a certificate for p in network, valid from issued (second
// precision) until expires, attesting labels (sorted and deduplicated
// here). It refuses an empty label, a bad network name and an expiry not
// after the issue time.
func (a *Authority) Admit(network string, p peer.ID, labels []string, issued, expires time.Time) (*Certificate, error) {
	if err := checkNetwork(network); err != nil {
		return nil, fmt.Errorf("admit: %w", err)
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("admit: peer: %w", err)
	}
	for i, l := range labels {
		if l == "" {
			return nil, fmt.Errorf("admit: label %d is empty", i+1)
		}
	}
	labels = slices.Compact(slices.Sorted(slices.Values(labels)))
	if err := checkLabels(labels); err != nil {
		return nil, fmt.Errorf("admit: %w", err)
	}
	issued, expires = issued.Truncate(time.Second).UTC(), expires.Truncate(time.Second).UTC()
	if issued.Unix() < 0 || expires.Unix() > maxUnix {
		return nil, fmt.Errorf("admit: times must lie between 1970 and 9999")
	}
	if !expires.After(issued) {
		return nil, fmt.Errorf("admit: expiry %s is not after the issue time %s", expires.Format(time.RFC3339), issued.Format(time.RFC3339))
	}
	c := &Certificate{network: network, peer: p, labels: labels, issued: issued, expires: expires, authority: a.pub}
	signed := c.signedBytes()
	sig, err := a.priv.Sign(signed)
	if err != nil {
		return nil, fmt.Errorf("admit: sign: %w", err)
	}
	c.signature = sig
	e := encoder{b: signed}
	e.bytes(sig)
	c.encoded = e.b
	return c, nil
}

// signedBytes is the header and every field but the signature: what the
// signature covers.
func (c *Certificate) signedBytes() []byte {
	e := encoder{b: []byte(certificateHeader)}
	e.str(c.network)
	e.bytes([]byte(c.peer))
	e.uvarint(uint64(len(c.labels)))
	for _, l := range c.labels {
		e.str(l)
	}
	e.time(c.issued)
	e.time(c.expires)
	e.bytes(c.authority.bytes())
	return e.b
}

// DecodeCertificate parses an encoded certificate. It checks the form
// only (every field, the canonical encoding); Verify checks the signature
// and what the certificate says.
func DecodeCertificate(b []byte) (*Certificate, error) {
	d := &decoder{kind: "membership certificate", b: b}
	if err := d.header(certificateHeader, revocationHeader, "revocation"); err != nil {
		return nil, err
	}
	c := &Certificate{}
	var err error
	if c.network, err = d.network(); err != nil {
		return nil, err
	}
	if c.peer, err = d.peer(); err != nil {
		return nil, err
	}
	at := d.off
	n, err := d.uvarint("labels")
	if err != nil {
		return nil, err
	}
	if n > MaxLabels {
		return nil, d.fail(at, "labels", "%d labels, at most %d", n, MaxLabels)
	}
	c.labels = make([]string, 0, n)
	for i := range n {
		at := d.off
		l, err := d.bytes(fmt.Sprintf("labels[%d]", i+1), maxLabelLen)
		if err != nil {
			return nil, err
		}
		c.labels = append(c.labels, string(l))
		if err := checkLabels(c.labels); err != nil {
			return nil, d.fail(at, fmt.Sprintf("labels[%d]", i+1), "%v", err)
		}
	}
	if c.issued, err = d.time("issued"); err != nil {
		return nil, err
	}
	at = d.off
	if c.expires, err = d.time("expires"); err != nil {
		return nil, err
	}
	if !c.expires.After(c.issued) {
		return nil, d.fail(at, "expires", "expiry %s is not after the issue time %s", c.expires.Format(time.RFC3339), c.issued.Format(time.RFC3339))
	}
	if c.authority, err = d.authority(); err != nil {
		return nil, err
	}
	sig, err := d.bytes("signature", maxSignatureLen)
	if err != nil {
		return nil, err
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	c.signature = slices.Clone(sig)
	e := encoder{b: c.signedBytes()}
	e.bytes(c.signature)
	if err := d.canonical(e.b); err != nil {
		return nil, err
	}
	c.encoded = e.b
	return c, nil
}

// Verify reports whether c makes its peer a member for want at now: its
// signature verifies, it is signed by want.Authority, it is for
// want.Network and want.Peer (when set), and now is before its expiry. The
// error says which of these fails, the first in that order.
func (c *Certificate) Verify(want Expect, now time.Time) error {
	if err := c.verifySignature(); err != nil {
		return err
	}
	if want.Authority.IsZero() {
		return verifyErrorf(ErrOtherAuthority, "membership certificate for peer %s: no network authority to check it against", c.peer)
	}
	if !c.authority.Equal(want.Authority) {
		return verifyErrorf(ErrOtherAuthority, "membership certificate for peer %s: signed by another authority (%s), not this network's (%s)",
			c.peer, c.authority, want.Authority)
	}
	if c.network != want.Network {
		return verifyErrorf(ErrWrongNetwork, "membership certificate for peer %s: wrong network: it is for network %q, not %q", c.peer, c.network, want.Network)
	}
	if want.Peer != "" && c.peer != want.Peer {
		return verifyErrorf(ErrWrongPeer, "membership certificate: wrong peer: it is for peer %s, not %s", c.peer, want.Peer)
	}
	if !now.Before(c.expires) {
		return verifyErrorf(ErrExpired, "membership certificate for peer %s: expired at %s", c.peer, c.expires.Format(time.RFC3339))
	}
	return nil
}

// VerifySignature reports whether c's signature verifies under the
// authority it names, without checking that authority or anything c says.
func (c *Certificate) VerifySignature() error { return c.verifySignature() }

func (c *Certificate) verifySignature() error {
	ok, err := c.authority.key.Verify(c.signedBytes(), c.signature)
	if err != nil || !ok {
		return verifyErrorf(ErrBadSignature, "membership certificate for peer %s: the signature does not verify (the certificate was changed after signing)", c.peer)
	}
	return nil
}

// Network is the network c admits its peer to.
func (c *Certificate) Network() string { return c.network }

// Peer is the peer c admits.
func (c *Certificate) Peer() peer.ID { return c.peer }

// Labels returns a copy of the labels the authority attests for the peer,
// sorted.
func (c *Certificate) Labels() []string { return slices.Clone(c.labels) }

// HasLabel reports whether the authority attests label for the peer.
func (c *Certificate) HasLabel(label string) bool {
	_, ok := slices.BinarySearch(c.labels, label)
	return ok
}

// IssuedAt is when the certificate was issued.
func (c *Certificate) IssuedAt() time.Time { return c.issued }

// Expires is when the certificate stops counting.
func (c *Certificate) Expires() time.Time { return c.expires }

// Authority is the key c names as its signer.
func (c *Certificate) Authority() PublicKey { return c.authority }

// Encode returns c's canonical bytes (a copy).
func (c *Certificate) Encode() []byte { return slices.Clone(c.encoded) }
