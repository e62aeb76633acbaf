package tests

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// TestDrill is the resilience drill of issue 5: six `workmesh node start`
// processes on loopback, 1,000 sha256 requests from 32 concurrent clients
// through the API of one of them (the gateway), two workers killed with
// SIGKILL during the run, one failing half its work on purpose and one
// slowed down on purpose. It checks that nothing is lost, duplicated, wrong
// or late, that the dead workers are ejected and stop getting work, and
// that rating keeps the sick ones to a small share; it prints the figures.
//
// It runs in make test (about 20 seconds; go test -short skips it), and
// alone, verbose, with make drill. WMTEST_DRILL_SEED=n repeats a run's
// payloads and kill moments.
func TestDrill(t *testing.T) {
	if testing.Short() {
		t.Skip("the resilience drill takes about 20 seconds; it runs without -short (make drill)")
	}
	began := time.Now()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("WMTEST_DRILL_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("WMTEST_DRILL_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (WMTEST_DRILL_SEED=%d repeats the payloads and kill moments)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))

	const (
		requests    = 1000
		warmups     = 160
		concurrency = 32
		// 32 clients, each sending a request every 256ms (125 a second in
		// all), so that the run lasts eight seconds or more: sending as
		// fast as they can, they get through 1,000 requests in one to two
		// seconds here, and a kill, its ejection (about 0.3s) and the
		// failover after it would fill most of the run, leaving no settled
		// part in which to judge rating. Around a kill, when attempts wait
		// on the dead worker, all 32 can be in flight. A client held up
		// does not catch up afterwards (see drillLoad): a backlog sent at
		// once would be a test of bursts, not of these faults.
		rate = 125.0 // requests a second
		// Payloads of 16 KiB of distinct random text: more than one QUIC
		// packet, as real work is, and more than a connection to a dead
		// peer lets through: a few dozen bytes hid that writing a request
		// to a killed worker blocked until the request's deadline.
		payloadSize = 16 << 10
		timeout     = 5 * time.Second
		// The client gives up on a call this long after the request's own
		// timeout: only so that a hung API fails the test instead of
		// hanging it; no call is expected to come near it.
		clientSlack = 5 * time.Second
		// A request may end this long after its timeout: the API answers
		// after the dispatcher gives up, the client reads the answer, and
		// the machine is loaded. Measured: at most 40ms over.
		deadlineGap = time.Second
		// A poll every 100ms: the grey worker fails half its pings, and at
		// 1:1 the decaying counter is a random walk that reaches pollFails
		// (3) within the ~85 polls of the run with probability 99.98%
		// (within 40 polls, at 200ms, only 98%: one run in four of the
		// first ones never showed it unreachable).
		pollEvery = 100 * time.Millisecond
		pollFails = 3
		// A SIGKILLed worker must be seen unreachable by the gateway this
		// long after the kill. Polls alone eject it after pollFails failed
		// polls: each is due pollEvery after the last one ended and times
		// out after min(connect-timeout, poll-interval) = 100ms, so about
		// 3 x 200ms, plus the dispatcher's 50ms tick and the monitor's
		// 50ms (measured 1.2 to 1.3s for a victim no work went to, with
		// polls every 200ms).
		// Attempts that find it unreachable count too and make it faster
		// (measured 0.25 to 0.35s for the busy victim). 2s leaves room for
		// a loaded machine.
		ejectBound = 2 * time.Second
		// The monitor reads the gateway's liveness view this often.
		monitorEvery = 50 * time.Millisecond
		// See the check of requests that did not succeed.
		maxLostPerKill = 2
		// The grey and the slow worker's successes, at most, against the
		// healthy survivor's once the failovers have settled (see the
		// assertion).
		greyShare = 0.15
		slowShare = 0.15
	)
	bin := buildBinary(t)
	t.Logf("binary built in %s", time.Since(began).Round(time.Millisecond))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * concurrency}}
	defer client.CloseIdleConnections()

	// The gateway serves sha256 too, as the last resort: it runs a request
	// on its own worker when every remote attempt failed. Up to 3 remote
	// workers and 2 retries per request; a poll every 100ms, 3 failures
	// make a peer unreachable; rating mode (the default) orders the rest.
	// --worker-timeout does not bound an attempt of a request whose own
	// timeout is longer (the attempt gets the request's), so it plays no
	// part here; the slow worker is left to rating.
	gw, err := drillStart(t, bin, "gateway", "--work-types", "sha256",
		"--max-remote-workers", "3", "--max-retries", "2",
		"--poll-interval", pollEvery.String(), "--poll-failure-threshold", strconv.Itoa(pollFails),
		"--connect-timeout", "300ms", "--worker-timeout", "500ms", "--selection-mode", "rating")
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*drillNode{}
	startWorkers := func(extra map[string][]string) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make(chan error, len(extra))
		for name, args := range extra {
			wg.Go(func() {
				p, err := drillStart(t, bin, name, append([]string{"--work-types", "sha256", "--bootstrap", gw.join}, args...)...)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				nodes[name] = p
				mu.Unlock()
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// Each worker is up once the gateway has shown it alive, not all
		// of them at one instant: the grey worker fails half its health
		// pings from the start and may be out again by the next look
		// (needing poll-success-threshold good pings in a row to return,
		// at a redial backoff that grows).
		aliveOnce := map[string]bool{}
		if _, err := testkit.Poll(15*time.Second, func() error {
			sel, err := drillSelection(client, gw.api)
			if err != nil {
				return err
			}
			var waiting []string
			for name := range extra {
				if p, seen := sel[nodes[name].peerID]; seen && p.State == "alive" {
					aliveOnce[name] = true
				}
				if !aliveOnce[name] {
					waiting = append(waiting, name)
				}
			}
			if len(waiting) > 0 {
				return fmt.Errorf("not yet shown alive: %v; %+v", waiting, sel)
			}
			return nil
		}); err != nil {
			t.Fatalf("the gateway does not show every worker alive within 15s: %v\nstderr:\n%s", err, gw.stderr)
		}
	}
	t0 := time.Now()
	startWorkers(map[string][]string{"h1": nil, "h2": nil, "h3": nil, "grey": {"--fault-error-rate", "0.5"}})
	t.Logf("gateway and 4 workers up in %s", time.Since(t0).Round(time.Millisecond))

	payloads := func(tag string, n int) []string {
		out := make([]string, n)
		raw := make([]byte, payloadSize/2)
		for i := range out {
			for j := 0; j < len(raw); j += 8 {
				v := rng.Uint64()
				for k := 0; k < 8 && j+k < len(raw); k++ {
					raw[j+k] = byte(v >> (8 * k))
				}
			}
			out[i] = fmt.Sprintf("%s-%d-", tag, i) + hex.EncodeToString(raw)
		}
		return out
	}

	// The warm-up measures the median work time under this very load, so
	// that the slow worker's delay is ten times what a request costs here:
	// the median duration of a successful remote attempt as the gateway
	// timed it (sending, the work, the answer). It also rates the workers.
	t0 = time.Now()
	warm := drillLoad(client, gw.api, payloads("warm", warmups), concurrency, rate, timeout, clientSlack, nil)
	var rtts []time.Duration
	for _, c := range warm {
		if c.err != nil || c.answer.Status != "ok" {
			t.Fatalf("warm-up request ended %q (%v) before any fault but the grey worker: %+v", c.answer.Status, c.err, c.answer)
		}
		for _, a := range c.answer.Attempts {
			if a.Outcome == "success" && a.Peer != "local" {
				rtts = append(rtts, time.Duration(a.DurationMS*float64(time.Millisecond)))
			}
		}
	}
	med := percentile(rtts, 50)
	delay := (10 * med).Round(time.Millisecond)
	t.Logf("warm-up: %d requests in %s, median remote attempt %s (%d samples): the slow worker gets --fault-delay %s",
		warmups, time.Since(t0).Round(time.Millisecond), med.Round(10*time.Microsecond), len(rtts), delay)
	startWorkers(map[string][]string{"slow": {"--fault-delay", delay.String()}})

	names := map[string]string{"local": "local"}
	for n, p := range nodes {
		names[p.peerID] = n
	}
	// How the warm-up went for each worker, and the ranking the run starts
	// from: the scores explain the shares that follow.
	if sel, err := drillSelection(client, gw.api); err == nil {
		perWorker := map[string][]time.Duration{}
		outcomes := map[string]map[string]int{}
		for _, c := range warm {
			for _, a := range c.answer.Attempts {
				n := names[a.Peer]
				if outcomes[n] == nil {
					outcomes[n] = map[string]int{}
				}
				outcomes[n][a.Outcome]++
				perWorker[n] = append(perWorker[n], time.Duration(a.DurationMS*float64(time.Millisecond)))
			}
		}
		var line []string
		for _, n := range []string{"h1", "h2", "h3", "grey", "slow", "local"} {
			d := perWorker[n]
			line = append(line, fmt.Sprintf("%s %v median %s max %s score %s", n, outcomes[n],
				percentile(d, 50).Round(10*time.Microsecond), percentile(d, 100).Round(10*time.Microsecond),
				drillScore(sel[nodes[n].peerIDOr(n)])))
		}
		t.Logf("warm-up attempts and scores: %s", strings.Join(line, "; "))
	}
	var before drillStats
	if err := drillGetJSON(client, gw.api, "/v1/work/stats", &before); err != nil {
		t.Fatal(err)
	}

	// The monitor reads the gateway's view every 50ms and records when each
	// peer's liveness state changes.
	type change struct {
		at    time.Time
		state string
	}
	var monMu sync.Mutex
	changes := map[string][]change{}
	monStop, monDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(monDone)
		tick := time.NewTicker(monitorEvery)
		defer tick.Stop()
		for {
			sel, err := drillSelection(client, gw.api)
			now := time.Now()
			if err == nil {
				monMu.Lock()
				for id, p := range sel {
					if cs := changes[id]; len(cs) == 0 || cs[len(cs)-1].state != p.State {
						changes[id] = append(cs, change{now, p.State})
					}
				}
				monMu.Unlock()
			}
			select {
			case <-monStop:
				return
			case <-tick.C:
			}
		}
	}()

	// Two SIGKILLs at seeded random moments between 15% and 45% of the
	// planned run, so that more than half of it comes after both. The
	// victim is the healthy worker that served the most of the last 50
	// requests: the one rating sends work to, so the kill catches work in
	// flight and forces a failover.
	planned := time.Duration(float64(requests) / rate * float64(time.Second))
	killAt := []time.Duration{
		time.Duration((0.15 + 0.3*rng.Float64()) * float64(planned)),
		time.Duration((0.15 + 0.3*rng.Float64()) * float64(planned)),
	}
	slices.Sort(killAt)
	var recentMu sync.Mutex
	var recent []string
	var killed []*drillNode
	killsDone := make(chan struct{})
	runStart := time.Now()
	go func() {
		defer close(killsDone)
		for _, d := range killAt {
			time.Sleep(time.Until(runStart.Add(d)))
			recentMu.Lock()
			count := map[string]int{}
			for _, n := range recent {
				count[n]++
			}
			recentMu.Unlock()
			var victim *drillNode
			for _, n := range []string{"h1", "h2", "h3"} {
				if p := nodes[n]; p.killed.IsZero() && (victim == nil || count[n] > count[victim.name]) {
					victim = p
				}
			}
			victim.kill(t)
			killed = append(killed, victim)
		}
	}()
	calls := drillLoad(client, gw.api, payloads("main", requests), concurrency, rate, timeout, clientSlack, func(c *drillCall) {
		recentMu.Lock()
		defer recentMu.Unlock()
		recent = append(recent, names[c.answer.Worker])
		if len(recent) > 50 {
			recent = recent[1:]
		}
	})
	took := time.Since(runStart)
	<-killsDone
	if len(killed) != 2 {
		t.Fatalf("%d kills, want 2", len(killed))
	}
	// A killed worker the gateway has not marked unreachable yet gets until
	// the ejection bound after its kill.
	for _, k := range killed {
		time.Sleep(time.Until(k.killed.Add(ejectBound + 100*time.Millisecond)))
	}
	close(monStop)
	<-monDone
	var after drillStats
	if err := drillGetJSON(client, gw.api, "/v1/work/stats", &after); err != nil {
		t.Fatal(err)
	}
	final, err := drillSelection(client, gw.api)
	if err != nil {
		t.Fatal(err)
	}
	var metrics string
	if err := drillGetJSON(client, gw.api, "/metrics", &metrics); err != nil {
		t.Fatal(err)
	}
	at := func(tm time.Time) string { return tm.Sub(runStart).Round(time.Millisecond).String() }
	describe := func(c *drillCall) string {
		var as []string
		for _, a := range c.answer.Attempts {
			as = append(as, fmt.Sprintf("%s %s %.1fms %s", names[a.Peer], a.Outcome, a.DurationMS, a.Error))
		}
		return fmt.Sprintf("%s %s (HTTP %d, %v) started %s, ended %s, by %q; attempts: [%s]; error %q",
			c.answer.RequestID, c.answer.Status, c.code, c.err, at(c.start), at(c.end), names[c.answer.Worker],
			strings.Join(as, "; "), c.answer.Error)
	}

	// Per-request failures are reported three of a kind at most, then
	// counted, so that a broken run stays readable.
	perKind := map[string]int{}
	fail := func(kind, format string, args ...any) {
		t.Helper()
		if perKind[kind]++; perKind[kind] <= 3 {
			t.Errorf(format, args...)
		}
	}
	defer func() {
		for kind, n := range perKind {
			if n > 3 {
				t.Errorf("... and %d more: %s", n-3, kind)
			}
		}
	}()

	// The figures.
	status := map[string]int{}
	served := map[string]int{}
	tried := map[string]int{}
	var lat []time.Duration
	for i := range calls {
		c := &calls[i]
		st := c.answer.Status
		if c.err != nil {
			st = "no answer"
		}
		status[st]++
		if st == "ok" {
			served[names[c.answer.Worker]]++
		}
		for _, a := range c.answer.Attempts {
			tried[names[a.Peer]]++
		}
		lat = append(lat, c.end.Sub(c.start))
	}
	t.Logf("%d requests (%.0f/s offered, at most %d in flight) in %s: p50 %s, p99 %s, max %s; by status %v", requests, rate, concurrency,
		took.Round(time.Millisecond), percentile(lat, 50).Round(10*time.Microsecond),
		percentile(lat, 99).Round(10*time.Microsecond), percentile(lat, 100).Round(10*time.Microsecond), status)
	monMu.Lock()
	for _, n := range []string{"h1", "h2", "h3", "grey", "slow", "local"} {
		role := map[string]string{"grey": "--fault-error-rate 0.5", "slow": "--fault-delay " + delay.String(), "local": "the gateway's own worker"}[n]
		p := nodes[n]
		state := ""
		if p != nil {
			if !p.killed.IsZero() {
				role = "SIGKILL at " + at(p.killed)
			}
			var s []string
			for _, c := range changes[p.peerID] {
				s = append(s, c.state+" at "+at(c.at))
			}
			state = fmt.Sprintf(", score %s, liveness %s", drillScore(final[p.peerID]), strings.Join(s, ", "))
		}
		t.Logf("  %-5s served %4d (%5.1f%%) of %4d attempts%s [%s]", n, served[n], 100*float64(served[n])/requests, tried[n], state, role)
	}
	monMu.Unlock()

	// Every request ended with exactly one terminal result: one answer per
	// call, with a request ID no other call got, a known status and the
	// HTTP code that goes with it; and the gateway counted exactly these.
	codes := map[string]int{"ok": 200, "empty": 200, "failed": 422, "unavailable": 503, "timeout": 504}
	ids := map[string]bool{}
	for _, c := range append(slices.Clone(warm), calls...) {
		switch {
		case c.err != nil:
			fail("no terminal result", "no terminal result: %s", describe(&c))
		case codes[c.answer.Status] == 0 || codes[c.answer.Status] != c.code:
			fail("status and HTTP code disagree", "status %q with HTTP %d: %s", c.answer.Status, c.code, describe(&c))
		case c.answer.RequestID == "" || ids[c.answer.RequestID]:
			fail("request ID missing or duplicated", "request ID %q missing or seen before: %s", c.answer.RequestID, describe(&c))
		}
		ids[c.answer.RequestID] = true
	}
	if n := after.Requests - before.Requests; n != requests {
		t.Errorf("the gateway counted %d requests during the run, want %d", n, requests)
	}
	for st, n := range status {
		if got := after.ByStatus[st] - before.ByStatus[st]; got != uint64(n) {
			t.Errorf("the gateway counted %d %s results during the run, the clients got %d", got, st, n)
		}
	}

	// Every success carries the right digest, from whichever worker.
	for i := range calls {
		c := &calls[i]
		if c.answer.Status == "ok" && (c.answer.Result == nil || *c.answer.Result != drillDigest(c.payload)) {
			fail("wrong digest", "wrong digest: %s", describe(c))
		}
	}

	// No request outlives its deadline by more than deadlineGap, as the
	// client timed it.
	for i := range calls {
		if c := &calls[i]; c.end.Sub(c.start) > timeout+deadlineGap {
			fail("past the deadline", "took %s with a %s timeout: %s", c.end.Sub(c.start), timeout, describe(c))
		}
	}

	// Every request that did not succeed is one a kill explains: it had an
	// attempt on a killed worker that was still running at the kill or
	// started after it; and there are at most maxLostPerKill of those per
	// kill. An attempt the dead worker never accepted fails over after the
	// accept timeout (250ms); one it had accepted waits for the answer as
	// long as the request's own timeout allows (worker-timeout does not
	// bound it when the request's timeout is longer), so a request caught
	// between the accept and the answer at the very moment of the kill
	// ends as a timeout. With well under a millisecond of work that is
	// rare: measured none in 16 runs. Before the accept timeout bounded
	// the write of the request as well as the first read, each kill cost
	// 20 to 32 timeouts here.
	explained := map[string]int{}
	for i := range calls {
		c := &calls[i]
		if c.answer.Status == "ok" {
			continue
		}
		why := ""
		for _, k := range killed {
			for _, a := range c.answer.Attempts {
				if a.Peer == k.peerID && a.Outcome != "success" && c.end.After(k.killed) {
					why = k.name
				}
			}
		}
		if why == "" {
			fail("failure no kill explains", "ended %s and no kill explains it: %s", c.answer.Status, describe(c))
		} else {
			explained[c.answer.Status+" after trying "+why]++
		}
	}
	if lost := status["timeout"] + status["failed"] + status["unavailable"] + status["empty"] + status["no answer"]; lost > maxLostPerKill*len(killed) {
		t.Errorf("%d requests did not succeed, more than %d per kill", lost, maxLostPerKill)
	}
	if len(explained) > 0 {
		var sample []string
		for i := range calls {
			if c := &calls[i]; c.answer.Status != "ok" && len(sample) < 2 {
				sample = append(sample, describe(c))
			}
		}
		t.Logf("requests that did not succeed: %v; e.g. %s", explained, strings.Join(sample, " | "))
	}

	// The killed workers: the gateway shows each unreachable within
	// ejectBound of its kill, and still at the end, in /v1/peers/selection
	// and in /metrics. No request that started after the gateway showed it
	// unreachable tried it (selection reads liveness live, so none may),
	// and none that started after its kill was served by it.
	var settled time.Time // one second after the later ejection
	for _, k := range killed {
		var ejected time.Time
		monMu.Lock()
		for _, c := range changes[k.peerID] {
			if c.at.After(k.killed) && c.state == "unreachable" && ejected.IsZero() {
				ejected = c.at
			}
		}
		monMu.Unlock()
		shown := "never shown unreachable"
		if ejected.IsZero() {
			var s []string
			for _, c := range changes[k.peerID] {
				s = append(s, c.state+" at "+at(c.at))
			}
			t.Errorf("%s, killed at %s, never shown unreachable (liveness %s)", k.name, at(k.killed), strings.Join(s, ", "))
			ejected = k.killed.Add(ejectBound) // for the checks below
		} else {
			shown = fmt.Sprintf("shown unreachable %s later", ejected.Sub(k.killed).Round(time.Millisecond))
		}
		if ejected.Sub(k.killed) > ejectBound {
			t.Errorf("%s shown unreachable %s after its kill, want within %s", k.name, ejected.Sub(k.killed), ejectBound)
		}
		if e := ejected.Add(time.Second); e.After(settled) {
			settled = e
		}
		tries := 0 // attempts on it by requests running at or after its kill
		kinds := map[string]int{}
		var took []time.Duration
		startedAfter, soon := 0, 0
		for i := range calls {
			c := &calls[i]
			if c.start.After(ejected) {
				startedAfter++
				if c.start.Before(ejected.Add(4 * time.Second)) {
					soon++
				}
			}
			if c.start.After(k.killed) && c.answer.Worker == k.peerID {
				fail(k.name+" served after its kill", "%s served a request started after its kill: %s", k.name, describe(c))
			}
			for _, a := range c.answer.Attempts {
				if a.Peer != k.peerID || c.end.Before(k.killed) {
					continue
				}
				if c.start.After(ejected) {
					fail(k.name+" tried after its ejection", "%s was tried by a request started after %s, when it was (or should have been) ejected: %s", k.name, at(ejected), describe(c))
				}
				tries++
				kind := a.Outcome
				for _, stage := range []string{"open stream", "write request", "read response"} {
					if strings.Contains(a.Error, stage) {
						kind += " (" + stage + ")"
						break
					}
				}
				kinds[kind]++
				took = append(took, time.Duration(a.DurationMS*float64(time.Millisecond)))
			}
		}
		// Without enough requests after the ejection the check above
		// proves nothing.
		if startedAfter < 50 {
			t.Errorf("only %d requests started after %s was ejected: too few to show it gets no more work", startedAfter, k.name)
		}
		if st := final[k.peerID].State; st != "unreachable" {
			t.Errorf("%s is %q in the gateway's /v1/peers/selection at the end, want unreachable", k.name, st)
		}
		if m := `workmesh_peer_liveness_state{peer="` + k.peerID + `",state="unreachable"} 1`; !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
		t.Logf("%s: SIGKILL at %s, %s; %d attempts on it at or after the kill %v (median %s, max %s); %d requests started after its ejection, %d of them in the first 4s (%.0f at the offered rate)",
			k.name, at(k.killed), shown, tries, kinds,
			percentile(took, 50).Round(time.Millisecond), percentile(took, 100).Round(time.Millisecond), startedAfter, soon, 4*rate)
	}

	// Rating keeps the sick workers to a small share of the work once it
	// has rated them and the failovers have settled: judged on the
	// requests that started a second or more after the later ejection
	// (about half the run), against the healthy worker left. Round-robin
	// selection, which ignores errors and latency, gives the grey one 80%
	// and the slow one 450% of what the healthy one serves there.
	//
	// The grey worker fails half its work: error weight 4 x rate 0.5 costs
	// 2 in its score, which keeps it below a healthy worker less than
	// three times slower than the fastest rated one. The slow worker's
	// delay is ten times the median measured at the warm-up, when the
	// machine was quiet; when it is loaded, the healthy worker's own
	// latency climbs towards that delay and rating rightly sends the slow
	// one some work. Measured: both served nothing in the settled part of
	// the last 16 runs; 4 to 10% in earlier runs on a loaded machine (a
	// median request of 25ms instead of 2.5ms). 15% is the bound for each.
	//
	// Beyond it, in 3 earlier runs of 37 (with a backlog sent as a burst
	// after a stall, and before the write fix above), were two rating
	// defects, not noise: (1) a worker's latency is judged against the
	// fastest rated peer's, dead peers included, so once the load falls
	// on the survivor the dead workers' old latency is the yardstick: the
	// survivor scored 0.15 or 0.18 against the grey worker's 0.20 or 0.24
	// (the dead ones 0.69 to 0.97), and the grey one served 23 to 32% as
	// much as it. (2) A rated peer is not tried again while others rank
	// above it: a healthy worker rated 0.03 from its warm-up samples got no
	// attempt in the whole run, and once the other two were dead the grey
	// and the slow worker served everything while it stood idle.
	settledServed := map[string]int{}
	settledN := 0
	for i := range calls {
		if c := &calls[i]; c.start.After(settled) {
			settledN++
			if c.answer.Status == "ok" {
				settledServed[names[c.answer.Worker]]++
			}
		}
	}
	healthy := 0
	for _, n := range []string{"h1", "h2", "h3"} {
		if nodes[n].killed.IsZero() {
			healthy = settledServed[n]
		}
	}
	t.Logf("settled part (the %d requests started from %s on): %v", settledN, at(settled), settledServed)
	if settledN < 200 {
		t.Errorf("only %d requests started after the failovers settled: too few to judge rating", settledN)
	}
	for _, sick := range []struct {
		name  string
		bound float64
	}{{"grey", greyShare}, {"slow", slowShare}} {
		if got := settledServed[sick.name]; float64(got) > sick.bound*float64(healthy) {
			t.Errorf("the %s worker served %d requests once the failovers had settled, more than %.0f%% of the %d the healthy worker served",
				sick.name, got, 100*sick.bound, healthy)
		}
	}
	t.Logf("grey served %.1f%%, slow %.1f%% of what the healthy worker served once settled",
		100*float64(settledServed["grey"])/float64(max(healthy, 1)), 100*float64(settledServed["slow"])/float64(max(healthy, 1)))

	// The grey worker: fault injection fails half its health pings as it
	// fails half its work, so the gateway's liveness marks it unreachable
	// (a decaying counter at a 1:1 error rate climbs to poll-failure-
	// threshold: about threshold x (threshold+1) = 12 polls, 1.2s, on
	// average) and lets it back only after poll-success-threshold good
	// pings in a row. No request may be served by it while the gateway
	// showed it out of the pool: from one monitor period after it was shown
	// unreachable (selection reads liveness live; the monitor reads it
	// every 50ms) to one monitor period before the next change the
	// monitor saw (which it sees up to a period late: a request started
	// 1ms before the monitor saw the grey worker alive again had found it
	// alive).
	grey := nodes["grey"]
	monMu.Lock()
	greyChanges := append([]change(nil), changes[grey.peerID]...)
	monMu.Unlock()
	var outFor time.Duration
	var timeline []string
	for i, c := range greyChanges {
		timeline = append(timeline, c.state+" at "+at(c.at))
		if c.state == "alive" {
			continue
		}
		end := time.Now()
		if i+1 < len(greyChanges) {
			end = greyChanges[i+1].at
		}
		outFor += end.Sub(c.at)
		for j := range calls {
			if cl := &calls[j]; cl.answer.Worker == grey.peerID && cl.start.After(c.at.Add(100*time.Millisecond)) && cl.start.Before(end.Add(-monitorEvery)) {
				fail("grey served while out", "the grey worker served a request started at %s while the gateway showed it %s (%s to %s): %s",
					at(cl.start), c.state, at(c.at), at(end), describe(cl))
			}
		}
	}
	if !slices.ContainsFunc(greyChanges, func(c change) bool { return c.state == "unreachable" }) {
		t.Errorf("the grey worker (fault-error-rate 0.5) was never shown unreachable: %v", timeline)
	}
	t.Logf("grey worker liveness: %s; out of the pool %s of the %s run; %q at the end",
		strings.Join(timeline, ", "), outFor.Round(time.Millisecond), took.Round(time.Millisecond), final[grey.peerID].State)
	if t.Failed() {
		t.Logf("gateway stderr:\n%s", gw.stderr)
	}
	t.Logf("drill took %s in all", time.Since(began).Round(time.Millisecond))
}

