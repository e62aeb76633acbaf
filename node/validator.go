package node

import (
	"errors"
	"fmt"
	"strings"

	record "github.com/libp2p/go-libp2p-record"
	"github.com/libp2p/go-libp2p/core/peer"
)

// DHTNamespace is the DHT key namespace of NodeData value records.
const DHTNamespace = "workmesh"

// DHTKey returns the DHT key under which id's NodeData is stored:
// /workmesh/<peer id>.
func DHTKey(id peer.ID) string { return "/" + DHTNamespace + "/" + id.String() }

// peerFromDHTKey returns the peer a /workmesh/<peer id> key belongs to.
func peerFromDHTKey(key string) (peer.ID, error) {
	ns, rest, err := record.SplitKey(key)
	if err != nil {
		return "", err
	}
	if ns != DHTNamespace {
		return "", fmt.Errorf("key namespace %q, want %q", ns, DHTNamespace)
	}
	if strings.Contains(rest, "/") {
		return "", fmt.Errorf("key %q: more than one path element", key)
	}
	return peer.Decode(rest)
}

// RecordValidator checks NodeData value records in the DHT exactly as gossip
// does: size first, then signature, signer = the peer named in the key, the
// record's form and network. Select prefers the highest sequence.
type RecordValidator struct {
	// Network is the network records must belong to.
	Network string
	// OnReject, when set, is told of every refused record (for counting).
	OnReject func(reason RejectReason, err error)
}

var _ record.Validator = RecordValidator{}

// Validate implements record.Validator.
func (v RecordValidator) Validate(key string, value []byte) error {
	_, err := v.open(key, value)
	if err != nil && v.OnReject != nil {
		v.OnReject(ReasonOf(err), err)
	}
	return err
}

func (v RecordValidator) open(key string, value []byte) (*SignedNodeData, error) {
	id, err := peerFromDHTKey(key)
	if err != nil {
		return nil, reject(RejectMalformed, fmt.Errorf("dht key: %w", err))
	}
	sd, err := OpenNodeData(value, v.Network)
	if err != nil {
		return nil, err
	}
	if sd.Data.PeerID != id {
		return nil, reject(RejectForged, fmt.Errorf("record of %s stored under the key of %s", sd.Data.PeerID, id))
	}
	return sd, nil
}

// Select implements record.Validator: the valid record with the highest
// sequence wins; on a tie the first one.
func (v RecordValidator) Select(key string, values [][]byte) (int, error) {
	best, bestSeq := -1, uint64(0)
	for i, val := range values {
		sd, err := v.open(key, val)
		if err != nil {
			continue
		}
		if best < 0 || sd.Data.Sequence > bestSeq {
			best, bestSeq = i, sd.Data.Sequence
		}
	}
	if best < 0 {
		return 0, errors.New("select nodedata: no valid record")
	}
	return best, nil
}
