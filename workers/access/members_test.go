package access

import (
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/workers"
)

// TestRequireMembers: with RequireMembers a non-member is answered Denied
// saying it is not a member, counted, and leaves no state; a member goes
// on to the other rules.
func TestRequireMembers(t *testing.T) {
	a := newAccess(t, nil)
	member := peer.ID(testPeerID)
	a.RequireMembers(func(p peer.ID) bool { return p == member })
	res, ok := a.Acquire("stranger")
	if ok || res.Outcome != workers.Denied || res.Error != NotMemberError {
		t.Fatalf("a stranger: ok %v, result %+v; want Denied with %q", ok, res, NotMemberError)
	}
	if a.NotMembers() != 1 || a.Tracked() != 0 {
		t.Errorf("not members %d, tracked %d; want 1 and 0", a.NotMembers(), a.Tracked())
	}
	if _, ok := a.Acquire(member); !ok {
		t.Fatal("a member was refused")
	}
	a.Release(member)
}