// drillNode is one `workmesh node start` process of the drill.
type drillNode struct {
	*nodeProcess
	name   string
	killed time.Time // when the drill sent SIGKILL; zero if it did not
}

// drillStart starts a node process and waits for its "ready" line (see
// launchNode).
func drillStart(t *testing.T, bin, name string, args ...string) (*drillNode, error) {
	p, err := launchNode(t, bin, name, "info", 20*time.Second, args...)
	if err != nil {
		return nil, err
	}
	return &drillNode{nodeProcess: p, name: name}, nil
}

// peerIDOr returns the node's peer ID, or name for a nil node (the local
// worker in the drill's tables).
func (n *drillNode) peerIDOr(name string) string {
	if n == nil {
		return name
	}
	return n.peerID
}

// kill sends SIGKILL and waits for the process to be gone.
func (n *drillNode) kill(t *testing.T) {
	n.killed = time.Now()
	if err := n.cmd.Process.Kill(); err != nil {
		t.Errorf("kill %s: %v", n.name, err)
		return
	}
	<-n.done
}

// drillPeer is the part of GET /v1/peers/selection the drill reads.
type drillPeer struct {
	ID     string `json:"id"`
	State  string `json:"state"`
	Scores []struct {
		WorkType string  `json:"work_type"`
		Score    float64 `json:"score"`
		Rated    bool    `json:"rated"`
	} `json:"scores"`
}

