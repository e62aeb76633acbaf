package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// TestVerifyStartsAgreeReplicasFirst: a request verified 2/3 starts two
// replicas, on distinct workers, and a third only when those two cannot
// agree: with three honest workers every request runs on exactly two of
// them; with a liar or a failing worker among the first two, the third
// one decides, the answer is the honest digest agreed by the two honest
// workers, and the liar is disputed. Three sha256 workers and a gateway,
// real libp2p hosts in this process; every handler run is counted.
func TestVerifyStartsAgreeReplicasFirst(t *testing.T) {
	verify := config.Verify{Replicas: 3, Agree: 2}
	for _, tc := range []struct {
		name  string
		third workers.Handler // the handler of worker c; nil is honest
	}{
		{"honest", nil},
		{"liar", fixedResult(workers.OK([]byte("wrong")))},
		{"failing", fixedResult(workers.Fail(workers.PermanentError, "broken"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hits := newHitCounter()
			gw := startMember(t, hits, memberSpec{name: "gw"}, nil)
			a := startMember(t, hits, memberSpec{name: "a", handlers: map[string]workers.Handler{"sha256": sha256Handler("a", hits)}}, gw)
			b := startMember(t, hits, memberSpec{name: "b", handlers: map[string]workers.Handler{"sha256": sha256Handler("b", hits)}}, gw)
			third := sha256Handler("c", hits)
			if tc.third != nil {
				third = counting("c", hits, tc.third)
			}
			c := startMember(t, hits, memberSpec{name: "c", handlers: map[string]workers.Handler{"sha256": third}}, gw)
			waitRanked(t, gw, "sha256", 3)
			name := peerName(a, b, c)
			cID := c.node.ID().String()
			cVoted := 0
			// Honest: 30 requests. Otherwise: until c cast a vote in 5
			// requests (the rating and the dispute cordon keep it out of
			// later ones), at most 2,000 or 10s. Until the gateway's
			// ranking rates a and b, the three are unrated and taken in
			// rank order, and the first two agree: c is explored only
			// once the ranking rated the other two, which 200 requests
			// over reused streams can outrun.
			start := time.Now()
			for i := 0; i < 2000 && time.Since(start) < 10*time.Second && (tc.third != nil && cVoted < 5 || tc.third == nil && i < 30); i++ {
				payload := "p" + strconv.Itoa(i)
				before := hits.total()
				res := gw.submit(t, dispatch.WorkRequest{Type: "sha256", Payload: []byte(payload), Verify: verify})
				runs := hits.total() - before
				sum := sha256.Sum256([]byte(payload))
				if res.Status != "ok" || string(res.Output) != hex.EncodeToString(sum[:]) || res.Verify == nil || len(res.Verify.Agreed) != 2 {
					t.Fatalf("request %d: %s, want the sha256 agreed by 2", i, describe(res, name))
				}
				if slices.Contains(res.Verify.Agreed, cID) && tc.third != nil {
					t.Fatalf("request %d: c agreed: %s", i, describe(res, name))
				}
				want := 2
				if tc.third != nil && hasVoteOf(res, cID) {
					want = 3
					cVoted++
				}
				if len(res.Verify.Votes) != want || runs != want {
					t.Fatalf("request %d: %d votes, %d handler runs, want %d of each: %s", i, len(res.Verify.Votes), runs, want, describe(res, name))
				}
			}
			if tc.third != nil && cVoted == 0 {
				t.Fatalf("c never cast a vote in the requests of %s", time.Since(start).Round(time.Millisecond))
			}
			t.Logf("c voted in %d requests", cVoted)
			if d := gw.disp.Selector().Liveness().Disputes(string(c.node.ID())); (tc.name == "liar") != (d > 0) {
				t.Errorf("c has %d disputes", d)
			}
			for _, m := range []*member{a, b} {
				if d := gw.disp.Selector().Liveness().Disputes(string(m.node.ID())); d != 0 {
					t.Errorf("honest worker %s has %d disputes", m.name, d)
				}
			}
		})
	}
}

// hasVoteOf reports whether worker cast a vote in res.
func hasVoteOf(res dispatch.WorkResult, worker string) bool {
	for _, v := range res.Verify.Votes {
		if v.Worker == worker {
			return true
		}
	}
	return false
}

// TestVerifyStartsNoReplicaOnceOneRanOutOfTime: a replica whose worker ran
// the work until its time was up ends as timed out, and no replica is
// started after it in the milliseconds left (as a plain request starts no
// retry then): the first two workers run the work until the deadline, and
// the third, which would answer at once, is never asked.
func TestVerifyStartsNoReplicaOnceOneRanOutOfTime(t *testing.T) {
	hits := newHitCounter()
	// a and b lead (label group primary), so that they take the first two
	// replicas; c, in group fallback, is the one a third replica would go to.
	gw := startMember(t, hits, memberSpec{name: "gw", cfg: groupsConfig(true)}, nil)
	a := startMember(t, hits, memberSpec{name: "a", labels: []string{"primary"}, handlers: map[string]workers.Handler{"sha256": untilDeadline(hits, "a")}}, gw)
	b := startMember(t, hits, memberSpec{name: "b", labels: []string{"primary"}, handlers: map[string]workers.Handler{"sha256": untilDeadline(hits, "b")}}, gw)
	c := startMember(t, hits, memberSpec{name: "c", labels: []string{"fallback"}, handlers: map[string]workers.Handler{"sha256": sha256Handler("c", hits)}}, gw)
	waitRanked(t, gw, "sha256", 3)
	name := peerName(a, b, c)
	for i := range 3 {
		hits.reset()
		res := gw.submit(t, dispatch.WorkRequest{Type: "sha256", Payload: []byte("x"), Timeout: 600 * time.Millisecond,
			Verify: config.Verify{Replicas: 3, Agree: 2}})
		if res.Status != apiv1.StatusTimeout || hits.total() != 2 || hits.get("c") != 0 {
			t.Fatalf("request %d: %s; runs a %d, b %d, c %d: want a timeout after the two replicas that used the deadline, and no third",
				i, describe(res, name), hits.get("a"), hits.get("b"), hits.get("c"))
		}
	}
}

// TestVerifyStartsNoReplicaAfterAFailureThatFollowsATimeout: once a replica
// ran out of time, a replica that fails after it, in the margin left before
// the deadline, starts no other either. Verify 2/3 in 600ms: of the two
// leading workers, the first to get its replica runs the work until its
// time is up (the gateway's margin, about 20ms, before the deadline); the
// other fails 6ms after that. A third replica would go to c, which
// answers at once; it is never asked.
func TestVerifyStartsNoReplicaAfterAFailureThatFollowsATimeout(t *testing.T) {
	hits := newHitCounter()
	// round is one request's: which lead replica arrived first, and when
	// its work was cut.
	type round struct {
		arrived atomic.Int32
		cut     chan struct{}
	}
	var cur atomic.Pointer[round]
	lead := func(name string) workers.Handler {
		return counting(name, hits, workers.HandlerFunc(func(ctx context.Context, _ []byte) workers.Result {
			r := cur.Load()
			if r.arrived.Add(1) == 1 {
				<-ctx.Done()
				close(r.cut)
				return workers.Fail(workers.RetryableError, "%s: killed: its deadline passed", name)
			}
			// The second one's time is up at the same moment: it fails
			// a few milliseconds after, as work that notices its
			// deadline late does, within the margin the gateway left
			// before the request's.
			<-r.cut
			time.Sleep(6 * time.Millisecond) // the first one's answer reaches the gateway first
			return workers.Fail(workers.PermanentError, "%s: broken", name)
		}))
	}
	gw := startMember(t, hits, memberSpec{name: "gw", cfg: groupsConfig(true)}, nil)
	a := startMember(t, hits, memberSpec{name: "a", labels: []string{"primary"}, handlers: map[string]workers.Handler{"sha256": lead("a")}}, gw)
	b := startMember(t, hits, memberSpec{name: "b", labels: []string{"primary"}, handlers: map[string]workers.Handler{"sha256": lead("b")}}, gw)
	c := startMember(t, hits, memberSpec{name: "c", labels: []string{"fallback"}, handlers: map[string]workers.Handler{"sha256": sha256Handler("c", hits)}}, gw)
	waitRanked(t, gw, "sha256", 3)
	name := peerName(a, b, c)
	for i := range 3 {
		hits.reset()
		cur.Store(&round{cut: make(chan struct{})})
		res := gw.submit(t, dispatch.WorkRequest{Type: "sha256", Payload: []byte("x"), Timeout: 600 * time.Millisecond,
			Verify: config.Verify{Replicas: 3, Agree: 2}})
		if res.Status == apiv1.StatusOK || hits.total() != 2 || hits.get("c") != 0 {
			t.Fatalf("request %d: %s; runs a %d, b %d, c %d: want no answer from the two leading replicas, and no third",
				i, describe(res, name), hits.get("a"), hits.get("b"), hits.get("c"))
		}
	}
}

// TestVerifyReplacesAFailedReplicaAtOnce: a replica that fails at once is
// replaced at once, not when the other first replica ends. Verify 2/3 in
// 1s: one of the two leading workers fails at once, the other answers in
// 700ms, and c (the replacement) in 400ms. Started at once, c agrees with
// the slow one at 700ms; started after it, c would answer at 1.1s, past
// the deadline. Each leading worker is the broken one in turn, so that
// whichever replica a worker's rank gives it, the slow one is waited for
// beside the replacement.
func TestVerifyReplacesAFailedReplicaAtOnce(t *testing.T) {
	for _, broken := range []string{"a", "b"} {
		t.Run(broken+" broken", func(t *testing.T) {
			hits := newHitCounter()
			handler := func(name string, d time.Duration) workers.Handler {
				if name == broken {
					return counting(name, hits, fixedResult(workers.Fail(workers.PermanentError, "%s: broken", name)))
				}
				return counting(name, hits, workers.HandlerFunc(func(ctx context.Context, payload []byte) workers.Result {
					t := time.NewTimer(d)
					defer t.Stop()
					select {
					case <-t.C:
					case <-ctx.Done():
						return workers.Fail(workers.RetryableError, "%s: %v", name, ctx.Err())
					}
					sum := sha256.Sum256(payload)
					return workers.OK([]byte(hex.EncodeToString(sum[:])))
				}))
			}
			gw := startMember(t, hits, memberSpec{name: "gw", cfg: groupsConfig(true)}, nil)
			a := startMember(t, hits, memberSpec{name: "a", labels: []string{"primary"}, handlers: map[string]workers.Handler{"sha256": handler("a", 700*time.Millisecond)}}, gw)
			b := startMember(t, hits, memberSpec{name: "b", labels: []string{"primary"}, handlers: map[string]workers.Handler{"sha256": handler("b", 700*time.Millisecond)}}, gw)
			c := startMember(t, hits, memberSpec{name: "c", labels: []string{"fallback"}, handlers: map[string]workers.Handler{"sha256": handler("c", 400*time.Millisecond)}}, gw)
			waitRanked(t, gw, "sha256", 3)
			name := peerName(a, b, c)
			res := gw.submit(t, dispatch.WorkRequest{Type: "sha256", Payload: []byte("x"), Timeout: time.Second,
				Verify: config.Verify{Replicas: 3, Agree: 2}})
			if res.Status != apiv1.StatusOK || res.Verify == nil || len(res.Verify.Agreed) != 2 || hits.total() != 3 {
				t.Fatalf("want ok agreed by the slow worker and c: %s; runs a %d, b %d, c %d", describe(res, name), hits.get("a"), hits.get("b"), hits.get("c"))
			}
		})
	}
}

// TestVerifyWaitsOutABurst: a verified request whose workers are all busy
// waits in the admission queue as a plain request does, and its replicas
// ask the workers that refused them again: three workers each busy for
// their first request, verify 2/3, the answer is agreed by two of them.
func TestVerifyWaitsOutABurst(t *testing.T) {
	hits := newHitCounter()
	busyOnce := func(name string) workers.Handler {
		var n atomic.Int32
		return counting(name, hits, workers.HandlerFunc(func(_ context.Context, p []byte) workers.Result {
			if n.Add(1) == 1 {
				return workers.Fail(workers.Busy, "%s: busy for now", name)
			}
			sum := sha256.Sum256(p)
			return workers.OK([]byte(hex.EncodeToString(sum[:])))
		}))
	}
	gw := startMember(t, hits, memberSpec{name: "gw"}, nil)
	a := startMember(t, hits, memberSpec{name: "a", handlers: map[string]workers.Handler{"sha256": busyOnce("a")}}, gw)
	b := startMember(t, hits, memberSpec{name: "b", handlers: map[string]workers.Handler{"sha256": busyOnce("b")}}, gw)
	c := startMember(t, hits, memberSpec{name: "c", handlers: map[string]workers.Handler{"sha256": busyOnce("c")}}, gw)
	waitRanked(t, gw, "sha256", 3)
	name := peerName(a, b, c)
	res := gw.submit(t, dispatch.WorkRequest{Type: "sha256", Payload: []byte("x"), Timeout: 3 * time.Second,
		Verify: config.Verify{Replicas: 3, Agree: 2}})
	if res.Status != apiv1.StatusOK || res.Verify == nil || len(res.Verify.Agreed) != 2 {
		t.Fatalf("want ok agreed by two workers after waiting: %s", describe(res, name))
	}
}
