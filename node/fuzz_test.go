package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"
)

// fixedKey returns an Ed25519 key derived from seed, so that the fuzz seed
// corpus is the same on every run.
func fixedKey(t testing.TB, seed byte) (crypto.PrivKey, peer.ID) {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(bytes.NewReader(bytes.Repeat([]byte{seed}, 64)))
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return key, id
}

// FuzzOpenNodeData feeds the NodeData verifier arbitrary envelopes. It must
// never panic, every refusal must be a *RejectError with a known reason,
// and it must never accept a record that its own peer did not sign, that
// belongs to another network, or that is larger than MaxRecordSize.
func FuzzOpenNodeData(f *testing.F) {
	keyA, idA := fixedKey(f, 1)
	keyB, _ := fixedKey(f, 2)
	good := sampleNodeData(idA, 3)
	signed, err := SignNodeData(good, keyA)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(signed)
	f.Add(signRaw(f, &nodeDataRecord{good}, keyB)) // A's record signed by B
	other := good
	other.Network = "elsewhere"
	f.Add(signRaw(f, &nodeDataRecord{other}, keyA))
	payload, _ := json.Marshal(good)
	f.Add(signRaw(f, &rawPayload{append(payload[:len(payload)-1:len(payload)-1], []byte(`,"admin":true}`)...)}, keyA))
	f.Add(signRaw(f, &rawPayload{append(slices.Clone(payload), []byte(" {}")...)}, keyA))
	f.Add(signRaw(f, &otherCodec{rawPayload{payload}}, keyA))
	tampered := slices.Clone(signed)
	tampered[len(tampered)-1] ^= 1
	f.Add(tampered)
	f.Add([]byte{})
	f.Add([]byte("not an envelope"))

	f.Fuzz(func(t *testing.T, data []byte) {
		sd, err := OpenNodeData(data, testNetwork)
		if err != nil {
			if sd != nil {
				t.Fatalf("a refusal returned a record: %v", err)
			}
			if !errors.Is(err, ErrRejected) || !slices.Contains(RejectReasons(), ReasonOf(err)) {
				t.Fatalf("refusal %v is not a rejection with a known reason", err)
			}
			return
		}
		if len(data) > MaxRecordSize {
			t.Fatalf("accepted %d bytes, more than %d", len(data), MaxRecordSize)
		}
		if sd.Data.Network != testNetwork || !bytes.Equal(sd.Envelope, data) {
			t.Fatalf("accepted a record of network %q, or changed its envelope", sd.Data.Network)
		}
		// Check the signature independently of OpenNodeData: the envelope
		// must verify in the NodeData domain, and its signer must be the
		// peer the record speaks for.
		env, _, err := record.ConsumeEnvelope(data, RecordDomain)
		if err != nil {
			t.Fatalf("accepted an envelope that does not verify: %v", err)
		}
		signer, err := peer.IDFromPublicKey(env.PublicKey)
		if err != nil || signer != sd.Data.PeerID {
			t.Fatalf("accepted a record for %s signed by %s (%v)", sd.Data.PeerID, signer, err)
		}
		if !bytes.Equal(env.PayloadType, RecordCodec) {
			t.Fatalf("accepted payload type %q", env.PayloadType)
		}
		var again NodeData
		if err := decodeStrict(env.RawPayload, &again); err != nil || !reflect.DeepEqual(again, sd.Data) {
			t.Fatalf("the accepted record does not decode to what was returned: %v", err)
		}
	})
}
