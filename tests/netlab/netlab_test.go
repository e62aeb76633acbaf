package netlab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// servedBy submits one sha256 request at gw and checks that worker served it.
func servedBy(t *testing.T, gw, worker *wmNode, workerID string, timeout time.Duration) {
	t.Helper()
	if err := serves(gw, worker, workerID, timeout); err != nil {
		t.Fatal(err)
	}
}

// serves submits one sha256 request at gw and says whether worker served it.
func serves(gw, worker *wmNode, workerID string, timeout time.Duration) error {
	r, stderr, err := gw.submit("sha256", "hello", timeout)
	if err != nil {
		return err
	}
	if r.Status != "ok" || r.Worker != workerID {
		return fmt.Errorf("sha256 at %s: status %q, worker %q (want ok from %s %s): %s\n%s", gw.role, r.Status, r.Worker, worker.role, workerID, r.Error, stderr)
	}
	return nil
}

// lists waits until n lists peer id as serving workType.
func lists(l *lab, n *wmNode, id, workType string, within time.Duration) {
	l.t.Helper()
	l.waitFor(within, fmt.Sprintf("%s lists %s serving %s", n.role, id, workType), func() error {
		p, err := n.peer(id)
		if err != nil {
			return err
		}
		if !slices.Contains(p.WorkTypes, workType) {
			return fmt.Errorf("%s serves %v", id, p.WorkTypes)
		}
		return nil
	})
}

// holdsRelayAddr waits until n holds a relay address of peer id: until
// then a public node cannot reach a node behind NAT it has no connection to.
func holdsRelayAddr(l *lab, n *wmNode, id string, within time.Duration) {
	l.t.Helper()
	l.waitFor(within, fmt.Sprintf("%s holds a relay address of %s", n.role, id), func() error {
		p, err := n.peer(id)
		if err == nil && !slices.ContainsFunc(p.Addrs, func(a string) bool { return strings.Contains(a, "p2p-circuit") }) {
			err = fmt.Errorf("addrs %v", p.Addrs)
		}
		return err
	})
}

// connection returns how n is connected to peer id.
func connection(n *wmNode, id string) (string, error) {
	p, err := n.peer(id)
	if err != nil {
		return "", err
	}
	return p.Connection, nil
}

// TestNetlab_NoUDPSiteJoinsOverTCP (scenario 5): a site whose router drops
// every UDP packet joins through a public node with default settings (QUIC
// and TCP) and serves work there.
func TestNetlab_NoUDPSiteJoinsOverTCP(t *testing.T) {
	l := newLab(t)
	l.publicHost("pa", 10)
	l.site("su", 3, natNoUDP)
	pub := l.start("pa", "--work-types", "echo")
	site := l.start("su", append(pub.bootstrap(), "--work-types", "sha256")...)
	id := site.id()
	lists(l, pub, id, "sha256", 20*time.Second)
	servedBy(t, pub, site, id, 10*time.Second)
	if c, err := connection(pub, id); err != nil || c != "direct" {
		t.Errorf("public node's connection to the UDP-less site: %q, %v; want direct (TCP)", c, err)
	}
}

// runs is the number of fresh pairs of NAT'd nodes the hole punch scenario
// starts: WMTEST_NETLAB_RUNS, 2 by default (make netlab runs 10).
func runs(t *testing.T) int {
	if s := os.Getenv("WMTEST_NETLAB_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("WMTEST_NETLAB_RUNS=%q: want a positive count", s)
		}
		return n
	}
	return 2
}

