package tests

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestCLIReadmeRunningANode follows README.md's "Running a node" literally
// on loopback, with three processes: the first node as the README starts
// it (`workmesh node start --work-types echo,sha256 --labels full`), two
// more joining it as the README says (`workmesh node start --bootstrap`
// with the first one's `join with:` address), each with only its listen
// port, API address and data dir substituted, every other setting at its
// default. The first node serves no sleep, so sleeps run on the two that
// joined. It shows that a remote sleep of 5s succeeds (`workmesh submit
// --type sleep --payload 5s`, the node named by WORKMESH_API), that a burst
// the network can finish within its deadlines finishes (300 sleeps of
// 200ms at 256 at once with 20s deadlines: about 8s of work for the two
// workers, far more at once than their queues take), and that a worker
// killed with SIGKILL mid-batch costs no failed request.
func TestCLIReadmeRunningANode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	// launchNode adds --listen, --api and --data-dir (loopback, a free
	// port, a temporary dir) and --log-level info, the default.
	first, err := launchNode(t, bin, "the first node", "info", 15*time.Second, "--work-types", "echo,sha256", "--labels", "full")
	if err != nil {
		t.Fatal(err)
	}
	var joined []*nodeProcess
	for i := range 2 {
		p, err := launchNode(t, bin, fmt.Sprintf("joining node %d", i+1), "info", 15*time.Second, "--bootstrap", first.join)
		if err != nil {
			t.Fatal(err)
		}
		joined = append(joined, p)
	}
	awaitPlaced(t, bin, first, "sleep", joined...)
	workers := map[string]*nodeProcess{joined[0].peerID: joined[0], joined[1].peerID: joined[1]}

	// README, "Submitting work": the node is named by --api or WORKMESH_API.
	start := time.Now()
	r := runCLIEnv(t, bin, []string{"WORKMESH_API=" + first.api}, "submit", "--type", "sleep", "--payload", "5s")
	took := time.Since(start)
	if r.code != 0 || !strings.HasPrefix(r.stderr, "ok by ") || took < 5*time.Second {
		t.Fatalf("submit --type sleep --payload 5s: exit %d after %s, stderr %q; want 0, ok by a worker, after 5s", r.code, took, r.stderr)
	}
	t.Logf("remote sleep of 5s: %s", strings.TrimSpace(r.stderr))

	const n, concurrency = 300, 256
	b := runBurst(t, bin, first.api, n, concurrency, "200ms", "20s")
	if st := b.statuses(); st["ok"] != n || b.code != 0 {
		var failed []string
		for _, l := range b.lines {
			if l.Status != "ok" && len(failed) < 10 {
				failed = append(failed, fmt.Sprintf("line %d: %s after %.0fms: %s", l.Line, l.Status, l.DurationMS, l.Error))
			}
		}
		t.Fatalf("burst of %d sleeps of 200ms at %d at once, 20s deadlines: %v (exit %d), want all ok\n%s\nbatch stderr %s",
			n, concurrency, st, b.code, strings.Join(failed, "\n"), b.stderr)
	}
	t.Logf("burst of %d sleeps of 200ms at %d at once, 20s deadlines: all ok in %s", n, concurrency, b.took.Round(time.Millisecond))

	results, killed, stderr := batchKillingAWorker(t, bin, first.api, workers, 200, 40, "50ms")
	failedOver := 0
	for _, l := range results {
		if l.Status != "ok" {
			t.Fatalf("line %d: %s: %s, after the worker %s was killed", l.Line, l.Status, l.Error, killed)
		}
		if len(l.Attempts) > 1 && l.Attempts[0].Peer == killed {
			failedOver++
		}
	}
	t.Logf("a worker killed mid-batch: 200 sleeps of 50ms at 8, all ok, %d failed over; %s", failedOver, strings.TrimSpace(stderr))
}
