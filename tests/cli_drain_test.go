package tests

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// submitAsync runs `workmesh submit` with args in the background (within
// 30s) and delivers its exit code and output.
func submitAsync(t *testing.T, bin string, args ...string) <-chan cliRun {
	out := make(chan cliRun, 1)
	env := cliEnv(t, nil)
	go func() {
		r, err := execCLI(bin, env, nil, append([]string{"submit"}, args...)...)
		if err != nil {
			r.code, r.stderr = -1, err.Error()
		}
		out <- r
	}()
	return out
}

// TestCLIStopDrains runs two nodes as a user would and stops the worker
// with SIGTERM while it runs a request for the gateway: the worker
// withdraws its work types, refuses new work on its own API, finishes the
// request (the gateway's submit succeeds on it, in one attempt), and exits
// cleanly; the gateway then no longer tries it at all.
func TestCLIStopDrains(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	a := startNodeProcess(t, bin, "--work-types", "echo")
	b := startNodeProcess(t, bin, "--work-types", "sleep", "--bootstrap", a.join, "--drain-timeout", "20s")

	// The gateway takes its peer in a moment after it lists it: submit
	// until the sleep type reaches b.
	testkit.WaitFor(t, 15*time.Second, "sleep served by b", func() error {
		r := runCLI(t, bin, nil, "submit", "--api", a.api, "--type", "sleep", "--payload", "1ms", "--output", "json")
		if r.code == 0 && decodeResponse(t, r).Worker == b.peerID {
			return nil
		}
		return fmt.Errorf("exit %d, %s %s", r.code, r.stdout, r.stderr)
	})

	long := submitAsync(t, bin, "--api", a.api, "--type", "sleep", "--payload", "3s", "--timeout", "20s", "--output", "json")
	testkit.WaitFor(t, 10*time.Second, "b runs the long request", func() error {
		if v, _ := testkit.MetricValue(scrape(t, b.api), "workmesh_local_in_flight", nil); v != 1 {
			return fmt.Errorf("workmesh_local_in_flight %v, want 1", v)
		}
		return nil
	})
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}

	// b's own API takes no new work while it drains.
	testkit.WaitFor(t, 2*time.Second, "b's API refuses work after SIGTERM", func() error {
		r := runCLI(t, bin, nil, "submit", "--api", b.api, "--type", "echo", "--payload", "x", "--output", "json")
		if r.code == 2 && strings.Contains(decodeResponse(t, r).Error, "shutting down") {
			return nil
		}
		return fmt.Errorf("it still takes work: exit %d, %s %s", r.code, r.stdout, r.stderr)
	})

	r := <-long
	if r.code != 0 {
		t.Fatalf("the request b was running: exit %d\nstdout %s\nstderr %s\nb's log:\n%s", r.code, r.stdout, r.stderr, b.stderr)
	}
	resp := decodeResponse(t, r)
	if resp.Status != "ok" || resp.Worker != b.peerID || len(resp.Attempts) != 1 {
		t.Errorf("the request b was running: %+v, want ok by b in one attempt", resp)
	}

	select {
	case err := <-b.done:
		if err != nil {
			t.Errorf("b exited with %v; log:\n%s", err, b.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("b still runs 20s after its last request ended; log:\n%s", b.stderr)
	}
	for _, want := range []string{"draining: work types withdrawn", "drained: no work in progress"} {
		if !strings.Contains(b.stderr.String(), want) {
			t.Errorf("b's log lacks %q:\n%s", want, b.stderr)
		}
	}

	// The gateway learnt of the withdrawal before b stopped: sleep is
	// served nowhere now, and b is not tried.
	r = runCLI(t, bin, nil, "submit", "--api", a.api, "--type", "sleep", "--payload", "1ms", "--output", "json")
	resp = decodeResponse(t, r)
	if r.code != 2 || resp.Status != "unavailable" || slices.ContainsFunc(resp.Attempts, func(at cliAttempt) bool { return at.Peer == b.peerID }) {
		out, _ := json.Marshal(resp)
		t.Errorf("sleep after b stopped: exit %d, %s; want unavailable without trying b", r.code, out)
	}
}