// TestNetlab_HolePunchBetweenSites (scenario 1): work submitted at a node
// behind one NAT for a type served only behind another succeeds, and the
// two end directly connected after the hole punch. Over WMTEST_NETLAB_RUNS
// runs with fresh identities it reports the share that went direct and the
// median time from the worker's start to the direct connection (goal: all
// direct, median under 10s).
func TestNetlab_HolePunchBetweenSites(t *testing.T) {
	l := newLab(t)
	l.publicHost("pa", 10)
	l.publicHost("pb", 11)
	l.site("sa", 1, natCone)
	l.site("sb", 2, natCone)
	pubA := l.start("pa", "--work-types", "echo", "--reachability", "public")
	boot := pubA.bootstrap()
	l.start("pb", append(slices.Clone(boot), "--work-types", "echo", "--reachability", "public")...)

	n := runs(t)
	var took []time.Duration
	for i := range n {
		// Each run's nodes listen on ports of their own, so that no NAT
		// mapping or dial backoff of the run before reaches this one.
		port := strconv.Itoa(4201 + i)
		listen := []string{"--listen", "/ip4/0.0.0.0/udp/" + port + "/quic-v1", "--listen", "/ip4/0.0.0.0/tcp/" + port}
		gw := l.start("sa", append(slices.Concat(boot, listen), "--work-types", "echo")...)
		worker := l.start("sb", append(slices.Concat(boot, listen), "--work-types", "sha256")...)
		id := worker.id()
		lists(l, gw, id, "sha256", 30*time.Second)
		// Work submitted as soon as the gateway lists the worker: before
		// the hole punch (over the relayed connection, within the relay's
		// limits) or while it upgrades the connection to a direct one.
		listed := time.Since(worker.started)
		if err := serves(gw, worker, id, 20*time.Second); err != nil {
			t.Errorf("run %d, work submitted once the worker is listed: %v", i+1, err)
		}
		t.Logf("run %d: worker listed %.1fs after it started, served at once (%.1fs)", i+1, listed.Seconds(), time.Since(worker.started).Seconds())
		l.waitFor(30*time.Second, fmt.Sprintf("run %d: the worker advertises a relay address", i+1), func() error {
			st, err := worker.status()
			if err == nil && len(st.RelayAddrs) == 0 {
				err = fmt.Errorf("reachability %s, advertised %v", st.Reachability, st.AdvertisedAddrs)
			}
			return err
		})
		l.waitFor(30*time.Second, fmt.Sprintf("run %d: the gateway holds the worker's relay address", i+1), func() error {
			p, err := gw.peer(id)
			if err == nil && !slices.ContainsFunc(p.Addrs, func(a string) bool { return strings.Contains(a, "p2p-circuit") }) {
				err = fmt.Errorf("worker's addrs %v", p.Addrs)
			}
			return err
		})
		t.Logf("run %d: worker reachable through a relay %.1fs after it started", i+1, time.Since(worker.started).Seconds())
		l.waitFor(30*time.Second, fmt.Sprintf("run %d: the gateway is directly connected to the worker", i+1), func() error {
			c, err := connection(gw, id)
			if err == nil && c != "direct" {
				// Both ends' hole punching, for a run that stays relayed.
				gst, _ := gw.status()
				wst, _ := worker.status()
				err = fmt.Errorf("connection %q; gateway nat %+v; worker nat %+v, advertised %v",
					c, gst.NAT, wst.NAT, wst.AdvertisedAddrs)
			}
			return err
		})
		d := time.Since(worker.started)
		took = append(took, d)
		// And over the direct connection once it exists.
		if err := serves(gw, worker, id, 20*time.Second); err != nil {
			t.Errorf("run %d, work submitted once direct: %v", i+1, err)
		}
		st, _ := gw.status()
		t.Logf("run %d: direct %.1fs after the worker started (gateway: reachability %s, nat %+v)", i+1, d.Seconds(), st.Reachability, st.NAT)
		gw.stop()
		worker.stop()
	}
	slices.Sort(took)
	t.Logf("hole punch: %d of %d runs direct, median time to direct %.1fs", len(took), n, took[len(took)/2].Seconds())
}

