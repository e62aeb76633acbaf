package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

func sha256Handler(name string, hits *hitCounter) workers.Handler {
	return counting(name, hits, workers.HandlerFunc(func(_ context.Context, p []byte) workers.Result {
		sum := sha256.Sum256(p)
		return workers.OK([]byte(hex.EncodeToString(sum[:])))
	}))
}

// blackHole takes over the UDP port a stopped member listened on, reading
// and discarding everything, so that dials to it get no answer at all.
func blackHole(t testing.TB, m *member) {
	t.Helper()
	for _, a := range m.node.Host().Addrs() {
		port, err := a.ValueForProtocol(0x0111) // udp
		if err != nil {
			continue
		}
		pc, err := net.ListenPacket("udp", "127.0.0.1:"+port)
		if err != nil {
			t.Fatalf("black hole on %s: %v", port, err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 2048)
			for {
				if _, _, err := pc.ReadFrom(buf); err != nil {
					return
				}
			}
		}()
	}
}

// deadDialsConfig is a gateway's for dials to dead workers: connect-timeout
// connectTimeout, room for four remote attempts, and no polls that would
// find the workers dead before a request dials them.
func deadDialsConfig(connectTimeout time.Duration) func(*config.Config) {
	return func(c *config.Config) {
		c.Worker.ConnectTimeout = connectTimeout
		c.Worker.MaxRemoteWorkers = 4
		c.Worker.MaxRetries = 4
		c.Liveness.PollInterval = time.Minute // polls must not hide the dials
		c.Liveness.PollSuccessThreshold = 0
	}
}

// killBehindBlackHoles stops the members dead, makes their ports black
// holes and waits until gw sees them disconnected.
func killBehindBlackHoles(t *testing.T, gw *member, dead []*member) {
	t.Helper()
	for _, m := range dead {
		m.stop()
		blackHole(t, m)
	}
	waitFor(t, 5*time.Second, "gateway sees the workers disconnected", func() error {
		for _, m := range dead {
			if gw.node.Host().Network().Connectedness(m.node.ID()) == 1 {
				return errNotYet
			}
		}
		return nil
	}, gw.node.Peers())
}

func TestDispatch_LocalFallbackWhenRemoteUnreachable(t *testing.T) {
	const connectTimeout = 400 * time.Millisecond
	hits := newHitCounter()
	gwCfg := deadDialsConfig(connectTimeout)
	gw := startMember(t, hits, memberSpec{name: "gateway", cfg: gwCfg, handlers: map[string]workers.Handler{"sha256": sha256Handler("local", hits)}}, nil)
	var dead []*member
	for _, n := range []string{"d1", "d2", "d3", "d4"} {
		dead = append(dead, startMember(t, hits, memberSpec{name: n, handlers: map[string]workers.Handler{"sha256": sha256Handler(n, hits)}}, gw))
	}
	waitRanked(t, gw, "sha256", 4)
	// Every remote worker dies and its port becomes a black hole; the
	// gateway still holds their records (their TTL has not passed).
	killBehindBlackHoles(t, gw, dead)
	name := peerName(append(dead, gw)...)
	start := time.Now()
	res := gw.submit(t, dispatch.WorkRequest{Type: "sha256", Payload: []byte("hello")})
	took := time.Since(start)
	if res.Status != apiv1.StatusOK || res.Worker != dispatch.LocalWorker {
		t.Fatalf("%s; want ok from the local worker", describe(res, name))
	}
	if !strings.HasPrefix(string(res.Output), "2cf24dba") {
		t.Fatalf("digest %s", res.Output)
	}
	unreachable := 0
	for _, a := range res.Attempts {
		if a.Outcome == workers.Unreachable {
			unreachable++
		}
	}
	if unreachable != 4 {
		t.Fatalf("%d unreachable attempts, want 4: %s", unreachable, describe(res, name))
	}
	// Four dead candidates dialed one after another would cost four connect
	// timeouts; dialed ahead concurrently they cost about one.
	if limit := connectTimeout + connectTimeout/2 + 300*time.Millisecond; took > limit {
		t.Fatalf("fallback took %s with 4 dead candidates, want at most connect-timeout plus a margin (%s)", took, limit)
	}
	t.Logf("4 black-holed candidates, local fallback after %s (connect-timeout %s)", took, connectTimeout)
}

