package tests

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// groupsConfig sets label balancing primary > fallback with a budget large
// enough that only the rules stop a sweep.
func groupsConfig(passOnError bool) func(*config.Config) {
	return func(c *config.Config) {
		include := true
		c.LabelBalancing = &config.LabelBalancingConfig{Order: []string{"primary", "fallback"}, PassOnError: passOnError, IncludeDefault: &include}
		c.Worker.MaxRetries = 5
		c.Worker.MaxRemoteWorkers = 5
	}
}

func withHedge(delay time.Duration, f func(*config.Config)) func(*config.Config) {
	return func(c *config.Config) {
		f(c)
		c.Hedge.MaxCount = 1
		c.Hedge.Delay = delay
	}
}

// blockMesh starts a gateway that serves "block" itself (so any local
// fallback is counted) and four workers: two primaries, two fallbacks.
func blockMesh(t *testing.T, cfg func(*config.Config), primaryEmptyAtHead bool) (*member, []*member, *hitCounter) {
	hits := newHitCounter()
	spec := func(name, label string, emptyAlways bool) memberSpec {
		return memberSpec{name: name, labels: []string{label}, handlers: map[string]workers.Handler{
			"block": headHandler{name: name, head: 100, emptyAlways: emptyAlways, hits: hits},
		}}
	}
	gwSpec := memberSpec{name: "gateway", cfg: cfg, handlers: map[string]workers.Handler{
		"block": headHandler{name: "local", head: 100, hits: hits},
	}}
	gw := startMember(t, hits, gwSpec, nil)
	ms := []*member{
		startMember(t, hits, spec("p1", "primary", primaryEmptyAtHead), gw),
		startMember(t, hits, spec("p2", "primary", primaryEmptyAtHead), gw),
		startMember(t, hits, spec("f1", "fallback", false), gw),
		startMember(t, hits, spec("f2", "fallback", false), gw),
	}
	waitRanked(t, gw, "block", 4)
	return gw, ms, hits
}

func TestFailover_EmptyBeyondHeadDoesNotSweepToFallbacks(t *testing.T) {
	gw, ms, hits := blockMesh(t, withHedge(time.Millisecond, groupsConfig(false)), false)
	name := peerName(append(ms, gw)...)
	const requests = 20
	for i := range requests {
		before := hits.total()
		res := gw.submit(t, dispatch.WorkRequest{Type: "block", Payload: []byte("101"), MinHead: u64(101)})
		if res.Status != apiv1.StatusEmpty {
			t.Fatalf("request %d: %s; want empty (block 101 is above every head)", i, describe(res, name))
		}
		if n := hits.total() - before; n > 1 {
			t.Fatalf("request %d: %d hits, want at most 1: %s", i, n, describe(res, name))
		}
	}
	if n := hits.get("f1") + hits.get("f2"); n != 0 {
		t.Fatalf("fallback group hit %d times for blocks above every head, want 0", n)
	}
	if n := hits.get("local"); n != 0 {
		t.Fatalf("local worker hit %d times for blocks above every head, want 0", n)
	}
	if n := hits.get("p1") + hits.get("p2"); n != requests {
		t.Fatalf("primaries hit %d times for %d requests, want exactly one each", n, requests)
	}
}

func TestFailover_EmptyAtHeadStillEscapesToFallbacks(t *testing.T) {
	gw, ms, hits := blockMesh(t, groupsConfig(false), true)
	name := peerName(append(ms, gw)...)
	res := gw.submit(t, dispatch.WorkRequest{Type: "block", Payload: []byte("100"), MinHead: u64(100)})
	if res.Status != apiv1.StatusOK || (string(res.Output) != "f1" && string(res.Output) != "f2") {
		t.Fatalf("block 100, primaries empty: %s; want ok from a fallback", describe(res, name))
	}
	if hits.get("p1") != 1 || hits.get("p2") != 1 {
		t.Fatalf("primary hits p1 %d p2 %d, want one each before escaping", hits.get("p1"), hits.get("p2"))
	}
	if len(res.Attempts) != 3 || res.Attempts[0].Outcome != workers.Empty || res.Attempts[2].Group != "fallback" {
		t.Fatalf("attempts: %s", describe(res, name))
	}
	if hits.get("local") != 0 {
		t.Fatal("the local worker ran although a fallback had the block")
	}
}