// TestNetlab_HolePunchRetriedOnceThePathOpens: two nodes behind cone NATs
// meet through a relay while every direct packet between their sites is
// dropped, so the hole punches made when the relayed connections arrive
// fail and the two stay relayed. The side that accepted a relayed
// connection punches again later (its first retry 20s after it saw the
// peer relayed): the worker when the gateway dialed it first, the gateway
// when the worker's own first exchange with it (its polls of the
// gateway's echo) came first, so the retries are counted on both. The
// path opens once a retry has started, long after the first punches
// ended, and the retries make the two direct without either restarting or
// the relayed connection closing.
func TestNetlab_HolePunchRetriedOnceThePathOpens(t *testing.T) {
	l := newLab(t)
	l.publicHost("pa", 10)
	l.site("sa", 1, natCone)
	l.site("sb", 2, natCone)
	// Site A's router drops what goes to or comes from site B's router
	// (198.51.100.22).
	l.block("rsa", "198.51.100.22")
	pub := l.start("pa", "--work-types", "echo", "--reachability", "public")
	boot := pub.bootstrap()
	gw := l.start("sa", append(slices.Clone(boot), "--work-types", "echo")...)
	worker := l.start("sb", append(slices.Clone(boot), "--work-types", "sha256")...)
	id := worker.id()
	lists(l, gw, id, "sha256", 30*time.Second)
	holdsRelayAddr(l, gw, id, 30*time.Second)
	servedBy(t, gw, worker, id, 20*time.Second)
	l.waitFor(60*time.Second, "the punches failed and one side retried", func() error {
		ws, err := worker.status()
		if err != nil {
			return err
		}
		gs, err := gw.status()
		if err != nil {
			return err
		}
		if ws.NAT.HolePunchesFailed+gs.NAT.HolePunchesFailed < 3 || ws.NAT.HolePunchRetries+gs.NAT.HolePunchRetries == 0 {
			return fmt.Errorf("worker's nat %+v, gateway's %+v", *ws.NAT, *gs.NAT)
		}
		return nil
	})
	if c, err := connection(gw, id); err != nil || c != "relayed" {
		t.Fatalf("gateway's connection to the worker while the path is blocked: %q, %v; want relayed", c, err)
	}
	st, _ := worker.status()
	gst, _ := gw.status()
	t.Logf("blocked: worker's nat %+v, gateway's %+v", *st.NAT, *gst.NAT)
	l.unblock("rsa")
	opened := time.Now()
	l.waitFor(60*time.Second, "the gateway is directly connected to the worker", func() error {
		c, err := connection(gw, id)
		if err == nil && c != "direct" {
			err = fmt.Errorf("connection %q", c)
		}
		return err
	})
	st, _ = worker.status()
	t.Logf("direct %.1fs after the path opened; worker's nat %+v", time.Since(opened).Seconds(), *st.NAT)
	servedBy(t, gw, worker, id, 20*time.Second)
}

