package node

import (
	"errors"
	"fmt"
)

// RejectReason says why a NodeData record from the network was refused.
type RejectReason int

// The reasons a record is refused. Each is counted by the peer table.
const (
	// RejectMalformed: the envelope or the record inside does not decode,
	// has unknown fields, or holds values out of bounds.
	RejectMalformed RejectReason = iota + 1
	// RejectOversized: the encoded envelope is larger than MaxRecordSize.
	RejectOversized
	// RejectForged: the signature is invalid, the signer is not the peer
	// the record (or the DHT key) speaks for, or a peer pushed a record
	// that is not its own.
	RejectForged
	// RejectReplay: the sequence is older than the one already held.
	RejectReplay
	// RejectWrongNetwork: the record belongs to another network.
	RejectWrongNetwork
	// RejectTableFull: the record is of a peer new to the table, the table
	// holds peer-table-cap peers, and the node is not connected to it.
	RejectTableFull
	// RejectNotMember: the network has an authority, and the record's
	// peer is not a member: no certificate, one that does not verify for
	// the authority, the network and the peer, one that expired or one
	// that is revoked.
	RejectNotMember

	numRejectReasons = iota
)

var rejectNames = [...]string{
	RejectMalformed:    "malformed",
	RejectOversized:    "oversized",
	RejectForged:       "forged",
	RejectReplay:       "replay",
	RejectWrongNetwork: "wrong-network",
	RejectTableFull:    "table-full",
	RejectNotMember:    "not_member",
}

// String returns the reason's short name, as used in logs and counters.
func (r RejectReason) String() string {
	if r > 0 && int(r) < len(rejectNames) && rejectNames[r] != "" {
		return rejectNames[r]
	}
	return fmt.Sprintf("RejectReason(%d)", int(r))
}

// RejectReasons lists every reason, in order.
func RejectReasons() []RejectReason {
	out := make([]RejectReason, 0, numRejectReasons)
	for r := RejectMalformed; int(r) < len(rejectNames); r++ {
		out = append(out, r)
	}
	return out
}

// ErrRejected is wrapped by every *RejectError, for callers that only need
// to know a record was refused.
var ErrRejected = errors.New("nodedata rejected")

// RejectError is a refused record with its reason.
type RejectError struct {
	// Reason is why the record was refused.
	Reason RejectReason
	// Err is the detail.
	Err error
}

func reject(r RejectReason, err error) *RejectError { return &RejectError{Reason: r, Err: err} }

// Error implements error.
func (e *RejectError) Error() string {
	return fmt.Sprintf("nodedata rejected (%s): %v", e.Reason, e.Err)
}

// Unwrap lets errors.Is find ErrRejected and the detail.
func (e *RejectError) Unwrap() []error { return []error{ErrRejected, e.Err} }

// ReasonOf returns the reject reason of err, or 0 when err is not a rejection.
func ReasonOf(err error) RejectReason {
	var re *RejectError
	if errors.As(err, &re) {
		return re.Reason
	}
	return 0
}