func TestDispatch_LabelGroupsFallThroughViaRetries(t *testing.T) {
	hits := newHitCounter()
	failing := func(name string) workers.Handler {
		return counting(name, hits, fixedResult(workers.Fail(workers.RetryableError, "%s is overloaded", name)))
	}
	ok := func(name string) workers.Handler { return counting(name, hits, fixedResult(workers.OK([]byte(name)))) }
	gw := startMember(t, hits, memberSpec{name: "gateway", cfg: groupsConfig(false)}, nil)
	ms := []*member{
		startMember(t, hits, memberSpec{name: "p1", labels: []string{"primary"}, handlers: map[string]workers.Handler{"job": failing("p1")}}, gw),
		startMember(t, hits, memberSpec{name: "p2", labels: []string{"primary"}, handlers: map[string]workers.Handler{"job": failing("p2")}}, gw),
		startMember(t, hits, memberSpec{name: "f1", labels: []string{"fallback"}, handlers: map[string]workers.Handler{"job": ok("f1")}}, gw),
	}
	waitRanked(t, gw, "job", 3)
	name := peerName(append(ms, gw)...)
	res := gw.submit(t, dispatch.WorkRequest{Type: "job", Payload: []byte("x")})
	if res.Status != apiv1.StatusOK || string(res.Output) != "f1" {
		t.Fatalf("%s; want ok from f1 after both primaries failed", describe(res, name))
	}
	var got []string
	for _, a := range res.Attempts {
		got = append(got, name(a.Peer)+"/"+a.Group+"/"+a.Outcome.String())
	}
	if len(got) != 3 || got[2] != "f1/fallback/success" || hits.get("p1") != 1 || hits.get("p2") != 1 {
		t.Fatalf("attempts %v, want both primaries (retryable-error) then f1 in the fallback group", got)
	}
}

func TestDispatch_PassOnErrorWithHedging(t *testing.T) {
	hits := newHitCounter()
	slowOK := func(name string) workers.Handler {
		return counting(name, hits, workers.HandlerFunc(func(ctx context.Context, _ []byte) workers.Result {
			select {
			case <-time.After(150 * time.Millisecond):
				return workers.OK([]byte(name))
			case <-ctx.Done():
				return workers.Fail(workers.RetryableError, "cancelled")
			}
		}))
	}
	gw := startMember(t, hits, memberSpec{name: "gateway", cfg: withHedge(20*time.Millisecond, groupsConfig(true))}, nil)
	ms := []*member{
		startMember(t, hits, memberSpec{name: "p1", labels: []string{"primary"}, handlers: map[string]workers.Handler{"echo": slowOK("p1")}}, gw),
		startMember(t, hits, memberSpec{name: "p2", labels: []string{"primary"}, handlers: map[string]workers.Handler{"echo": slowOK("p2")}}, gw),
		startMember(t, hits, memberSpec{name: "f1", labels: []string{"fallback"}, handlers: map[string]workers.Handler{"echo": slowOK("f1")}}, gw),
	}
	waitRanked(t, gw, "echo", 3)
	name := peerName(append(ms, gw)...)
	for i := range 5 {
		res := gw.submit(t, dispatch.WorkRequest{Type: "echo", Payload: []byte("x")})
		if res.Status != apiv1.StatusOK {
			t.Fatalf("request %d: %s", i, describe(res, name))
		}
		for _, a := range res.Attempts {
			if a.Group != "primary" {
				t.Fatalf("request %d: a hedge is not an error and must stay in the primary group: %s", i, describe(res, name))
			}
		}
		if !hasHedge(res) {
			t.Fatalf("request %d: no hedge was sent within 150ms work and a 20ms hedge delay: %s", i, describe(res, name))
		}
	}
	if n := hits.get("f1"); n != 0 {
		t.Fatalf("the fallback group was hit %d times with no error in the primary group", n)
	}
}

func hasHedge(res dispatch.WorkResult) bool {
	for _, a := range res.Attempts {
		if a.Hedge {
			return true
		}
	}
	return false
}