// TestNetlab_NoDialsToPrivateAddrs (scenario 4): the records of nodes
// behind NAT carry their private addresses (what they listen on), yet no
// public node ever sends a packet to another site's private range: the
// public hosts' nft counters of packets to 192.0.2.0/24 stay at zero while
// work flows between the sites and the public nodes.
func TestNetlab_NoDialsToPrivateAddrs(t *testing.T) {
	l := newLab(t)
	l.publicHost("pa", 10)
	l.publicHost("pb", 11)
	l.site("sa", 1, natCone)
	l.site("sb", 2, natCone)
	pubA := l.start("pa", "--work-types", "echo", "--reachability", "public")
	boot := pubA.bootstrap()
	pubB := l.start("pb", append(slices.Clone(boot), "--work-types", "echo", "--reachability", "public")...)
	siteA := l.start("sa", append(slices.Clone(boot), "--work-types", "sha256")...)
	siteB := l.start("sb", append(slices.Clone(boot), "--work-types", "sha256")...)
	idA, idB := siteA.id(), siteB.id()
	for _, pub := range []*wmNode{pubA, pubB} {
		for _, id := range []string{idA, idB} {
			lists(l, pub, id, "sha256", 20*time.Second)
			holdsRelayAddr(l, pub, id, 20*time.Second)
		}
	}
	// Work from both public nodes to both sites: the records the public
	// nodes dial from hold the sites' private addresses.
	for _, pub := range []*wmNode{pubA, pubB} {
		for range 4 {
			r, stderr, err := pub.submit("sha256", "hello", 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != "ok" || (r.Worker != idA && r.Worker != idB) {
				t.Fatalf("sha256 at %s: %q from %q: %s\n%s", pub.role, r.Status, r.Worker, r.Error, stderr)
			}
		}
	}
	p, err := pubA.peer(idA)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(p.Addrs, func(a string) bool { return strings.Contains(a, "/192.0.2.") }) {
		t.Fatalf("site A's record holds no private address (%v): the test proves nothing", p.Addrs)
	}
	for _, role := range []string{"pa", "pb"} {
		if n := l.counter(role, "private_dials"); n != 0 {
			t.Errorf("public host %s sent %d packets to the sites' private range %s", role, n, sitesNet)
		}
	}
}

// TestNetlab_SymmetricNATWorksOverRelay (scenario 2): behind a NAT that
// randomises ports no hole punch gets through; small work still reaches
// the worker there over the relay, its connection shown relayed, and a
// payload over the relay's limit is refused with a reason that says so.
func TestNetlab_SymmetricNATWorksOverRelay(t *testing.T) {
	l := newLab(t)
	l.publicHost("pa", 10)
	l.publicHost("pb", 11)
	l.site("sa", 1, natCone)
	l.site("ss", 3, natSymmetric)
	pubA := l.start("pa", "--work-types", "echo", "--reachability", "public")
	boot := pubA.bootstrap()
	l.start("pb", append(slices.Clone(boot), "--work-types", "echo", "--reachability", "public")...)
	gw := l.start("sa", append(slices.Clone(boot), "--work-types", "echo")...)
	worker := l.start("ss", append(slices.Clone(boot), "--work-types", "sha256")...)
	id := worker.id()
	lists(l, gw, id, "sha256", 30*time.Second)
	l.waitFor(30*time.Second, "the gateway holds the worker's relay address", func() error {
		p, err := gw.peer(id)
		if err == nil && !slices.ContainsFunc(p.Addrs, func(a string) bool { return strings.Contains(a, "p2p-circuit") }) {
			err = fmt.Errorf("worker's addrs %v", p.Addrs)
		}
		return err
	})
	servedBy(t, gw, worker, id, 20*time.Second)
	// The hole punch was tried and failed; the two stay relayed.
	l.waitFor(30*time.Second, "a hole punch was tried", func() error {
		st, err := worker.status()
		if err == nil && st.NAT.HolePunchesTried == 0 {
			err = fmt.Errorf("nat %+v", *st.NAT)
		}
		return err
	})
	servedBy(t, gw, worker, id, 20*time.Second)
	if c, err := connection(gw, id); err != nil || c != "relayed" {
		t.Errorf("gateway's connection to the worker behind the symmetric NAT: %q, %v; want relayed", c, err)
	}
	st, err := gw.status()
	if err != nil {
		t.Fatal(err)
	}
	if st.NAT.HolePunchesSucceeded != 0 || st.NAT.RelayedWork == 0 {
		t.Errorf("gateway's nat counts %+v: want no hole punch succeeded and work sent over the relay", *st.NAT)
	}
	// 200 KiB does not fit relay v2's 128 KiB per relayed connection.
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("x"), 200<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, stderr, _ := gw.cli(ctx, "submit", "--type", "sha256", "--payload-file", big, "--timeout", "10s", "--output", "json")
	var r submitResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("submit: %v: %s %s", err, out, stderr)
	}
	if r.Status == "ok" || !strings.Contains(r.Error, "does not fit a relayed connection") {
		t.Errorf("200 KiB to the worker behind the symmetric NAT: status %q, error %q; want the relay limit's refusal", r.Status, r.Error)
	}
}

