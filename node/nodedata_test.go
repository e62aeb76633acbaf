package node

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"
)

const testNetwork = "testnet"

func newKey(t testing.TB) (crypto.PrivKey, peer.ID) {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return key, id
}

func sampleNodeData(id peer.ID, seq uint64) NodeData {
	head := uint64(42)
	return NodeData{
		PeerID:    id,
		Addrs:     []string{"/ip4/127.0.0.1/udp/4001/quic-v1"},
		Version:   "test",
		Network:   testNetwork,
		WorkTypes: []WorkType{{Name: "echo"}, {Name: "blocks", Head: &head}},
		Labels:    []string{"zone-a"},
		Capacity:  Capacity{MaxConcurrent: 4, QueueSize: 100},
		StartTime: time.Unix(1700000000, 0).UTC(),
		Sequence:  seq,
	}
}

// signRaw seals any record type with key, bypassing SignNodeData's own
// checks, to build hostile envelopes.
func signRaw(t testing.TB, rec record.Record, key crypto.PrivKey) []byte {
	t.Helper()
	env, err := record.Seal(rec, key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rawPayload is a record with the NodeData domain and codec but any payload.
type rawPayload struct{ payload []byte }

func (*rawPayload) Domain() string                   { return RecordDomain }
func (*rawPayload) Codec() []byte                    { return RecordCodec }
func (r *rawPayload) MarshalRecord() ([]byte, error) { return r.payload, nil }
func (r *rawPayload) UnmarshalRecord(b []byte) error { r.payload = b; return nil }

// otherCodec is a well-signed record of another type.
type otherCodec struct{ rawPayload }

func (*otherCodec) Codec() []byte { return []byte("/not/nodedata") }

func TestSignAndOpenNodeData(t *testing.T) {
	key, id := newKey(t)
	nd := sampleNodeData(id, 7)
	env, err := SignNodeData(nd, key)
	if err != nil {
		t.Fatal(err)
	}
	sd, err := OpenNodeData(env, testNetwork)
	if err != nil {
		t.Fatalf("open a good record: %v", err)
	}
	if sd.Data.PeerID != id || sd.Data.Sequence != 7 || !bytes.Equal(sd.Envelope, env) {
		t.Fatalf("opened %+v", sd.Data)
	}
	if h, ok := sd.Data.Head("blocks"); !ok || h != 42 {
		t.Errorf("head of blocks = %d, %v; want 42, true", h, ok)
	}
	if _, ok := sd.Data.Head("echo"); ok {
		t.Error("echo has no head but one was reported")
	}
}

func TestSignNodeDataRefusesForeignPeer(t *testing.T) {
	key, _ := newKey(t)
	_, other := newKey(t)
	if _, err := SignNodeData(sampleNodeData(other, 1), key); err == nil {
		t.Fatal("signed a record for another peer")
	}
}

// TestOpenNodeDataRejects checks that every kind of bad record is refused
// with its own reason. Each case fails if its check is removed.
func TestOpenNodeDataRejects(t *testing.T) {
	key, id := newKey(t)
	otherKey, otherID := newKey(t)
	good := sampleNodeData(id, 5)
	goodJSON, _ := json.Marshal(good)

	tampered := func() []byte {
		env, err := SignNodeData(good, key)
		if err != nil {
			t.Fatal(err)
		}
		// Flip one byte of the payload ("test" version -> "tesT"): the
		// envelope still decodes, the signature no longer matches.
		i := bytes.Index(env, []byte(`"version":"test"`))
		if i < 0 {
			t.Fatal("payload not found in envelope")
		}
		out := bytes.Clone(env)
		out[i+len(`"version":"tes`)] = 'T'
		return out
	}

	withField := func(extra string) []byte {
		p := bytes.TrimSuffix(goodJSON, []byte("}"))
		return signRaw(t, &rawPayload{append(p, []byte(","+extra+"}")...)}, key)
	}
	mutate := func(f func(*NodeData)) []byte {
		nd := sampleNodeData(id, 5)
		f(&nd)
		b, _ := json.Marshal(nd)
		return signRaw(t, &rawPayload{b}, key)
	}

	cases := []struct {
		name string
		data []byte
		want RejectReason
	}{
		{"forged signature", tampered(), RejectForged},
		{"signed by another peer", signRaw(t, &rawPayload{goodJSON}, otherKey), RejectForged},
		{"oversized", bytes.Repeat([]byte{0x0a}, MaxRecordSize+1), RejectOversized},
		{"oversized but otherwise valid", mutate(func(nd *NodeData) { nd.Version = strings.Repeat("v", MaxRecordSize) }), RejectOversized},
		{"not an envelope", []byte("hello, world"), RejectMalformed},
		{"empty", nil, RejectMalformed},
		{"other record type", signRaw(t, &otherCodec{rawPayload{goodJSON}}, key), RejectMalformed},
		{"payload not JSON", signRaw(t, &rawPayload{[]byte("{not json")}, key), RejectMalformed},
		{"unknown field", withField(`"admin":true`), RejectMalformed},
		{"trailing data", signRaw(t, &rawPayload{append(bytes.Clone(goodJSON), []byte(" {}")...)}, key), RejectMalformed},
		{"bad multiaddr", mutate(func(nd *NodeData) { nd.Addrs = []string{"/ip4/999.0.0.1/udp/1"} }), RejectMalformed},
		{"sequence zero", mutate(func(nd *NodeData) { nd.Sequence = 0 }), RejectMalformed},
		{"duplicate work type", mutate(func(nd *NodeData) { nd.WorkTypes = []WorkType{{Name: "echo"}, {Name: "echo"}} }), RejectMalformed},
		{"negative load", mutate(func(nd *NodeData) { nd.Load.InFlight = -1 }), RejectMalformed},
		{"wrong network", mutate(func(nd *NodeData) { nd.Network = "othernet" }), RejectWrongNetwork},
		{"record claims another peer", mutate(func(nd *NodeData) { nd.PeerID = otherID }), RejectForged},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sd, err := OpenNodeData(tc.data, testNetwork)
			if err == nil {
				t.Fatalf("accepted: %+v", sd.Data)
			}
			if !errors.Is(err, ErrRejected) {
				t.Errorf("error %v does not wrap ErrRejected", err)
			}
			if got := ReasonOf(err); got != tc.want {
				t.Errorf("reason %s, want %s (%v)", got, tc.want, err)
			}
		})
	}
}

func TestRejectReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range RejectReasons() {
		name := r.String()
		if name == "" || strings.HasPrefix(name, "RejectReason(") {
			t.Errorf("reason %d has no name", int(r))
		}
		if seen[name] {
			t.Errorf("name %q used twice", name)
		}
		seen[name] = true
	}
	if len(seen) != 7 {
		t.Errorf("%d reasons, want 7", len(seen))
	}
}

// withBadSignature returns the envelope in data with one bit of its
// signature flipped: the signature is the envelope's last field.
func withBadSignature(data []byte) []byte {
	b := bytes.Clone(data)
	b[len(b)-1] ^= 1
	return b
}

// The signer read off an envelope's bytes is the peer ID of its key: for
// Ed25519 keys without decoding the envelope, for other keys by decoding
// it; an envelope that does not parse, or names its key twice, has none.
func TestEnvelopeSigner(t *testing.T) {
	for range 20 {
		key, id := newKey(t)
		env, err := SignNodeData(sampleNodeData(id, 1), key)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := ed25519Signer(env); !ok || got != id {
			t.Fatalf("Ed25519 signer read off the bytes: %s, %v; want %s", got, ok, id)
		}
		if got, ok := envelopeSigner(env); !ok || got != id {
			t.Fatalf("envelopeSigner: %s, %v; want %s", got, ok, id)
		}
	}
	sk, _, err := crypto.GenerateSecp256k1Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := peer.IDFromPrivateKey(sk)
	env := signRaw(t, &rawPayload{payload: []byte("{}")}, sk)
	if _, ok := ed25519Signer(env); ok {
		t.Fatal("a secp256k1 key read as Ed25519")
	}
	if got, ok := envelopeSigner(env); !ok || got != want {
		t.Fatalf("secp256k1 signer: %s, %v; want %s", got, ok, want)
	}
	key, _ := newKey(t)
	good := signRaw(t, &rawPayload{payload: []byte("{}")}, key)
	for name, b := range map[string][]byte{
		"cut":       good[:len(good)/2],
		"junk":      []byte("not a protobuf at all"),
		"key twice": append(append([]byte{}, good...), good[:38]...),
		"no key":    good[38:],
	} {
		if id, ok := ed25519Signer(b); ok {
			t.Errorf("%s: signer %s read off the bytes, want none", name, id)
		}
	}
}
