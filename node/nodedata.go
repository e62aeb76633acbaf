package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/workmesh/workmesh/node/apiv1"
	"google.golang.org/protobuf/encoding/protowire"
)

// MaxRecordSize bounds a signed NodeData envelope on every path (gossip, DHT,
// sync, API). It is checked before anything is decoded.
const MaxRecordSize = 16 << 10

// RecordDomain is the signature domain of a NodeData envelope: a signature
// made for any other kind of libp2p record cannot be passed off as NodeData.
const RecordDomain = "workmesh-nodedata"

// RecordCodec is the envelope payload type of NodeData (no multicodec is
// assigned; the bytes only have to be unique among registered record types).
var RecordCodec = []byte("/workmesh/nodedata/1")

// Bounds on the contents of a NodeData record, so that a peer cannot make
// every other node hold large or absurd values even under MaxRecordSize.
const (
	maxAddrs     = 32
	maxWorkTypes = 64
	maxLabels    = 32
	maxNameLen   = 64
	maxCertLen   = 4 << 10
)

// NodeData is what a node advertises about itself: who it is, where it
// listens, what work it can do and how busy it is.
type NodeData struct {
	// PeerID is the node the record speaks for; it must be the signer.
	PeerID peer.ID `json:"peer_id"`
	// Addrs are the node's listen multiaddrs, without /p2p.
	Addrs []string `json:"addrs"`
	// Version is the workmesh version the node runs.
	Version string `json:"version"`
	// Network is the network the node joined.
	Network string `json:"network"`
	// WorkTypes are the work types the node serves, each with its head.
	WorkTypes []WorkType `json:"work_types"`
	// Labels are the node's group labels.
	Labels []string `json:"labels"`
	// Capacity is how much work the node takes at most.
	Capacity Capacity `json:"capacity"`
	// Load is how much work the node had when the record was signed.
	Load Load `json:"load"`
	// StartTime is when the node started.
	StartTime time.Time `json:"start_time"`
	// Sequence only grows from one record of a node to the next; the
	// highest one wins everywhere.
	Sequence uint64 `json:"sequence"`
	// Cert is the node's membership certificate (authority.Certificate's
	// encoding) in a closed network; absent in an open one, and in
	// records of nodes that predate it.
	Cert []byte `json:"cert,omitempty"`
}

// WorkType is one work type a node serves.
type WorkType struct {
	// Name is the work type, e.g. sha256.
	Name string `json:"name"`
	// Head is the highest position of data the node can serve for this
	// type; nil for types where positions do not exist or are unknown.
	Head *uint64 `json:"head,omitempty"`
}

// Capacity is how much work a node takes at most (its record says).
type Capacity = apiv1.Capacity

// Load is how much work a node has at one moment.
type Load = apiv1.Load

// Serves reports whether the record advertises the work type.
func (nd NodeData) Serves(workType string) bool {
	for _, wt := range nd.WorkTypes {
		if wt.Name == workType {
			return true
		}
	}
	return false
}

// Head returns the advertised head of a work type and whether there is one.
func (nd NodeData) Head(workType string) (uint64, bool) {
	for _, wt := range nd.WorkTypes {
		if wt.Name == workType && wt.Head != nil {
			return *wt.Head, true
		}
	}
	return 0, false
}

// HasLabels reports whether the record carries every one of labels.
func (nd NodeData) HasLabels(labels []string) bool { return hasLabels(nd.Labels, labels) }

