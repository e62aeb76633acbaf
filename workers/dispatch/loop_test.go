package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
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

// TestLaunch_DialsAheadWhenAPeerMayNeedADial: a request's first attempt
// on a connected peer, while the host is connected to every peer it knows,
// dials no candidate ahead; its later attempts do, and so does a first
// attempt while a known peer is not connected.
func TestLaunch_DialsAheadWhenAPeerMayNeedADial(t *testing.T) {
	key, _, err := crypto.GenerateEd25519Key(nil)
	workertest.Must(t, err)
	h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings("/ip4/127.0.0.1/udp/0/quic-v1"))
	workertest.Must(t, err)
	t.Cleanup(func() { h.Close() })
	// live is a worker the dispatcher connects to; gone one it never
	// reaches (no host, no address).
	live, gone := &fakePeer{types: []string{"echo"}, key: key}, NewFakePeer(nil, "echo")
	d := testDispatcher(t, config.Defaults(), live, gone)
	workertest.Must(t, d.node.Host().Connect(context.Background(), peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()}))
	// The peer table learns of the connection from the host's events;
	// the next sync counts the known peers not connected: gone alone.
	for deadline := time.Now().Add(5 * time.Second); ; {
		if e, ok := d.node.Peers().Get(live.id); ok && e.Connected {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the peer table does not hold the live worker as connected within 5s")
		}
		select {
		case <-d.node.Peers().Changed():
		case <-time.After(10 * time.Millisecond):
		}
	}
	d.syncPeers()
	if n := d.nUnconnected.Load(); n != 1 {
		t.Fatalf("%d known peers counted as not connected, want 1", n)
	}
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
	first := selection.Pick{Peer: string(live.id)}

	l := newLoop()
	l.launch(&l.inline, first)
	if n := dialing(l); n != 1 {
		t.Fatalf("a first attempt on a connected peer, a known peer not connected: %d dialed ahead, want that one", n)
	}

	// As if every known peer were connected (gone's connection event).
	d.nUnconnected.Store(0)
	l = newLoop()
	l.launch(&l.inline, first)
	if n := dialing(l); n != 0 {
		t.Fatalf("a first attempt on a connected peer, every peer known connected: %d dialed ahead, want none", n)
	}
	l.launch(&l.inline, first) // a retry
	if n := dialing(l); n != 1 {
		t.Fatalf("a retry: %d dialed ahead, want the one not connected", n)
	}
}
