package authority

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Revocation is the authority's statement that a peer no longer belongs
// to a network: every certificate of that peer issued at or before the
// revocation stops counting. It is immutable.
type Revocation struct {
	network   string
	peer      peer.ID
	issued    time.Time
	authority PublicKey
	signature []byte
	encoded   []byte
}

// Revoke signs a revocation of p in network, issued at issued (second
// precision).
func (a *Authority) Revoke(network string, p peer.ID, issued time.Time) (*Revocation, error) {
	if err := checkNetwork(network); err != nil {
		return nil, fmt.Errorf("revoke: %w", err)
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("revoke: peer: %w", err)
	}
	issued = issued.Truncate(time.Second).UTC()
	if issued.Unix() < 0 || issued.Unix() > maxUnix {
		return nil, fmt.Errorf("revoke: the issue time must lie between 1970 and 9999")
	}
	r := &Revocation{network: network, peer: p, issued: issued, authority: a.pub}
	signed := r.signedBytes()
	sig, err := a.priv.Sign(signed)
	if err != nil {
		return nil, fmt.Errorf("revoke: sign: %w", err)
	}
	r.signature = sig
	e := encoder{b: signed}
	e.bytes(sig)
	r.encoded = e.b
	return r, nil
}

func (r *Revocation) signedBytes() []byte {
	e := encoder{b: []byte(revocationHeader)}
	e.str(r.network)
	e.bytes([]byte(r.peer))
	e.time(r.issued)
	e.bytes(r.authority.bytes())
	return e.b
}

// DecodeRevocation parses an encoded revocation, checking its form only;
// Verify checks its signature and what it says.
func DecodeRevocation(b []byte) (*Revocation, error) {
	d := &decoder{kind: "revocation", b: b}
	if err := d.header(revocationHeader, certificateHeader, "membership certificate"); err != nil {
		return nil, err
	}
	r := &Revocation{}
	var err error
	if r.network, err = d.network(); err != nil {
		return nil, err
	}
	if r.peer, err = d.peer(); err != nil {
		return nil, err
	}
	if r.issued, err = d.time("issued"); err != nil {
		return nil, err
	}
	if r.authority, err = d.authority(); err != nil {
		return nil, err
	}
	sig, err := d.bytes("signature", maxSignatureLen)
	if err != nil {
		return nil, err
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	r.signature = slices.Clone(sig)
	e := encoder{b: r.signedBytes()}
	e.bytes(r.signature)
	if err := d.canonical(e.b); err != nil {
		return nil, err
	}
	r.encoded = e.b
	return r, nil
}

// Verify reports whether r counts for want: its signature verifies, it is
// signed by want.Authority and it is about want.Network (and want.Peer,
// when set).
func (r *Revocation) Verify(want Expect) error {
	if err := r.VerifySignature(); err != nil {
		return err
	}
	if want.Authority.IsZero() {
		return verifyErrorf(ErrOtherAuthority, "revocation of peer %s: no network authority to check it against", r.peer)
	}
	if !r.authority.Equal(want.Authority) {
		return verifyErrorf(ErrOtherAuthority, "revocation of peer %s: signed by another authority (%s), not this network's (%s)",
			r.peer, r.authority, want.Authority)
	}
	if r.network != want.Network {
		return verifyErrorf(ErrWrongNetwork, "revocation of peer %s: wrong network: it is for network %q, not %q", r.peer, r.network, want.Network)
	}
	if want.Peer != "" && r.peer != want.Peer {
		return verifyErrorf(ErrWrongPeer, "revocation: wrong peer: it revokes peer %s, not %s", r.peer, want.Peer)
	}
	return nil
}

// VerifySignature reports whether r's signature verifies under the
// authority it names.
func (r *Revocation) VerifySignature() error {
	ok, err := r.authority.key.Verify(r.signedBytes(), r.signature)
	if err != nil || !ok {
		return verifyErrorf(ErrBadSignature, "revocation of peer %s: the signature does not verify (the revocation was changed after signing)", r.peer)
	}
	return nil
}

// Network is the network r is about.
func (r *Revocation) Network() string { return r.network }

// Peer is the peer r revokes.
func (r *Revocation) Peer() peer.ID { return r.peer }

// IssuedAt is when r was signed; certificates of its peer issued later
// are not revoked by it.
func (r *Revocation) IssuedAt() time.Time { return r.issued }

// Authority is the key r names as its signer.
func (r *Revocation) Authority() PublicKey { return r.authority }

// Encode returns r's canonical bytes (a copy).
func (r *Revocation) Encode() []byte { return slices.Clone(r.encoded) }

// RevocationList is the revocations a member keeps: each verified against
// the network's authority when added, and kept until the expiry given with
// it (the revoked certificate's, so that the certificate never counts
// again within its lifetime). It is safe for concurrent use.
type RevocationList struct {
	want Expect
	mu   sync.Mutex
	by   map[peer.ID]revoked
}

type revoked struct {
	rev   *Revocation
	until time.Time
}

// NewRevocationList returns an empty list that takes revocations signed
// by want.Authority for want.Network (want.Peer is ignored).
func NewRevocationList(want Expect) *RevocationList {
	want.Peer = ""
	return &RevocationList{want: want, by: map[peer.ID]revoked{}}
}

// Add verifies r and keeps it until until. A second revocation of the same
// peer keeps the later issue time and the later of the two expiries. It
// reports whether the list changed.
func (l *RevocationList) Add(r *Revocation, until time.Time) (bool, error) {
	if err := r.Verify(l.want); err != nil {
		return false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	old, ok := l.by[r.peer]
	if !ok {
		l.by[r.peer] = revoked{rev: r, until: until}
		return true, nil
	}
	changed := false
	if r.issued.After(old.rev.issued) {
		old.rev, changed = r, true
	}
	if until.After(old.until) {
		old.until, changed = until, true
	}
	l.by[r.peer] = old
	return changed, nil
}

// IsRevoked reports whether p has a revocation kept at now.
func (l *RevocationList) IsRevoked(p peer.ID, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.by[p]
	return ok && now.Before(e.until)
}

// Revokes reports whether c is revoked at now: its peer has a revocation
// kept at now, issued at or after c. A certificate issued after the
// revocation (the peer admitted again) is not revoked.
func (l *RevocationList) Revokes(c *Certificate, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.by[c.peer]
	return ok && now.Before(e.until) && !c.issued.After(e.rev.issued)
}

// Prune drops the revocations kept no longer at now and returns how many
// it dropped.
func (l *RevocationList) Prune(now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for p, e := range l.by {
		if !now.Before(e.until) {
			delete(l.by, p)
			n++
		}
	}
	return n
}

// Len is the number of revocations kept, pruned or not.
func (l *RevocationList) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.by)
}

// IsRevocation reports whether b starts as a revocation does, for a reader
// of a file that may hold either kind of statement.
func IsRevocation(b []byte) bool {
	return len(b) >= len(revocationHeader) && string(b[:len(revocationHeader)]) == revocationHeader
}

// Kept returns the revocations kept at now, in no order.
func (l *RevocationList) Kept(now time.Time) []*Revocation {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*Revocation, 0, len(l.by))
	for _, e := range l.by {
		if now.Before(e.until) {
			out = append(out, e.rev)
		}
	}
	return out
}
