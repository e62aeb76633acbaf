package tests

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// farDelay is each way's delay of the relay in front of the far worker:
// 400ms of round trip, more than the accept wait's floor
// (worker-response-timeout, 250ms) and most of worker-timeout (500ms).
const farDelay = 200 * time.Millisecond

// withDefaults runs a member with every dispatch setting at its default:
// what an operator who sets nothing gets.
func withDefaults(c *config.Config) {
	d := config.Defaults()
	c.Worker, c.Liveness, c.Rating, c.Hedge, c.Selection = d.Worker, d.Liveness, d.Rating, d.Hedge, d.Selection
}

// namedWork answers with its name, after sleeping for the duration its
// payload names (none when empty): it stands for work that runs that long.
func namedWork(name string, hits *hitCounter) workers.Handler {
	return workers.HandlerFunc(func(ctx context.Context, payload []byte) workers.Result {
		hits.add(name)
		if len(payload) > 0 {
			d, err := time.ParseDuration(string(payload))
			if err != nil {
				return workers.Fail(workers.PermanentError, "payload %q: %v", payload, err)
			}
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return workers.Fail(workers.RetryableError, "cancelled: %v", ctx.Err())
			}
		}
		return workers.OK([]byte(name))
	})
}

// udpAddr returns n's QUIC listen address on 127.0.0.1.
func udpAddr(t testing.TB, addrs []ma.Multiaddr) *net.UDPAddr {
	t.Helper()
	for _, a := range addrs {
		ip, err1 := a.ValueForProtocol(ma.P_IP4)
		port, err2 := a.ValueForProtocol(ma.P_UDP)
		if err1 != nil || err2 != nil || ip != "127.0.0.1" {
			continue
		}
		if _, err := a.ValueForProtocol(ma.P_QUIC_V1); err != nil {
			continue
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			t.Fatal(err)
		}
		return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p}
	}
	t.Fatalf("no QUIC address on 127.0.0.1 in %v", addrs)
	return nil
}

// startFar starts a worker reached only through a delaying relay and a
// gateway that knows it only by the relay's address (its bootstrap), with
// every dispatch setting at its default.
func startFar(t *testing.T, hits *hitCounter, delay time.Duration) (gw, far *member, relay *delayRelay) {
	t.Helper()
	far = startMember(t, hits, memberSpec{name: "far", cfg: withDefaults,
		handlers: map[string]workers.Handler{"work": namedWork("far", hits)}}, nil)
	relay = startDelayRelay(t, udpAddr(t, far.node.Host().Addrs()), delay)
	via := fmt.Sprintf("/ip4/127.0.0.1/udp/%d/quic-v1/p2p/%s", relay.Port(), far.node.ID())
	gw = startMember(t, hits, memberSpec{name: "gateway", cfg: func(c *config.Config) {
		withDefaults(c)
		c.Node.Bootstrap = []string{via}
	}}, nil)
	return gw, far, relay
}

// throughRelay fails the test unless every connection of gw to far goes
// through the relay: otherwise the test would measure nothing.
func throughRelay(t *testing.T, gw, far *member, relay *delayRelay) {
	t.Helper()
	conns := gw.node.Host().Network().ConnsToPeer(far.node.ID())
	if len(conns) == 0 {
		t.Fatal("gateway has no connection to the far worker")
	}
	for _, c := range conns {
		port, err := c.RemoteMultiaddr().ValueForProtocol(ma.P_UDP)
		if err != nil || port != strconv.Itoa(relay.Port()) {
			t.Fatalf("gateway reaches the far worker at %s, not through the relay (port %d)", c.RemoteMultiaddr(), relay.Port())
		}
	}
}

