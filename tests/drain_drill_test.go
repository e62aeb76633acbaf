package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// TestDrainDrill measures, with real processes, what a clean stop saves
// the requests in flight: a gateway and two sleep workers, a batch of
// 3,000 20ms sleeps, 32 at once, through `workmesh submit --file`, and
// SIGTERM to one worker once a third of the batch has ended. It runs once
// for each pairing of the gateway trying one remote worker per request
// (the default) or two, and the stopped worker draining (the default) or
// not (--drain-timeout 0). Every line must get exactly one result; with
// the drain, every request must succeed in one attempt. Without it, the
// cost of the stop is reported. It runs under `make drill`
// (WMTEST_DRAIN_DRILL=1), about 16 seconds.
func TestDrainDrill(t *testing.T) {
	if os.Getenv("WMTEST_DRAIN_DRILL") == "" {
		t.Skip("make drill runs it (WMTEST_DRAIN_DRILL=1)")
	}
	bin := buildBinary(t)
	for _, remote := range []string{"1", "2"} {
		for _, drain := range []string{"10s", "0"} {
			t.Run("max-remote-workers="+remote+"/drain-timeout="+drain, func(t *testing.T) {
				drainDrill(t, bin, remote, drain)
			})
		}
	}
}

// drainDrillLine is the part of a batch result line the drill reads.
type drainDrillLine struct {
	Line       int          `json:"line"`
	Status     string       `json:"status"`
	Attempts   []cliAttempt `json:"attempts"`
	DurationMS float64      `json:"duration_ms"`
	Error      string       `json:"error"`
}

func drainDrill(t *testing.T, bin, remote, drain string) {
	const (
		requests = 3000
		stopAt   = requests / 3
	)
	gw, err := drillStart(t, bin, "gateway", "--work-types", "echo", "--max-remote-workers", remote)
	if err != nil {
		t.Fatal(err)
	}
	var workers [2]*drillNode
	for i := range workers {
		workers[i], err = drillStart(t, bin, fmt.Sprintf("w%d", i+1), "--work-types", "sleep", "--local-concurrency", "32",
			"--bootstrap", gw.join, "--drain-timeout", drain)
		if err != nil {
			t.Fatal(err)
		}
	}
	client := &http.Client{}
	testkit.WaitFor(t, 15*time.Second, "the gateway sees both workers alive", func() error {
		sel, err := drillSelection(client, gw.api)
		if err == nil && sel[workers[0].peerID].State == "alive" && sel[workers[1].peerID].State == "alive" {
			return nil
		}
		return fmt.Errorf("%v %+v", err, sel)
	})

	dir := t.TempDir()
	batch := func(name string, n int, payload string) string {
		path := filepath.Join(dir, name)
		line := []byte(`{"type": "sleep", "payload": "` + payload + `"}` + "\n")
		if err := os.WriteFile(path, bytes.Repeat(line, n), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// A warm-up rates both workers.
	if r := runCLI(t, bin, nil, "submit", "--api", gw.api, "--file", batch("warm.jsonl", 200, "1ms"), "--concurrency", "32", "--progress", "off"); r.code != 0 {
		t.Fatalf("warm-up: exit %d\n%s", r.code, r.stderr)
	}
	var before drillStats
	if err := drillGetJSON(client, gw.api, "/v1/work/stats", &before); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "submit", "--api", gw.api, "--file", batch("run.jsonl", requests, "20ms"),
		"--concurrency", "32", "--progress", "off")
	cmd.Env = cliEnv(t, nil)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	batchDone := make(chan error, 1)
	go func() { batchDone <- cmd.Wait() }()
	stopped := workers[0]
	var batchErr error
	for signalled := false; ; {
		if !signalled {
			var st drillStats
			if drillGetJSON(client, gw.api, "/v1/work/stats", &st) == nil && st.Requests >= before.Requests+stopAt {
				if err := stopped.cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				signalled = true
				t.Logf("SIGTERM to w1 after %s, %d requests ended", time.Since(start).Round(time.Millisecond), st.Requests-before.Requests)
			}
		}
		select {
		case batchErr = <-batchDone:
		case <-time.After(5 * time.Millisecond): // polling an external process
			continue
		}
		if !signalled {
			t.Fatalf("the batch ended before the stop: %v\n%s", batchErr, stderr.String())
		}
		break
	}
	select {
	case err := <-stopped.done:
		if err != nil && drain != "0" {
			t.Errorf("w1 exited with %v after draining; log:\n%s", err, stopped.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("w1 still runs 20s after SIGTERM; log:\n%s", stopped.stderr)
	}

	seen := make([]int, requests+1)
	statuses := map[string]int{}
	attempts := map[int]int{}
	errs := map[string]int{}
	var slowest float64
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var r drainDrillLine
		if err := json.Unmarshal([]byte(l), &r); err != nil || r.Line < 1 || r.Line > requests {
			t.Fatalf("batch output line %q: %v", l, err)
		}
		seen[r.Line]++
		statuses[r.Status]++
		attempts[len(r.Attempts)]++
		slowest = max(slowest, r.DurationMS)
		if r.Status != "ok" {
			e := r.Error
			if i := strings.Index(e, "(last: "); i >= 0 {
				e = e[i:]
			}
			e = strings.NewReplacer(workers[0].peerID, "w1", workers[1].peerID, "w2").Replace(e)
			errs[e[:min(len(e), 100)]]++
		}
	}
	for line, n := range seen[1:] {
		if n != 1 {
			t.Errorf("line %d: %d results, want exactly one", line+1, n)
		}
	}
	t.Logf("%d requests in %s: %v; attempts per request %v; slowest %.1fms; batch exit %v",
		requests, time.Since(start).Round(time.Millisecond), statuses, attempts, slowest, batchErr)
	for e, n := range errs {
		t.Logf("  %d did not succeed: %s", n, e)
	}
	if drain != "0" && (statuses["ok"] != requests || attempts[1] != requests) {
		t.Errorf("with the drain: %v, attempts %v; want every request ok in one attempt", statuses, attempts)
	}
}
