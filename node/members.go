package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/node/authority"
	"github.com/workmesh/workmesh/node/httpapi"
	"github.com/workmesh/workmesh/pubsub"
)

// revocationKeep is how long a revocation is kept when the node holds no
// certificate of the revoked peer (whose expiry would say how long): a
// year, longer than any certificate an operator issues for a network's
// day-to-day members.
const revocationKeep = 365 * 24 * time.Hour

// memberSweep is how often a node with a network authority looks whether a
// member's certificate expired: the peer leaves the table (and the
// dispatcher's candidates) within this of its expiry. Reads of the table
// leave it out from the expiry on.
const memberSweep = 100 * time.Millisecond

// Members is the rule of a closed network: a peer belongs when its record
// carries a membership certificate that the network's authority signed for
// that network and that peer, that has not expired and that no revocation
// the node keeps revokes. A peer table with Members (PeerTableConfig)
// takes records only from members and counts only members among its
// peers; it is safe for concurrent use.
type Members struct {
	want authority.Expect
	revs *authority.RevocationList
	// revoked counts the revocations that changed the list.
	revoked atomic.Uint64
}

// NewMembers returns the rule of network under auth.
func NewMembers(auth authority.PublicKey, network string) (*Members, error) {
	if auth.IsZero() {
		return nil, errors.New("members: no network authority")
	}
	want := authority.Expect{Authority: auth, Network: network}
	return &Members{want: want, revs: authority.NewRevocationList(want)}, nil
}

// Authority is the network's authority key.
func (m *Members) Authority() authority.PublicKey { return m.want.Authority }

// admit checks the certificate in nd at now: the error says why nd's peer
// is not a member. held, when it carries the same certificate bytes,
// saves decoding and checking its signature again.
func (m *Members) admit(nd *NodeData, held *PeerInfo, now time.Time) (*authority.Certificate, error) {
	if len(nd.Cert) == 0 {
		return nil, fmt.Errorf("record of %s carries no membership certificate", nd.PeerID)
	}
	var c *authority.Certificate
	if held != nil && held.Cert != nil && bytes.Equal(held.Data.Cert, nd.Cert) {
		c = held.Cert
		if !now.Before(c.Expires()) {
			return nil, fmt.Errorf("membership certificate for peer %s: expired at %s", nd.PeerID, c.Expires().Format(time.RFC3339))
		}
	} else {
		var err error
		if c, err = authority.DecodeCertificate(nd.Cert); err != nil {
			return nil, err
		}
		want := m.want
		want.Peer = nd.PeerID
		if err := c.Verify(want, now); err != nil {
			return nil, err
		}
	}
	if m.revs.Revokes(c, now) {
		return nil, fmt.Errorf("membership certificate for peer %s: revoked", nd.PeerID)
	}
	return c, nil
}

// counts reports whether c still makes its peer a member at now.
func (m *Members) counts(c *authority.Certificate, now time.Time) bool {
	return c != nil && now.Before(c.Expires()) && !m.revs.Revokes(c, now)
}

// Revoke verifies r and keeps it until until. It reports whether it was
// new to the node.
func (m *Members) Revoke(r *authority.Revocation, until time.Time) (bool, error) {
	changed, err := m.revs.Add(r, until)
	if changed {
		m.revoked.Add(1)
	}
	return changed, err
}

// Revocations is the number of revocations kept.
func (m *Members) Revocations() int { return m.revs.Len() }

// GroupLabels are the labels that put the peer in a group: with a network
// authority the ones its certificate attests, otherwise the ones its
// record declares.
func (p PeerInfo) GroupLabels() []string {
	if p.Cert != nil {
		return p.Cert.Labels()
	}
	return p.Data.Labels
}

// WithMembership makes the node's network a closed one: records, work
// and protocol streams are taken only from the members auth vouches for
// (see Members), and the node carries cert, its own certificate (nil: the
// node has none, and the network's members will refuse it), in its
// record.
func WithMembership(auth authority.PublicKey, cert *authority.Certificate) Option {
	return func(o *options) error {
		if auth.IsZero() {
			return errors.New("node: membership needs a network authority")
		}
		o.authority, o.cert = auth, cert
		return nil
	}
}

// Members returns the rule of the node's closed network, or nil for an
// open one.
func (n *Node) Members() *Members { return n.table.members }

// IsMember reports whether p may work with this node: in an open network
// any peer, in a closed one a peer whose record (with its certificate)
// the table holds now.
func (n *Node) IsMember(p peer.ID) bool {
	if n.table.members == nil {
		return true
	}
	_, ok := n.table.Get(p)
	return ok
}