// TestNetlab_PartitionDuringBatch (scenario 3): while a public gateway runs
// a batch over two workers at two sites, one site's uplink is cut for 15s
// and healed. No request fails or is lost (every line answers ok), none
// takes longer than its deadline, the cut worker is shown unreachable
// within the liveness bound, and it serves again within 5s of the heal.
func TestNetlab_PartitionDuringBatch(t *testing.T) {
	l := newLab(t)
	l.publicHost("pa", 10)
	l.site("sa", 1, natCone)
	l.site("sb", 2, natCone)
	gw := l.start("pa", "--work-types", "echo", "--reachability", "public")
	boot := gw.bootstrap()
	cut := l.start("sa", append(slices.Clone(boot), "--work-types", "sleep")...)
	other := l.start("sb", append(slices.Clone(boot), "--work-types", "sleep")...)
	cutID, otherID := cut.id(), other.id()
	lists(l, gw, cutID, "sleep", 20*time.Second)
	lists(l, gw, otherID, "sleep", 20*time.Second)

	// About 30s of work: 1,500 sleeps of 80ms, 4 at once.
	const lines, deadline = 1500, 10 * time.Second
	var file bytes.Buffer
	for range lines {
		fmt.Fprintf(&file, `{"type":"sleep","payload":"80ms","timeout":"%s"}`+"\n", deadline)
	}
	path := filepath.Join(t.TempDir(), "batch.jsonl")
	if err := os.WriteFile(path, file.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	type batchOut struct {
		out, stderr []byte
		err         error
	}
	done := make(chan batchOut, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	go func() {
		out, stderr, err := gw.cli(ctx, "submit", "--file", path, "--concurrency", "4")
		done <- batchOut{out, stderr, err}
	}()
	l.waitFor(20*time.Second, "the batch runs on the worker that will be cut", func() error {
		st, err := cut.status()
		if err == nil && st.Local.InFlight == 0 {
			err = errors.New("nothing running there")
		}
		return err
	})

	l.cut("rsa")
	cutAt := time.Now()
	healed := false
	heal := func() {
		if !healed {
			healed = true
			l.heal("rsa")
		}
	}
	t.Cleanup(heal)
	// The liveness bound: poll-failure-threshold (5) polls poll-interval
	// (2s) apart, each waiting at most peer-wait-max (5s) for its answer.
	unreachable := l.waitFor(15*time.Second, "the cut worker is unreachable at the gateway", func() error {
		p, err := gw.peer(cutID)
		if err == nil && p.State != "unreachable" {
			err = fmt.Errorf("state %s", p.State)
		}
		return err
	})
	t.Logf("cut worker unreachable %.1fs after the cut", unreachable.Seconds())
	// The cut lasts 15s: a span of time the scenario defines, not a
	// condition to wait for.
	<-time.After(time.Until(cutAt.Add(15 * time.Second)))
	heal()
	// Serving again within 5s of the heal: once the worker's connection
	// is back (its inbound connection starts a probe at once), liveness
	// wants poll-success-threshold (2) good polls in a row, which come a
	// quarter of poll-interval (500ms) apart while it probes.
	back := l.waitFor(5*time.Second, "the cut worker serves again at the gateway", func() error {
		p, err := gw.peer(cutID)
		if err == nil && p.State != "alive" {
			err = fmt.Errorf("state %s", p.State)
		}
		return err
	})
	t.Logf("cut worker alive again %.1fs after the heal (bound 5s)", back.Seconds())

	var b batchOut
	select {
	case b = <-done:
	case <-ctx.Done():
		t.Fatal("the batch did not end")
	}
	var ok, failed, late int
	byWorker := map[string]int{}
	for line := range strings.Lines(string(b.out)) {
		var r struct {
			Status     string  `json:"status"`
			Error      string  `json:"error"`
			Worker     string  `json:"worker"`
			DurationMS float64 `json:"duration_ms"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("batch output line %q: %v", line, err)
		}
		switch {
		case r.Status == "ok":
			ok++
		default:
			failed++
			if failed <= 3 {
				t.Errorf("a request ended %s: %s", r.Status, r.Error)
			}
		}
		if time.Duration(r.DurationMS*float64(time.Millisecond)) > deadline {
			late++
		}
		byWorker[r.Worker]++
	}
	t.Logf("batch: %d ok, %d failed, %d past their deadline, by worker: cut %d, other %d", ok, failed, late, byWorker[cutID], byWorker[otherID])
	if ok+failed != lines || failed != 0 || late != 0 {
		t.Errorf("batch of %d: %d answered ok, %d failed, %d past their deadline (exit %v): %s", lines, ok, failed, late, b.err, lastLines(b.stderr, 5))
	}
}

// lastLines returns the last n lines of b.
func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// firstResult submits work of typ at gw until a result from workerID comes
// back, and returns the time from the worker's start to that result.
func firstResult(l *lab, gw, worker *wmNode, workerID, typ, payload string) time.Duration {
	l.t.Helper()
	l.waitFor(60*time.Second, fmt.Sprintf("a first %s result from %s at %s", typ, worker.role, gw.role), func() error {
		r, stderr, err := gw.submit(typ, payload, 20*time.Second)
		if err == nil && (r.Status != "ok" || r.Worker != workerID) {
			err = fmt.Errorf("status %q from %q: %s %s", r.Status, r.Worker, r.Error, stderr)
		}
		return err
	})
	return time.Since(worker.started)
}

// TestNetlab_FirstResultNATvsPublic (the benchmark): the time from
// a worker's start to the first result a NAT'd gateway gets from it, for
// a worker behind another NAT (reached through a relay, then directly
// after the hole punch) against a public worker, in the same lab. Over
// WMTEST_NETLAB_RUNS runs with fresh workers it reports both medians and
// their ratio. It is a figure, not a bound: the test fails only when a
// worker gives no result.
func TestNetlab_FirstResultNATvsPublic(t *testing.T) {
	l := newLab(t)
	l.publicHost("pa", 10)
	l.publicHost("pb", 11)
	l.site("sa", 1, natCone)
	l.site("sb", 2, natCone)
	pubA := l.start("pa", "--work-types", "echo", "--reachability", "public")
	boot := pubA.bootstrap()
	gw := l.start("sa", append(slices.Clone(boot), "--work-types", "echo")...)
	n := runs(t)
	var nat, pub []time.Duration
	for i := range n {
		// Each run's workers serve a work type of their own, so that the
		// gateway's first result of it comes from the worker just started,
		// and listen on ports of their own, so that no NAT mapping or
		// dial backoff left by the run before reaches the new one.
		port := strconv.Itoa(4101 + i)
		listen := []string{"--listen", "/ip4/0.0.0.0/udp/" + port + "/quic-v1", "--listen", "/ip4/0.0.0.0/tcp/" + port}
		w := l.start("pb", append(slices.Concat(boot, listen), "--work-types", "sha256", "--reachability", "public")...)
		d := firstResult(l, gw, w, w.id(), "sha256", "hello")
		pub = append(pub, d)
		w.stop()
		w = l.start("sb", append(slices.Concat(boot, listen), "--work-types", "sleep")...)
		d2 := firstResult(l, gw, w, w.id(), "sleep", "1ms")
		nat = append(nat, d2)
		w.stop()
		t.Logf("run %d: first remote result from the public worker %.2fs, from the NAT'd worker %.2fs after its start", i+1, d.Seconds(), d2.Seconds())
	}
	slices.Sort(nat)
	slices.Sort(pub)
	mn, mp := nat[len(nat)/2], pub[len(pub)/2]
	t.Logf("time to first remote result from a NAT'd gateway: NAT'd worker median %.2fs, public worker median %.2fs, ratio %.2f (%d runs)", mn.Seconds(), mp.Seconds(), mn.Seconds()/mp.Seconds(), n)
}

// TestNetlab_MDNSFindsLANPeer: two nodes on one network segment (the lab's
// internet bridge), started with --mdns and no bootstrap address, find
// each other by multicast DNS and serve each other's work.
func TestNetlab_MDNSFindsLANPeer(t *testing.T) {
	l := newLab(t)
	l.publicHost("pa", 10)
	l.publicHost("pb", 11)
	a := l.start("pa", "--mdns", "--work-types", "echo")
	b := l.start("pb", "--mdns", "--work-types", "sha256")
	idA, idB := a.id(), b.id()
	lists(l, b, idA, "echo", 20*time.Second)
	lists(l, a, idB, "sha256", 20*time.Second)
	servedBy(t, a, b, idB, 10*time.Second)
}
