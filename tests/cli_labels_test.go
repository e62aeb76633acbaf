package tests

import (
	"strings"
	"testing"
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