// refuseStranger resets s when its peer is not a member (see IsMember),
// returning why; nil lets the exchange go on.
func (n *Node) refuseStranger(s network.Stream, what string) error {
	from := s.Conn().RemotePeer()
	if n.IsMember(from) {
		return nil
	}
	n.strangers.Add(1)
	return fmt.Errorf("%s from %s refused: not a member of network %s", what, from, n.cfg.Network)
}

// StrangerStreams counts the health and nodedata streams refused because
// their peer is not a member.
func (n *Node) StrangerStreams() uint64 { return n.strangers.Load() }

// PublishRevocation verifies a revocation signed by the network's
// authority, drops the revoked peer at once (from the table and so from
// every candidate list) and publishes the revocation on gossip, where
// every member does the same. It reports whether the revocation was new
// to this node.
func (n *Node) PublishRevocation(ctx context.Context, b []byte) (bool, error) {
	if n.table.members == nil {
		return false, errors.New("publish revocation: this node has no network authority (an open network has nothing to revoke)")
	}
	r, changed, err := n.gossip.revoke(b)
	if err != nil {
		return false, fmt.Errorf("publish revocation: %w", err)
	}
	if err := n.gossip.ann.Publish(ctx, r.Encode()); err != nil {
		return changed, fmt.Errorf("publish revocation: %w", err)
	}
	n.log.WithField("peer", r.Peer().String()).Info("revocation published: the peer is no longer a member")
	return changed, nil
}

// revoke decodes and verifies a revocation, keeps it and drops its peer.
func (g *gossip) revoke(b []byte) (*authority.Revocation, bool, error) {
	m := g.table.members
	if m == nil {
		return nil, false, errors.New("no network authority")
	}
	r, err := authority.DecodeRevocation(b)
	if err != nil {
		return nil, false, err
	}
	until := g.table.clock.Now().Add(revocationKeep)
	if e, ok := g.table.entry(r.Peer()); ok && e.Cert != nil {
		until = e.Cert.Expires()
	}
	changed, err := m.Revoke(r, until)
	if err != nil {
		return nil, false, err
	}
	if changed {
		g.table.Expire()
		_ = g.host.Network().ClosePeer(r.Peer())
	}
	return r, changed, nil
}

// verifyRevocation is gossip's check of a revocation: a new one is kept,
// applied and passed on, a known one dropped, a bad one rejected.
func (g *gossip) verifyRevocation(author peer.ID, data []byte) (any, error) {
	if g.table.members == nil {
		return nil, g.ignore("revocation on an open network")
	}
	r, changed, err := g.revoke(data)
	if err != nil {
		g.log.WithField("from", author.String()).Debugf("revocation refused: %v", err)
		return nil, err
	}
	if !changed {
		return nil, g.ignore("revocation already kept")
	}
	g.log.WithField("peer", r.Peer().String()).Info("revocation received: the peer is no longer a member")
	return nil, nil
}

// memberLoop, in a closed network, takes peers whose certificate expired
// out of the table soon after the expiry (reads leave them out from the
// expiry itself), so that the dispatcher, which follows the table's
// changes, drops them too.
func (n *Node) memberLoop(ctx context.Context) {
	t := time.NewTicker(memberSweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if next := n.table.nextCertExpiry.Load(); next != 0 && n.table.clock.Now().UnixNano() >= next {
				n.table.Expire()
			}
		}
	}
}

// noteCertLocked lowers the table's next certificate expiry to c's.
func (t *PeerTable) noteCertLocked(c *authority.Certificate) {
	if c == nil {
		return
	}
	at := c.Expires().UnixNano()
	if next := t.nextCertExpiry.Load(); next == 0 || at < next {
		t.nextCertExpiry.Store(at)
	}
}

// recomputeCertExpiryLocked sets the next certificate expiry from the
// entries held.
func (t *PeerTable) recomputeCertExpiryLocked() {
	var next int64
	for _, e := range t.byID {
		if e.Cert != nil {
			if at := e.Cert.Expires().UnixNano(); next == 0 || at < next {
				next = at
			}
		}
	}
	t.nextCertExpiry.Store(next)
}

// ignore drops a gossip message without penalizing its sender.
func (g *gossip) ignore(why string) error { return fmt.Errorf("%w: %s", pubsub.ErrIgnore, why) }

