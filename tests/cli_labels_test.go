package tests

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// TestCLILabelsConstrainLocal starts one node labelled "full" and checks
// that a request's required labels hold for its local worker too: labels
// the node carries run locally, a label it lacks (and no peer has) is
// refused with exit code 2 and the reason, by submit and by plan alike.
func TestCLILabelsConstrainLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	a := startNodeProcess(t, bin, "--work-types", "echo,sha256", "--labels", "full")
	submit := func(args ...string) cliRun {
		return runCLI(t, bin, nil, append([]string{"submit", "--api", a.api, "--type", "sha256", "--payload", "hello"}, args...)...)
	}
	plan := func(args ...string) cliRun {
		return runCLI(t, bin, nil, append([]string{"plan", "--api", a.api, "--type", "sha256"}, args...)...)
	}

	t.Run("a label the node carries runs locally", func(t *testing.T) {
		if r := submit("--labels", "full"); r.code != 0 || r.stdout != helloSHA256+"\n" {
			t.Fatalf("submit --labels full: exit code %d, stdout %q; want 0 and the digest\nstderr %s", r.code, r.stdout, r.stderr)
		}
		if r := plan("--labels", "full"); r.code != 0 || !strings.Contains(r.stdout, "the local worker runs it") {
			t.Fatalf("plan --labels full: exit code %d, want 0 with the local worker\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
		}
	})

	t.Run("a label nobody carries is refused", func(t *testing.T) {
		r := submit("--labels", "nosuch")
		if r.code != 2 {
			t.Fatalf("submit --labels nosuch: exit code %d, want 2\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
		}
		for _, want := range []string{"unavailable", "lacks label nosuch"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("submit stderr %q does not say %q", r.stderr, want)
			}
		}
		r = plan("--labels", "full,nosuch")
		if r.code != 2 {
			t.Fatalf("plan --labels full,nosuch: exit code %d, want 2\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
		}
		if !strings.Contains(r.stdout, "lacks label nosuch") || strings.Contains(r.stdout, "the local worker runs it") {
			t.Errorf("plan stdout %q: want the local node's missing label, not the local worker", r.stdout)
		}
	})
}

// TestCLIMinHeadWithoutHeads starts a worker and a gateway that serve only
// types without heads and checks that a request naming a position is
// refused with a clear error (exit code 2) by submit and by plan, while the
// same request without --min-head runs.
func TestCLIMinHeadWithoutHeads(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	a := startNodeProcess(t, bin, "--work-types", "echo")
	startNodeProcess(t, bin, "--work-types", "sha256", "--bootstrap", a.join)
	submit := func(args ...string) cliRun {
		return runCLI(t, bin, nil, append([]string{"submit", "--api", a.api, "--payload", "hello"}, args...)...)
	}
	// sha256 is served only by the worker: wait until the gateway can place it.
	if _, err := testkit.Poll(10*time.Second, func() error {
		if r := submit("--type", "sha256"); r.code != 0 {
			return fmt.Errorf("exit code %d: %s", r.code, r.stderr)
		}
		return nil
	}); err != nil {
		t.Fatalf("sha256 never served: %v", err)
	}

	for _, typ := range []string{"echo", "sha256"} { // local, remote
		r := submit("--type", typ, "--min-head", "5")
		if r.code != 2 {
			t.Fatalf("submit --type %s --min-head 5: exit code %d, want 2\nstdout %s\nstderr %s", typ, r.code, r.stdout, r.stderr)
		}
		if want := "work type " + typ + " has no heads"; !strings.Contains(r.stderr, want) {
			t.Errorf("submit --type %s --min-head 5: stderr %q does not say %q", typ, r.stderr, want)
		}
		if r := submit("--type", typ, "--min-head", "5", "--verify", "2/3"); r.code != 2 || !strings.Contains(r.stderr, "has no heads") {
			t.Errorf("submit --type %s --min-head 5 --verify 2/3: exit code %d, want 2 saying it has no heads\nstdout %s\nstderr %s", typ, r.code, r.stdout, r.stderr)
		}
		r = runCLI(t, bin, nil, "plan", "--api", a.api, "--type", typ, "--min-head", "5")
		if r.code != 2 || !strings.Contains(r.stderr, "has no heads") {
			t.Errorf("plan --type %s --min-head 5: exit code %d, want 2 saying it has no heads\nstdout %s\nstderr %s", typ, r.code, r.stdout, r.stderr)
		}
	}
}
