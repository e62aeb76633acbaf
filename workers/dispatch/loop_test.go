package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/workers/workertest"
)

// TestDispatch_ARequestStartsFromNothingOfTheOneBefore: the state of a
// request's attempts (reused from request to request) holds nothing of
// the request before it: after a request whose remote attempts failed,
// one that no worker serves has no attempt, and one of the same type
// lists only its own.
func TestDispatch_ARequestStartsFromNothingOfTheOneBefore(t *testing.T) {
	a, b := NewFakePeer(nil, "echo"), NewFakePeer(nil, "echo")
	d := testDispatcher(t, config.Defaults(), a, b)
	req := WorkRequest{Type: "echo", Payload: []byte("x"), Timeout: 5 * time.Second}
	first := d.Dispatch(context.Background(), req)
	if first.Status != apiv1.StatusOK || len(first.Attempts) < 2 {
		t.Fatalf("first request: %s with %d attempts (%+v); want ok after failed remote attempts", first.Status, len(first.Attempts), first.Attempts)
	}
	none := d.Dispatch(context.Background(), WorkRequest{Type: "nothing-serves-this", Payload: []byte("x"), Timeout: 5 * time.Second})
	if none.Status != apiv1.StatusUnavailable || len(none.Attempts) != 0 {
		t.Fatalf("a type nobody serves: %s with attempts %+v; want unavailable with none", none.Status, none.Attempts)
	}
	again := d.Dispatch(context.Background(), req)
	if again.Status != apiv1.StatusOK || len(again.Attempts) > len(first.Attempts) {
		t.Fatalf("the same request again: %s with %d attempts, the first had %d", again.Status, len(again.Attempts), len(first.Attempts))
	}
}

// TestLaunch_DialsAheadOnceTheRequestMeetsAPeerItMustDial: the candidates
// left are dialed ahead from a request's first attempt when its peer is
// not connected, and from its later attempts on; a first attempt on a
// connected peer dials nothing.
func TestLaunch_DialsAheadOnceTheRequestMeetsAPeerItMustDial(t *testing.T) {
	a, b, c := NewFakePeer(nil, "echo"), NewFakePeer(nil, "echo"), NewFakePeer(nil, "echo")
	d := testDispatcher(t, config.Defaults(), a, b, c)
	h := newLoopbackHost(t)
	workertest.Must(t, d.node.Host().Connect(context.Background(), peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()}))
	newLoop := func() *attemptLoop {
		l := &attemptLoop{d: d, ctx: context.Background(), plan: d.sel.Plan(selection.Request{WorkType: "echo"})}
		l.dials.d, l.dials.parent = d, l.ctx
		t.Cleanup(l.dials.close)
		return l
	}
	dialing := func(l *attemptLoop) int {
		l.dials.mu.Lock()
		defer l.dials.mu.Unlock()
		return len(l.dials.calls)
	}
	connected := selection.Pick{Peer: string(h.ID())}

	l := newLoop()
	l.launch(&l.inline, connected)
	if n := dialing(l); n != 0 {
		t.Fatalf("a first attempt on a connected peer dialed %d candidates ahead, want none", n)
	}
	l.launch(&l.inline, connected) // a retry
	if n := dialing(l); n != 3 {
		t.Fatalf("a retry dialed %d candidates ahead, want the 3 left", n)
	}

	l = newLoop()
	l.launch(&l.inline, selection.Pick{Peer: string(a.id)})
	if n := dialing(l); n != 3 {
		t.Fatalf("a first attempt on a peer not connected dialed %d candidates ahead, want the 3 left", n)
	}
}