// TestDispatch_DeadCandidatesDialedAheadBehindAConnectedFirstPick: the
// first pick is a connected worker that fails slowly, and the candidates
// after it are dead, their connections closed. They are still dialed
// ahead from the request's start (the dispatcher knows peers it is not
// connected to), so the fallback comes after the slow failure or one
// connect timeout, whichever is longer, not the two in a row.
func TestDispatch_DeadCandidatesDialedAheadBehindAConnectedFirstPick(t *testing.T) {
	// As long as each other: dialed ahead, the fallback comes after about
	// one of them; after the failure, after both.
	const (
		connectTimeout = 500 * time.Millisecond
		slowFailure    = 500 * time.Millisecond
	)
	hits := newHitCounter()
	gwCfg := func(c *config.Config) {
		deadDialsConfig(connectTimeout)(c)
		include := true
		c.LabelBalancing = &config.LabelBalancingConfig{Order: []string{"first"}, IncludeDefault: &include}
	}
	gw := startMember(t, hits, memberSpec{name: "gateway", cfg: gwCfg, handlers: map[string]workers.Handler{"sha256": sha256Handler("local", hits)}}, nil)
	slow := startMember(t, hits, memberSpec{name: "slow", labels: []string{"first"}, handlers: map[string]workers.Handler{"sha256": workers.HandlerFunc(func(ctx context.Context, _ []byte) workers.Result {
		select {
		case <-time.After(slowFailure):
		case <-ctx.Done():
		}
		return workers.Fail(workers.RetryableError, "slow failure")
	})}}, gw)
	var dead []*member
	for _, n := range []string{"d1", "d2", "d3"} {
		dead = append(dead, startMember(t, hits, memberSpec{name: n, handlers: map[string]workers.Handler{"sha256": sha256Handler(n, hits)}}, gw))
	}
	waitRanked(t, gw, "sha256", 4)
	killBehindBlackHoles(t, gw, dead)
	name := peerName(append(dead, slow, gw)...)
	start := time.Now()
	res := gw.submit(t, dispatch.WorkRequest{Type: "sha256", Payload: []byte("hello")})
	took := time.Since(start)
	if res.Status != apiv1.StatusOK || res.Worker != dispatch.LocalWorker {
		t.Fatalf("%s; want ok from the local worker", describe(res, name))
	}
	if len(res.Attempts) == 0 || res.Attempts[0].Peer != slow.node.ID().String() {
		t.Fatalf("the first attempt was not the slow worker's: %s", describe(res, name))
	}
	// In a row they would cost 1s; dialed ahead, about 500ms.
	if limit := connectTimeout + connectTimeout/2; took > limit {
		t.Fatalf("fallback took %s behind a %s failure and 3 dead candidates, want at most %s: %s", took, slowFailure, limit, describe(res, name))
	}
	t.Logf("a %s failure, then 3 black-holed candidates: local fallback after %s (connect-timeout %s)", slowFailure, took, connectTimeout)
}

func TestDispatch_WorkerKilledMidWork(t *testing.T) {
	hits := newHitCounter()
	started := make(chan string, 4)
	slowSHA := func(name string) workers.Handler {
		return counting(name, hits, workers.HandlerFunc(func(ctx context.Context, p []byte) workers.Result {
			started <- name
			select {
			case <-time.After(300 * time.Millisecond):
			case <-ctx.Done():
				return workers.Fail(workers.RetryableError, "cancelled")
			}
			sum := sha256.Sum256(p)
			return workers.OK([]byte(hex.EncodeToString(sum[:])))
		}))
	}
	gwCfg := func(c *config.Config) { c.Worker.MaxRemoteWorkers = 2 }
	gw := startMember(t, hits, memberSpec{name: "gateway", cfg: gwCfg}, nil)
	ws := map[string]*member{
		"w1": startMember(t, hits, memberSpec{name: "w1", handlers: map[string]workers.Handler{"sha256": slowSHA("w1")}}, gw),
		"w2": startMember(t, hits, memberSpec{name: "w2", handlers: map[string]workers.Handler{"sha256": slowSHA("w2")}}, gw),
	}
	waitRanked(t, gw, "sha256", 2)
	name := peerName(ws["w1"], ws["w2"], gw)

	var res dispatch.WorkResult
	var wg sync.WaitGroup
	wg.Go(func() {
		res = gw.submit(t, dispatch.WorkRequest{Type: "sha256", Payload: []byte("hello"), Timeout: 5 * time.Second})
	})
	first := recvWithin(t, started, 5*time.Second)
	ws[first].stop() // killed while working
	wg.Wait()

	if res.Status != apiv1.StatusOK || name(res.Worker) == first {
		t.Fatalf("%s; want ok from the worker that was not killed (%s was)", describe(res, name), first)
	}
	if got := string(res.Output); got != "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" {
		t.Fatalf("digest %q", got)
	}
	if len(res.Attempts) != 2 || name(res.Attempts[0].Peer) != first || res.Attempts[0].Outcome == workers.Success {
		t.Fatalf("attempts: %s; want the killed worker's failed attempt first", describe(res, name))
	}
}

