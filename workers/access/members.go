package access

import (
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/workers"
)

// NotMemberError is the error message of the Denied result a peer that
// is not a member of this node's closed network gets.
const NotMemberError = "not a member: this network has an authority, and this node takes work only from peers with a valid membership certificate"

// RequireMembers makes a takes work only from the peers isMember
// accepts (the node's rule of a closed network), before any other rule:
// another peer is answered Denied and leaves no state behind. Call it
// before the first request.
func (a *Access) RequireMembers(isMember func(peer.ID) bool) { a.member = isMember }

// memberRefusal returns the result a non-member gets, ok false when p
// may go on to the other rules.
func (a *Access) memberRefusal(p peer.ID) (workers.Result, bool) {
	if a.member == nil || a.member(p) {
		return workers.Result{}, false
	}
	a.notMember.Add(1)
	return workers.Result{Outcome: workers.Denied, Error: NotMemberError}, true
}

// NotMembers counts the requests refused because their peer is not a
// member.
func (a *Access) NotMembers() uint64 { return a.notMember.Load() }
