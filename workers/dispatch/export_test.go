package dispatch

import "github.com/libp2p/go-libp2p/core/peer"

// What the tests outside the package (package dispatch_test, which may
// import the routes built on the dispatcher) use of the inside.

// FakePeer is fakePeer for those tests.
type FakePeer = fakePeer

// ID is the fake peer's ID, set once its record is entered.
func (p *fakePeer) ID() peer.ID { return p.id }

// TestDispatcher is testDispatcher for those tests.
var TestDispatcher = testDispatcher

// NewFakePeer is a fake peer with labels that serves types.
func NewFakePeer(labels []string, types ...string) *FakePeer {
	return &fakePeer{labels: labels, types: types}
}
