package node

import (
	"testing"
)

func TestRecordValidatorValidate(t *testing.T) {
	key, id := newKey(t)
	_, other := newKey(t)
	good, err := SignNodeData(sampleNodeData(id, 3), key)
	if err != nil {
		t.Fatal(err)
	}
	var rejected []RejectReason
	v := RecordValidator{Network: testNetwork, OnReject: func(r RejectReason, _ error) { rejected = append(rejected, r) }}

	if err := v.Validate(DHTKey(id), good); err != nil {
		t.Fatalf("good record under its own key: %v", err)
	}
	cases := []struct {
		name  string
		key   string
		value []byte
		want  RejectReason
	}{
		// Someone stores A's genuine record under B's key, hoping B's
		// lookups return A: the key names the peer, so it is forged.
		{"record under another peer's key", DHTKey(other), good, RejectForged},
		{"wrong namespace", "/pk/" + id.String(), good, RejectMalformed},
		{"key is not a peer ID", "/workmesh/not-a-peer", good, RejectMalformed},
		{"key with a sub-path", DHTKey(id) + "/x", good, RejectMalformed},
		{"garbage value", DHTKey(id), []byte("garbage"), RejectMalformed},
		{"oversized value", DHTKey(id), make([]byte, MaxRecordSize+1), RejectOversized},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rejected = nil
			err := v.Validate(tc.key, tc.value)
			if err == nil {
				t.Fatal("accepted")
			}
			if got := ReasonOf(err); got != tc.want {
				t.Errorf("reason %s, want %s (%v)", got, tc.want, err)
			}
			if len(rejected) != 1 || rejected[0] != tc.want {
				t.Errorf("OnReject saw %v, want [%s]", rejected, tc.want)
			}
		})
	}
}

func TestRecordValidatorSelectsHighestSequence(t *testing.T) {
	key, id := newKey(t)
	otherKey, other := newKey(t)
	sign := func(seq uint64) []byte {
		b, err := SignNodeData(sampleNodeData(id, seq), key)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	foreign, err := SignNodeData(sampleNodeData(other, 99), otherKey)
	if err != nil {
		t.Fatal(err)
	}
	v := RecordValidator{Network: testNetwork}
	// The foreign record has the highest sequence but belongs to another
	// key; the garbage entry is skipped.
	vals := [][]byte{sign(5), []byte("garbage"), sign(9), foreign, sign(7)}
	i, err := v.Select(DHTKey(id), vals)
	if err != nil {
		t.Fatal(err)
	}
	if i != 2 {
		t.Errorf("selected %d, want 2 (sequence 9)", i)
	}
	if _, err := v.Select(DHTKey(id), [][]byte{[]byte("garbage"), foreign}); err == nil {
		t.Error("selected among no valid records")
	}
}