// A worker 400ms of round trip away serves with every default: the waits
// for its answers (the accept frame, the health ping) start from the round
// trip the gateway measured, not from a fixed 250ms; and work that runs
// longer than worker-timeout there is bounded by the request's deadline.
func TestDispatch_FarWorkerServesWithDefaults(t *testing.T) {
	hits := newHitCounter()
	gw, far, relay := startFar(t, hits, farDelay)
	waitRanked(t, gw, "work", 1)
	throughRelay(t, gw, far, relay)
	name := peerName(gw, far)

	for i := range 5 {
		res := gw.disp.Dispatch(context.Background(), dispatch.WorkRequest{ID: fmt.Sprintf("far-%d", i), Type: "work"})
		if res.Status != apiv1.StatusOK || name(res.Worker) != "far" {
			t.Fatalf("request %d: want ok by far: %s", i, describe(res, name))
		}
		if res.Duration < 2*farDelay {
			t.Fatalf("request %d took %s, less than the relay's round trip %s: not through the relay", i, res.Duration, 2*farDelay)
		}
	}
	// Work that runs past worker-timeout and past the accept wait: the
	// accept frame (400ms away) keeps the attempt, the request's deadline
	// (10s by default) bounds it.
	res := gw.disp.Dispatch(context.Background(), dispatch.WorkRequest{ID: "far-long", Type: "work", Payload: []byte("1500ms")})
	if res.Status != apiv1.StatusOK || name(res.Worker) != "far" || len(res.Attempts) != 1 {
		t.Fatalf("1.5s of work on the far worker: want ok by far in one attempt: %s", describe(res, name))
	}
	for _, r := range gw.disp.Selector().Ranking("work") {
		if r.State != selection.StateAlive {
			t.Fatalf("far worker is %s after serving: %+v", r.State, r)
		}
	}
	throughRelay(t, gw, far, relay)
}

// With a near worker beside the far one, the rating still prefers the near
// one: the far worker is usable, not favoured. The far worker serves alone
// first, so that the rating has judged it when the near one comes.
func TestDispatch_RatingPrefersNearOverFar(t *testing.T) {
	hits := newHitCounter()
	gw, far, relay := startFar(t, hits, farDelay)
	waitRanked(t, gw, "work", 1)
	name := peerName(gw, far)
	for i := range 5 {
		res := gw.disp.Dispatch(context.Background(), dispatch.WorkRequest{ID: fmt.Sprintf("f-%d", i), Type: "work"})
		if res.Status != apiv1.StatusOK || name(res.Worker) != "far" {
			t.Fatalf("request %d, the far worker alone: %s", i, describe(res, name))
		}
	}
	near := startMember(t, hits, memberSpec{name: "near", cfg: withDefaults,
		handlers: map[string]workers.Handler{"work": namedWork("near", hits)}}, gw)
	waitRanked(t, gw, "work", 2)
	throughRelay(t, gw, far, relay)
	name = peerName(gw, far, near)

	hits.reset()
	const n = 30
	for i := range n {
		res := gw.disp.Dispatch(context.Background(), dispatch.WorkRequest{ID: fmt.Sprintf("r-%d", i), Type: "work"})
		if res.Status != apiv1.StatusOK {
			t.Fatalf("request %d: %s", i, describe(res, name))
		}
	}
	if nr, f := hits.get("near"), hits.get("far"); nr <= 2*f {
		t.Errorf("near served %d, far %d of %d: the rating does not prefer the near worker", nr, f, n)
	}
	// Both are rated now, and once the ranking is refreshed the near one
	// ranks first and takes the next requests.
	testkit.WaitFor(t, 10*time.Second, "both workers rated, near first", func() error {
		r := gw.disp.Selector().Ranking("work")
		if len(r) != 2 || !r[0].Rated || !r[1].Rated || r[0].Peer != string(near.node.ID()) {
			return fmt.Errorf("ranking%s", ranking(r, name))
		}
		return nil
	})
	hits.reset()
	for i := range 10 {
		res := gw.disp.Dispatch(context.Background(), dispatch.WorkRequest{ID: fmt.Sprintf("s-%d", i), Type: "work"})
		if res.Status != apiv1.StatusOK || name(res.Worker) != "near" {
			t.Fatalf("request %d after rating: want ok by near: %s", i, describe(res, name))
		}
	}
}