// A worker that runs the work until its time runs out (and then says
// retryable, as a killed command or a cancelled sleep does) has used the
// request's deadline: the request ends as timed out, and no other worker,
// nor the local one, is started on it with the few milliseconds the way
// back left, where work with side effects would run a second time.
func TestDispatch_WorkThatRanOutOfTimeEndsTheRequestAsTimedOut(t *testing.T) {
	hits := newHitCounter()
	gw := startMember(t, hits, memberSpec{name: "gateway", handlers: map[string]workers.Handler{"job": untilDeadline(hits, "local")}}, nil)
	ms := []*member{
		startMember(t, hits, memberSpec{name: "w1", handlers: map[string]workers.Handler{"job": untilDeadline(hits, "w1")}}, gw),
		startMember(t, hits, memberSpec{name: "w2", handlers: map[string]workers.Handler{"job": untilDeadline(hits, "w2")}}, gw),
	}
	waitRanked(t, gw, "job", 2)
	name := peerName(append(ms, gw)...)
	for i := range 3 {
		hits.reset()
		res := gw.submit(t, dispatch.WorkRequest{Type: "job", Payload: []byte("x"), Timeout: 600 * time.Millisecond})
		if res.Status != apiv1.StatusTimeout || len(res.Attempts) != 1 || hits.total() != 1 {
			t.Fatalf("request %d: %s; runs %d; want a timeout after the one attempt that used the deadline, and no other run", i, describe(res, name), hits.total())
		}
		if want := "no result within 600ms"; res.Error != want {
			t.Fatalf("request %d: error %q, want %q", i, res.Error, want)
		}
	}
}

// A request that waits in the admission queue (every worker it could go to
// was busy) is placed again, each round with a fresh plan: a worker that
// did not refuse it in an earlier round (it ran the work, or may have: a
// write whose answer was lost) is not given it again, and the retries the
// earlier rounds spent stay spent. Here a fails the write after running
// it, b is busy for its first three requests: the request waits for b and
// ends with b's answer, a having run it once.
func TestDispatch_AdmissionRoundsDoNotRunWorkAgainOnAWorkerThatRanIt(t *testing.T) {
	hits := newHitCounter()
	oneRetry := func(c *config.Config) { c.Worker.MaxRetries = 1 }
	var bRuns atomic.Int32
	busyThenOK := workers.HandlerFunc(func(context.Context, []byte) workers.Result {
		if bRuns.Add(1) <= 3 {
			return workers.Fail(workers.Busy, "b: busy")
		}
		return workers.OK([]byte("b"))
	})
	gw := startMember(t, hits, memberSpec{name: "gw", cfg: oneRetry}, nil)
	a := startMember(t, hits, memberSpec{name: "a", handlers: map[string]workers.Handler{
		"write": counting("a", hits, fixedResult(workers.Fail(workers.RetryableError, "a: upstream 502 after the write")))}}, gw)
	b := startMember(t, hits, memberSpec{name: "b", handlers: map[string]workers.Handler{"write": counting("b", hits, busyThenOK)}}, gw)
	waitRanked(t, gw, "write", 2)
	name := peerName(a, b)
	hits.reset()
	res := gw.submit(t, dispatch.WorkRequest{Type: "write", Payload: []byte("POST /charge"), Timeout: 5 * time.Second})
	if res.Status != apiv1.StatusOK || name(res.Worker) != "b" || hits.get("a") != 1 || hits.get("b") != 4 || res.BusyRefusals == 0 {
		t.Fatalf("want ok by b after waiting, a run once and b four times: %s; runs a %d, b %d; busy refusals %d",
			describe(res, name), hits.get("a"), hits.get("b"), res.BusyRefusals)
	}
	// The busy answers of the earlier rounds, which the result's attempts
	// leave out, count in workmesh_attempts_total all the same.
	busy := float64(res.BusyRefusals)
	for _, at := range res.Attempts {
		if at.Outcome == workers.Busy {
			busy++
		}
	}
	mfs := testkit.Gather(t, gw.disp.Collector())
	if got, _ := testkit.MetricValue(mfs, "workmesh_attempts_total", map[string]string{"outcome": "busy", "peer": b.node.ID().String()}); got != busy {
		t.Errorf("workmesh_attempts_total{outcome=busy} of b = %v, want %v (%d busy refusals of earlier rounds)", got, busy, res.BusyRefusals)
	}
}
