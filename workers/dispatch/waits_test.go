package dispatch

import (
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/config"
)

// The waits for a peer's answer start from its measured round trip: the
// floor for a near peer, rtt-factor round trips plus rtt-margin for a far
// one, never above peer-wait-max; worker-timeout for a peer whose round
// trip is not measured yet.
func TestWaits_FromRoundTrip(t *testing.T) {
	cfg := config.Defaults()
	cfg.Liveness.PollInterval = 2 * time.Second
	p := &fakePeer{types: []string{"echo"}}
	d := testDispatcher(t, cfg, p)
	id := string(p.ID())

	if got := d.acceptWait(id); got != cfg.Worker.WorkerTimeout {
		t.Errorf("accept wait, round trip unknown = %s, want worker-timeout %s", got, cfg.Worker.WorkerTimeout)
	}
	if got := d.pollWait(id); got != cfg.Worker.ConnectTimeout {
		t.Errorf("poll wait, round trip unknown = %s, want connect-timeout %s", got, cfg.Worker.ConnectTimeout)
	}

	// The connection's measured latency is the first contact's round trip.
	d.node.Host().Peerstore().RecordLatency(peer.ID(id), 50*time.Millisecond)
	if got := d.acceptWait(id); got != cfg.Worker.WorkerResponseTimeout {
		t.Errorf("accept wait, 50ms away = %s, want the floor %s (3×50ms+100ms is less)", got, cfg.Worker.WorkerResponseTimeout)
	}

	// A good poll's round trip replaces it.
	now := time.Now()
	d.metrics.poll(id, 400*time.Millisecond, nil, now)
	if got, want := d.acceptWait(id), 1300*time.Millisecond; got != want {
		t.Errorf("accept wait, 400ms away = %s, want 3×400ms+100ms = %s", got, want)
	}
	if got, want := d.pollWait(id), 1300*time.Millisecond; got != want {
		t.Errorf("poll wait, 400ms away = %s, want %s", got, want)
	}
	// A failed poll does not forget the last good round trip.
	d.metrics.poll(id, 0, errors.New("no answer"), now)
	if got, want := d.acceptWait(id), 1300*time.Millisecond; got != want {
		t.Errorf("accept wait after a failed poll = %s, want %s", got, want)
	}
	// peer-wait-max bounds every wait.
	d.metrics.poll(id, 10*time.Second, nil, now)
	if got := d.acceptWait(id); got != cfg.Worker.PeerWaitMax {
		t.Errorf("accept wait, 10s away = %s, want peer-wait-max %s", got, cfg.Worker.PeerWaitMax)
	}
	// A peer that left forgets its round trip.
	d.metrics.retain(map[string]bool{})
	if _, ok := d.metrics.lastRTT(id); ok {
		t.Error("round trip kept for a peer no longer present")
	}
}

// Reading a peer's wait on the request path allocates nothing.
func TestWaits_NoAllocation(t *testing.T) {
	p := &fakePeer{types: []string{"echo"}}
	d := testDispatcher(t, config.Defaults(), p)
	id := string(p.ID())
	d.metrics.poll(id, 3*time.Millisecond, nil, time.Now())
	if n := testing.AllocsPerRun(100, func() { _ = d.acceptWait(id) }); n != 0 {
		t.Errorf("acceptWait allocates %v times", n)
	}
}