// ranking shows a ranking with member names.
func ranking(r []selection.Ranked, name func(string) string) string {
	s := ""
	for _, x := range r {
		s += fmt.Sprintf(" [%s score %.3f rated %t %s]", name(peer.ID(x.Peer).String()), x.Score, x.Rated, x.State)
	}
	return s
}

// A worker so far away (1.2s of round trip) that the health ping's floor
// (connect-timeout, 1s) would time out its first poll still becomes alive
// and serves with every default: the first contact's waits start from the
// round trip the QUIC connection itself measured.
func TestDispatch_VeryFarWorkerFirstContact(t *testing.T) {
	const delay = 600 * time.Millisecond
	hits := newHitCounter()
	gw, far, relay := startFar(t, hits, delay)
	testkit.WaitFor(t, 30*time.Second, "gateway ranks the very far worker alive", func() error {
		r := gw.disp.Selector().Ranking("work")
		if len(r) != 1 || r[0].State != selection.StateAlive {
			return fmt.Errorf("ranking%s", ranking(r, peerName(gw, far)))
		}
		return nil
	}, gw.node.Peers().Changed)
	throughRelay(t, gw, far, relay)
	name := peerName(gw, far)
	res := gw.disp.Dispatch(context.Background(), dispatch.WorkRequest{ID: "very-far", Type: "work"})
	if res.Status != apiv1.StatusOK || name(res.Worker) != "far" || res.Duration < 2*delay {
		t.Fatalf("want ok by far, through the relay: %s", describe(res, name))
	}
}

// idempotentWork declares its work safe to run on several workers at once,
// so that a gateway serving it hedges it.
type idempotentWork struct{ workers.Handler }

func (idempotentWork) Traits() workers.Traits { return workers.Traits{Idempotent: workers.Always} }

// A hedged request's attempt on a far worker runs out of its time first:
// the far worker's budget keeps back its round trip (820ms here) for the
// way back, the near worker's only a few milliseconds. The near attempt
// still has time and answers within it, so the request ends with the near
// worker's result, not as timed out when the far attempt gave up.
func TestDispatch_OutOfTimeFarAttemptDoesNotCutOffANearHedge(t *testing.T) {
	hits := newHitCounter()
	far := startMember(t, hits, memberSpec{name: "far", cfg: withDefaults,
		handlers: map[string]workers.Handler{"work": namedWork("far", hits)}}, nil)
	relay := startDelayRelay(t, udpAddr(t, far.node.Host().Addrs()), farDelay)
	via := fmt.Sprintf("/ip4/127.0.0.1/udp/%d/quic-v1/p2p/%s", relay.Port(), far.node.ID())
	gw := startMember(t, hits, memberSpec{name: "gateway", cfg: func(c *config.Config) {
		withDefaults(c)
		c.Node.Bootstrap = []string{via}
		c.Hedge.MaxCount, c.Hedge.Delay = 1, 50*time.Millisecond
	}, handlers: map[string]workers.Handler{"work": idempotentWork{namedWork("local", hits)}}}, nil)
	near := startMember(t, hits, memberSpec{name: "near", cfg: withDefaults,
		handlers: map[string]workers.Handler{"work": namedWork("near", hits)}}, gw)
	waitRanked(t, gw, "work", 2)
	throughRelay(t, gw, far, relay)
	name := peerName(gw, far, near)
	// Far's budget ends about 4.2s in, and its answer saying so reaches
	// the gateway about 4.4s in; near answers at 4.7s, its budget ending
	// at 4.98s.
	hits.reset()
	res := gw.disp.Dispatch(context.Background(), dispatch.WorkRequest{ID: "hedged", Type: "work", Payload: []byte("4700ms"), Timeout: 5 * time.Second})
	if res.Status != apiv1.StatusOK || name(res.Worker) != "near" || hits.get("far") != 1 || hits.get("near") != 1 || hits.get("local") != 0 {
		t.Fatalf("want ok by near, both workers tried once and no local run: %s; runs: far %d, near %d, local %d",
			describe(res, name), hits.get("far"), hits.get("near"), hits.get("local"))
	}
}