// drillAttempt and drillAnswer are the parts of the API's answer the drill
// reads, decoded as a client would.
type drillAttempt struct {
	Peer       string  `json:"peer"`
	Outcome    string  `json:"outcome"`
	DurationMS float64 `json:"duration_ms"`
	Error      string  `json:"error"`
}

type drillAnswer struct {
	RequestID  string         `json:"request_id"`
	Status     string         `json:"status"`
	Result     *string        `json:"result"`
	Worker     string         `json:"worker"`
	Attempts   []drillAttempt `json:"attempts"`
	DurationMS float64        `json:"duration_ms"`
	Error      string         `json:"error"`
}

// drillCall is one request of the drill as the client saw it.
type drillCall struct {
	payload    string
	start, end time.Time
	code       int
	answer     drillAnswer
	err        error // transport error or undecodable body: no terminal result
}

// drillLoad sends one sha256 request per payload to api from concurrency
// clients, each like a user: it sends a request, waits for the answer, and
// sends its next one a period after the last one started (at once if the
// answer took longer), the period being concurrency/rate, so that together
// they offer rate requests a second, staggered. A client held up does not
// make up for lost time afterwards: there is no burst after a stall. Each
// request is bounded by timeout on the node and by timeout+clientSlack on
// the client, so no call can hang. onDone, when set, sees each call as it
// ends.
func drillLoad(client *http.Client, api string, payloads []string, concurrency int, rate float64,
	timeout, clientSlack time.Duration, onDone func(c *drillCall)) []drillCall {
	calls := make([]drillCall, len(payloads))
	var next atomic.Int64
	var wg sync.WaitGroup
	period := time.Duration(float64(concurrency) / rate * float64(time.Second))
	t0 := time.Now()
	for j := range concurrency {
		wg.Go(func() {
			due := t0.Add(period * time.Duration(j) / time.Duration(concurrency))
			for {
				time.Sleep(time.Until(due))
				i := int(next.Add(1)) - 1
				if i >= len(payloads) {
					return
				}
				c := &calls[i]
				c.payload = payloads[i]
				body, _ := json.Marshal(map[string]string{"type": "sha256", "payload": c.payload, "timeout": timeout.String()})
				ctx, cancel := context.WithTimeout(context.Background(), timeout+clientSlack)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+api+"/v1/work", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				c.start = time.Now()
				resp, err := client.Do(req)
				if err == nil {
					c.code = resp.StatusCode
					var raw []byte
					raw, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil {
						if err = json.Unmarshal(raw, &c.answer); err != nil {
							err = fmt.Errorf("decode %q: %w", raw, err)
						}
					}
				}
				c.end = time.Now()
				c.err = err
				cancel()
				if due = c.start.Add(period); due.Before(c.end) {
					due = c.end
				}
				if onDone != nil {
					onDone(c)
				}
			}
		})
	}
	wg.Wait()
	return calls
}

func drillDigest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// drillGetJSON decodes the JSON answer of GET http://api+path into v.
func drillGetJSON(client *http.Client, api, path string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+api+path, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	if s, ok := v.(*string); ok {
		b, err := io.ReadAll(resp.Body)
		*s = string(b)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// drillSelection returns the gateway's view of its peers by peer ID.
func drillSelection(client *http.Client, api string) (map[string]drillPeer, error) {
	var peers []drillPeer
	if err := drillGetJSON(client, api, "/v1/peers/selection", &peers); err != nil {
		return nil, err
	}
	out := make(map[string]drillPeer, len(peers))
	for _, p := range peers {
		out[p.ID] = p
	}
	return out, nil
}

// drillScore is a peer's sha256 score as text ("unrated" before it is rated).
func drillScore(p drillPeer) string {
	for _, s := range p.Scores {
		if s.WorkType == "sha256" {
			if !s.Rated {
				return "unrated"
			}
			return strconv.FormatFloat(s.Score, 'f', 2, 64)
		}
	}
	return "-"
}

// drillStats is the part of GET /v1/work/stats the drill reads.
type drillStats struct {
	Requests uint64            `json:"requests"`
	ByStatus map[string]uint64 `json:"by_status"`
}
