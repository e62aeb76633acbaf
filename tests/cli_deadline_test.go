package tests

import (
	"errors"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// TestCLI_LongRemoteWorkWithDefaults runs real processes with every
// setting at its default: `workmesh submit --type sleep --payload 5s`
// (the request's timeout is the node's 10s default) through a gateway that
// does not serve sleep runs on the remote worker and succeeds. The
// request's deadline bounds the work, not worker-timeout (500ms), which
// bounds only a worker that has gone silent.
func TestCLI_LongRemoteWorkWithDefaults(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	gw := startNodeProcess(t, bin, "--work-types", "echo")
	w := startNodeProcess(t, bin, "--work-types", "sleep", "--bootstrap", gw.join)
	awaitListed(t, bin, gw, w)
	submit := func(args ...string) cliRun {
		return runCLI(t, bin, nil, append([]string{"submit", "--api", gw.api, "--output", "json"}, args...)...)
	}
	// The gateway lists its peers a moment before its dispatcher takes
	// them in (exit 2, unavailable, until then).
	if _, err := testkit.Poll(10*time.Second, func() error {
		if r := submit("--type", "sleep", "--payload", "1ms"); r.code != 0 {
			return errors.New(r.stderr)
		}
		return nil
	}); err != nil {
		t.Fatalf("a short sleep does not reach the worker: %v", err)
	}

	start := time.Now()
	r := submit("--type", "sleep", "--payload", "5s")
	took := time.Since(start)
	if r.code != 0 {
		t.Fatalf("sleep 5s: exit code %d after %s, want 0\nstdout %s\nstderr %s", r.code, took, r.stdout, r.stderr)
	}
	resp := decodeResponse(t, r)
	if resp.Status != "ok" || resp.Worker != w.peerID || len(resp.Attempts) != 1 {
		t.Fatalf("sleep 5s: got %+v, want ok by the worker %s in one attempt", resp, w.peerID)
	}
	if took < 5*time.Second {
		t.Errorf("sleep 5s answered after %s", took)
	}
}
