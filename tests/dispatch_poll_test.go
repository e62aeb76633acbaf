package tests

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
)

// A worker too loaded to answer its health pings in time is still alive:
// its QUIC connection keeps acknowledging them. Its polls fail, and its
// connection (with any work running on it) stays open: only a silent peer
// has its connection closed.
func TestPoll_SlowAnswerKeepsTheConnection(t *testing.T) {
	hits := newHitCounter()
	var slow atomic.Bool
	var slowPings atomic.Int64
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	// The gateway's poll wait is 200ms here (testDispatchConfig); a
	// loaded worker answers in 600ms.
	check := func(peer.ID) error {
		if slow.Load() {
			slowPings.Add(1)
			select {
			case <-time.After(600 * time.Millisecond): // the loaded worker's answer time
			case <-stop:
			}
		}
		return nil
	}
	gw := startMember(t, hits, memberSpec{name: "gateway"}, nil)
	w := startMember(t, hits, memberSpec{name: "loaded", handlers: map[string]workers.Handler{"sha256": sha256Handler("loaded", hits)},
		opts: []node.Option{node.WithHealthCheck(check)}}, gw)
	waitRanked(t, gw, "sha256", 1)
	conns := gw.node.Host().Network().ConnsToPeer(w.node.ID())
	if len(conns) != 1 {
		t.Fatalf("%d connections from the gateway to the worker, want 1", len(conns))
	}
	conn := conns[0]

	slow.Store(true)
	testkit.WaitFor(t, 10*time.Second, "four slow health pings, the worker no longer alive at the gateway", func() error {
		state := workerState(gw, w.node.ID())
		if n := slowPings.Load(); n < 4 || state == selection.StateAlive {
			return fmt.Errorf("%d slow pings, the worker %v", n, state)
		}
		return nil
	})
	if conn.IsClosed() {
		t.Fatalf("the gateway closed its connection to a worker that was slow to answer, not silent")
	}
	if now := gw.node.Host().Network().ConnsToPeer(w.node.ID()); len(now) != 1 || now[0] != conn {
		t.Fatalf("the gateway's connections to the worker: %v, want the first one only", now)
	}
	t.Logf("%d slow pings, the worker %v, its connection open", slowPings.Load(), workerState(gw, w.node.ID()))
}

// A worker whose path goes silent (every datagram dropped, as from a
// frozen or killed process) has its connection closed at its first failed
// poll, so that work waiting on it ends at once.
func TestPoll_SilentPeerLosesTheConnection(t *testing.T) {
	hits := newHitCounter()
	gw, far, relay := startFar(t, hits, time.Millisecond)
	waitRanked(t, gw, "work", 1)
	throughRelay(t, gw, far, relay)
	conn := gw.node.Host().Network().ConnsToPeer(far.node.ID())[0]

	relay.frozen.Store(true)
	// QUIC alone would hear of it at its idle timeout (seconds more).
	testkit.WaitFor(t, 8*time.Second, "the connection to the silent worker closed", func() error {
		if !conn.IsClosed() {
			return fmt.Errorf("open; the worker %v at the gateway", workerState(gw, far.node.ID()))
		}
		return nil
	})
}

// workerState is how gw's liveness ranks p.
func workerState(gw *member, p peer.ID) selection.State {
	return gw.disp.Selector().Liveness().State(string(p))
}