func TestDispatch_GreyWorkerEjected(t *testing.T) {
	const threshold = 3
	const poll = 100 * time.Millisecond
	hits := newHitCounter()
	// The grey worker drops half its pings: fail, fail, succeed, fail,
	// fail, succeed, succeed, succeed, repeated. A counter that resets on
	// success never reaches 3; the decaying one reaches it at the fifth ping.
	pattern := []bool{true, true, false, true, true, false, false, false}
	var mu sync.Mutex
	pings := 0
	var gatewayID peer.ID
	grey := func(from peer.ID) error {
		if from != gatewayID {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		fail := pattern[pings%len(pattern)]
		pings++
		if fail {
			return node.ErrHealthDropped
		}
		return nil
	}
	gw := startMember(t, hits, memberSpec{name: "gateway", cfg: ejectingGateway(poll, threshold, nil)}, nil)
	gatewayID = gw.node.ID()
	good := startMember(t, hits, memberSpec{name: "good", handlers: map[string]workers.Handler{"sha256": sha256Handler("good", hits)}}, gw)
	bad := startMember(t, hits, memberSpec{name: "grey", handlers: map[string]workers.Handler{"sha256": sha256Handler("grey", hits)},
		opts: []node.Option{node.WithHealthCheck(grey)}}, gw)
	waitRanked(t, gw, "sha256", 1)
	name := peerName(good, bad, gw)

	// Five pings at one per poll-interval; allow generously for a loaded
	// machine, but far less than the never of a resetting counter.
	live := gw.disp.Selector().Liveness()
	ejected := make(chan struct{})
	var once sync.Once
	live.OnTransition(func(tr selection.Transition) {
		if tr.Peer == string(bad.node.ID()) && tr.To == selection.StateUnreachable {
			once.Do(func() { close(ejected) })
		}
	})
	start := time.Now()
	if live.State(string(bad.node.ID())) != selection.StateUnreachable {
		select {
		case <-ejected:
		case <-time.After(40 * poll):
			mu.Lock()
			n := pings
			mu.Unlock()
			t.Fatalf("grey worker still %s after %s and %d pings", live.State(string(bad.node.ID())), time.Since(start), n)
		}
	}
	t.Logf("grey worker unreachable after %s", time.Since(start))
	hits.reset()
	for i := range 20 {
		res := gw.submit(t, dispatch.WorkRequest{Type: "sha256", Payload: []byte("x")})
		if res.Status != apiv1.StatusOK {
			t.Fatalf("request %d: %s", i, describe(res, name))
		}
	}
	if n := hits.get("grey"); n != 0 {
		t.Fatalf("the unreachable grey worker still got %d of 20 requests", n)
	}
	if n := hits.get("good"); n != 20 {
		t.Fatalf("good worker served %d of 20", n)
	}
}

// ejectingGateway is a gateway config that polls every poll, marks a peer
// unreachable at threshold failures, and keeps it out for a minute once
// it is (longer than any test), with two remote workers per request; more
// changes what else a test needs.
func ejectingGateway(poll time.Duration, threshold int, more func(*config.Config)) func(*config.Config) {
	return func(c *config.Config) {
		c.Liveness.PollInterval = poll
		c.Liveness.PollFailureThreshold = threshold
		c.Liveness.RedialBackoffMin = time.Minute
		c.Liveness.RedialBackoffMax = time.Minute
		c.Worker.MaxRemoteWorkers = 2
		if more != nil {
			more(c)
		}
	}
}

// errNotYet says a condition waited for does not hold yet.
var errNotYet = errors.New("not yet")

func recvWithin[T any](t *testing.T, ch <-chan T, d time.Duration) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("nothing within %s", d)
	}
	var zero T
	return zero
}