// member reports whether e counts as a member at now (always in an open
// network).
func (t *PeerTable) member(e *PeerInfo, now time.Time) bool {
	return t.members == nil || t.members.counts(e.Cert, now)
}

// certBytes is c's encoding, nil for no certificate.
func certBytes(c *authority.Certificate) []byte {
	if c == nil {
		return nil
	}
	return c.Encode()
}

// RevocationsPath is the local API route a revocation is published at:
// POST with a RevocationRequest as the body.
const RevocationsPath = "/v1/revocations"

// RevocationRequest is the body of POST /v1/revocations.
type RevocationRequest struct {
	// Revocation is the revocation file's bytes (base64 in JSON).
	Revocation []byte `json:"revocation"`
}

// RevocationAnswer is the answer to POST /v1/revocations.
type RevocationAnswer struct {
	// Peer is the revoked peer.
	Peer string `json:"peer"`
	// New is false when the node kept this revocation already (it was
	// published again all the same).
	New bool `json:"new"`
}

// memberRoutes mounts POST /v1/revocations, behind the API's token like
// every route.
func (n *Node) memberRoutes() error {
	return n.api.Handle("POST "+RevocationsPath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, err := io.ReadAll(io.LimitReader(r.Body, 4*authority.MaxEncoded+1))
		if err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, "", "read the body: %v", err)
			return
		}
		if len(raw) > 4*authority.MaxEncoded {
			httpapi.WriteError(w, http.StatusRequestEntityTooLarge, "", "body: more than the %d bytes a revocation needs", 4*authority.MaxEncoded)
			return
		}
		var req RevocationRequest
		if err := decodeStrict(raw, &req); err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, "", "body: %v", err)
			return
		}
		b := req.Revocation
		rev, err := authority.DecodeRevocation(b)
		if err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, "revocation", "revocation: %v", err)
			return
		}
		changed, err := n.PublishRevocation(r.Context(), b)
		if err != nil {
			code := http.StatusBadRequest
			if changed {
				code = http.StatusBadGateway
			}
			httpapi.WriteError(w, code, "", "%v", err)
			return
		}
		n.writeJSON(w, RevocationAnswer{Peer: rev.Peer().String(), New: changed})
	}))
}

// attestedLabels is the view of p's attested labels: nil in an open
// network, never nil for a member.
func attestedLabels(p PeerInfo) []string {
	if p.Cert == nil {
		return nil
	}
	return nonNil(p.Cert.Labels())
}

// declaredLabels are the labels p declares that its certificate does not
// attest (nil in an open network).
func declaredLabels(p PeerInfo) []string {
	if p.Cert == nil {
		return nil
	}
	var out []string
	for _, l := range p.Data.Labels {
		if !p.Cert.HasLabel(l) {
			out = append(out, l)
		}
	}
	return out
}

// sendRevocations writes, in a whole-table nodedata answer of a closed
// network, the revocations the node keeps, before the records (each one
// within the answer's budget, counted in sent), so that a member that
// joins after a revocation was published learns of it in its first syncs.
func (n *Node) sendRevocations(w io.Writer, send func([]byte) bool, sent int) (int, error) {
	m := n.table.members
	if m == nil {
		return sent, nil
	}
	for _, r := range m.revs.Kept(n.table.clock.Now()) {
		if sent >= maxSyncRecords {
			break
		}
		b := r.Encode()
		if !send(b) {
			break
		}
		if err := writeFrame(w, b); err != nil {
			return sent, err
		}
		sent++
	}
	return sent, nil
}

// takeSynced enters one frame of a nodedata answer: a revocation (closed
// network) or a record. It reports whether the table changed. An answer
// to a request for the peer's own record (not all) brings that record
// only: any peer can have the node ask it (a health answer naming a newer
// record, joining the gossip topic), and its answers of 1,024 made-up
// peers each filled the peer table in ten. Whole tables are asked of the
// node's first two peers only (fullSyncs).
func (n *Node) takeSynced(b []byte, from peer.ID, all bool) bool {
	if authority.IsRevocation(b) {
		if n.table.members == nil {
			return false
		}
		r, changed, err := n.gossip.revoke(b)
		if err != nil {
			n.log.WithField("from", from.String()).Debugf("synced revocation refused: %v", err)
			return false
		}
		if changed {
			n.log.WithField("peer", r.Peer().String()).Info("revocation received by sync: the peer is no longer a member")
		}
		return changed
	}
	only := from
	if all {
		only = ""
	}
	ok, _ := n.gossip.accept(b, from, SourceSync, only)
	return ok
}