// hasLabels reports whether have holds every one of labels.
func hasLabels(have, labels []string) bool {
	for _, want := range labels {
		found := false
		for _, h := range have {
			if h == want {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// WorkTypeNames returns the names of the advertised work types.
func (nd NodeData) WorkTypeNames() []string {
	names := make([]string, len(nd.WorkTypes))
	for i, wt := range nd.WorkTypes {
		names[i] = wt.Name
	}
	return names
}

// Multiaddrs returns the advertised listen addresses, parsed (they were
// checked when the record was opened).
func (nd NodeData) Multiaddrs() []ma.Multiaddr {
	out := make([]ma.Multiaddr, 0, len(nd.Addrs))
	for _, s := range nd.Addrs {
		if a, err := ma.NewMultiaddr(s); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// check reports the first thing wrong with a decoded record, as a
// malformed-record error.
func (nd *NodeData) check() error {
	switch {
	case nd.PeerID == "":
		return errors.New("no peer_id")
	case nd.Network == "" || len(nd.Network) > maxNameLen:
		return fmt.Errorf("network %q: want 1 to %d bytes", nd.Network, maxNameLen)
	case nd.Sequence == 0:
		return errors.New("sequence 0")
	case len(nd.Version) > maxNameLen:
		return fmt.Errorf("version: longer than %d bytes", maxNameLen)
	case len(nd.Addrs) > maxAddrs:
		return fmt.Errorf("%d addrs: at most %d", len(nd.Addrs), maxAddrs)
	case len(nd.WorkTypes) > maxWorkTypes:
		return fmt.Errorf("%d work types: at most %d", len(nd.WorkTypes), maxWorkTypes)
	case len(nd.Labels) > maxLabels:
		return fmt.Errorf("%d labels: at most %d", len(nd.Labels), maxLabels)
	case nd.Capacity.MaxConcurrent < 0 || nd.Capacity.QueueSize < 0:
		return errors.New("negative capacity")
	case nd.Load.InFlight < 0 || nd.Load.Queued < 0:
		return errors.New("negative load")
	case len(nd.Cert) > maxCertLen:
		return fmt.Errorf("cert: %d bytes, at most %d", len(nd.Cert), maxCertLen)
	}
	for _, s := range nd.Addrs {
		if _, err := ma.NewMultiaddr(s); err != nil {
			return fmt.Errorf("addr %q: %w", s, err)
		}
	}
	seen := make(map[string]bool, len(nd.WorkTypes))
	for _, wt := range nd.WorkTypes {
		if wt.Name == "" || len(wt.Name) > maxNameLen {
			return fmt.Errorf("work type %q: want 1 to %d bytes", wt.Name, maxNameLen)
		}
		if seen[wt.Name] {
			return fmt.Errorf("work type %q listed twice", wt.Name)
		}
		seen[wt.Name] = true
	}
	for _, l := range nd.Labels {
		if l == "" || len(l) > maxNameLen {
			return fmt.Errorf("label %q: want 1 to %d bytes", l, maxNameLen)
		}
	}
	return nil
}

// nodeDataRecord makes NodeData a libp2p record that can be sealed in an
// envelope.
type nodeDataRecord struct{ NodeData }

var _ record.Record = (*nodeDataRecord)(nil)

func init() { record.RegisterType(&nodeDataRecord{}) }

// Domain implements record.Record.
func (*nodeDataRecord) Domain() string { return RecordDomain }

// Codec implements record.Record.
func (*nodeDataRecord) Codec() []byte { return RecordCodec }

// MarshalRecord implements record.Record.
func (r *nodeDataRecord) MarshalRecord() ([]byte, error) { return json.Marshal(&r.NodeData) }

// errPayload marks a payload that does not decode, so that Open can tell it
// from a bad signature.
type errPayload struct{ err error }

func (e errPayload) Error() string { return e.err.Error() }
func (e errPayload) Unwrap() error { return e.err }

// UnmarshalRecord implements record.Record. Unknown fields and trailing data
// are errors: a record is either exactly understood or rejected.
func (r *nodeDataRecord) UnmarshalRecord(b []byte) error {
	if err := decodeStrict(b, &r.NodeData); err != nil {
		return errPayload{fmt.Errorf("decode nodedata: %w", err)}
	}
	return nil
}

// SignedNodeData is a NodeData record whose signature has been checked,
// together with the envelope bytes it came in (which any peer may pass on:
// the signature is what makes it trustworthy, not who delivered it).
type SignedNodeData struct {
	// Data is the verified record.
	Data NodeData
	// Envelope is the signed envelope, as received.
	Envelope []byte
}

// SignNodeData seals nd in an envelope signed with key. The key must belong
// to nd.PeerID.
func SignNodeData(nd NodeData, key crypto.PrivKey) ([]byte, error) {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("sign nodedata: %w", err)
	}
	if id != nd.PeerID {
		return nil, fmt.Errorf("sign nodedata: key of %s cannot sign for %s", id, nd.PeerID)
	}
	env, err := record.Seal(&nodeDataRecord{nd}, key)
	if err != nil {
		return nil, fmt.Errorf("sign nodedata: %w", err)
	}
	b, err := env.Marshal()
	if err != nil {
		return nil, fmt.Errorf("sign nodedata: %w", err)
	}
	if len(b) > MaxRecordSize {
		return nil, fmt.Errorf("sign nodedata: %d bytes, more than the %d allowed", len(b), MaxRecordSize)
	}
	return b, nil
}

// OpenNodeData checks a signed NodeData envelope and returns its record. The
// checks, in order: size (before decoding), envelope form, signature, that the
// signer is the peer the record speaks for, the record's form, the network.
// A failure is a *RejectError saying why. It is the one signature check a
// record costs on its way in, whether it came by gossip (whose messages carry
// no second signature), sync or the DHT.
func OpenNodeData(data []byte, network string) (*SignedNodeData, error) {
	if len(data) > MaxRecordSize {
		return nil, reject(RejectOversized, fmt.Errorf("%d bytes, more than %d", len(data), MaxRecordSize))
	}
	env, err := record.UnmarshalEnvelope(data)
	if err != nil {
		return nil, reject(RejectMalformed, fmt.Errorf("envelope: %w", err))
	}
	if !bytes.Equal(env.PayloadType, RecordCodec) {
		return nil, reject(RejectMalformed, fmt.Errorf("payload type %q is not nodedata", env.PayloadType))
	}
	signer, err := peer.IDFromPublicKey(env.PublicKey)
	if err != nil {
		return nil, reject(RejectMalformed, fmt.Errorf("signer key: %w", err))
	}
	var rec nodeDataRecord
	if _, err := record.ConsumeTypedEnvelope(data, &rec); err != nil {
		var pe errPayload
		if errors.As(err, &pe) {
			return nil, reject(RejectMalformed, pe.err)
		}
		return nil, reject(RejectForged, fmt.Errorf("signature: %w", err))
	}
	if err := rec.check(); err != nil {
		return nil, reject(RejectMalformed, err)
	}
	if rec.PeerID != signer {
		return nil, reject(RejectForged, fmt.Errorf("record for %s signed by %s", rec.PeerID, signer))
	}
	if rec.Network != network {
		return nil, reject(RejectWrongNetwork, fmt.Errorf("network %q, want %q", rec.Network, network))
	}
	return &SignedNodeData{Data: rec.NodeData, Envelope: data}, nil
}

// envelopeSigner returns the peer whose key signed the envelope in data,
// without checking the signature or decoding the record: enough to look up
// what the table holds of that peer, never enough to trust the record.
//
// Every gossiped record and every synced one is looked up this way, most of
// them held already, so an Ed25519 key (every workmesh node's) is read off
// the envelope's bytes as they are: its peer ID inlines the key's protobuf
// encoding, which is the envelope's public_key field when that is in its
// canonical form. Any other key, or form, takes the whole decoding.
func envelopeSigner(data []byte) (peer.ID, bool) {
	if len(data) > MaxRecordSize {
		return "", false
	}
	if id, ok := ed25519Signer(data); ok {
		return id, true
	}
	env, err := record.UnmarshalEnvelope(data)
	if err != nil {
		return "", false
	}
	id, err := peer.IDFromPublicKey(env.PublicKey)
	return id, err == nil
}

// ed25519Key is how the canonical protobuf encoding of an Ed25519 public
// key begins: field 1 (key type) = 1 (Ed25519), then field 2 (data) of 32
// bytes. A peer ID inlines such an encoding (36 bytes) as an identity
// multihash: code 0x00, length 0x24.
var ed25519Key = []byte{0x08, 0x01, 0x12, 0x20}

// ed25519Signer returns the peer ID of the envelope's public key when the
// envelope carries it once and it is an Ed25519 key in canonical form.
func ed25519Signer(data []byte) (peer.ID, bool) {
	var key []byte
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return "", false
		}
		data = data[n:]
		if num == 1 {
			if typ != protowire.BytesType || key != nil {
				return "", false
			}
			key, n = protowire.ConsumeBytes(data)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, data)
		}
		if n < 0 {
			return "", false
		}
		data = data[n:]
	}
	if len(key) != len(ed25519Key)+32 || !bytes.HasPrefix(key, ed25519Key) {
		return "", false
	}
	id := make([]byte, 0, 2+len(key))
	id = append(id, 0x00, byte(len(key)))
	return peer.ID(append(id, key...)), true
}
