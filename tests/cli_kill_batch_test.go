package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// TestCLIWorkerKilledMidBatch starts a gateway that does not serve sleep
// and two workers that do, all with default settings, runs a batch of 200
// sleeps of 50ms at 8 at once with `workmesh submit --file`, and kills one
// worker with SIGKILL once 40 results are in. With the defaults a request
// whose remote attempt fails for a retryable reason goes on to the other
// worker: no request of the batch may fail.
func TestCLIWorkerKilledMidBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	a := startNodeProcess(t, bin, "--work-types", "echo")
	b := startNodeProcess(t, bin, "--work-types", "sleep", "--bootstrap", a.join)
	c := startNodeProcess(t, bin, "--work-types", "sleep", "--bootstrap", a.join)
	workers := map[string]*nodeProcess{b.peerID: b, c.peerID: c}
	if _, err := testkit.Poll(10*time.Second, func() error {
		ids, err := peersOf(t, bin, a.api)
		if err == nil && slices.Contains(ids, b.peerID) && slices.Contains(ids, c.peerID) {
			if r := runCLI(t, bin, nil, "submit", "--api", a.api, "--type", "sleep", "--payload", "1ms"); r.code != 0 {
				return fmt.Errorf("sleep not placed yet: %s", r.stderr)
			}
			return nil
		}
		return fmt.Errorf("%v %v", ids, err)
	}); err != nil {
		t.Fatalf("gateway cannot place sleep on its workers: %v\nstderr:\n%s", err, a.stderr)
	}

	const n, killAfter = 200, 40
	results, killed, stderr := batchKillingAWorker(t, bin, a.api, workers, n, killAfter, "50ms")
	var failed []string
	failedOver := 0
	for _, r := range results {
		if r.Status != "ok" {
			failed = append(failed, fmt.Sprintf("line %d: %s: %s", r.Line, r.Status, r.Error))
		}
		if len(r.Attempts) > 1 && r.Attempts[0].Peer == killed {
			failedOver++
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d requests failed after a worker was killed:\n%s\nbatch stderr %s", len(failed), n, strings.Join(failed, "\n"), stderr)
	}
	if failedOver == 0 {
		t.Errorf("no request tried the killed worker and then another: the kill did not land mid-batch")
	}
	t.Logf("%d requests, all ok; %d failed over from the killed worker; %s", n, failedOver, strings.TrimSpace(stderr))
}

// killLine is one result line of a batch run by batchKillingAWorker.
type killLine struct {
	Line int `json:"line"`
	cliResponse
}

// batchKillingAWorker runs a batch of n sleeps of payload at 8 at once
// through the node at api with `workmesh submit --file`, and kills with
// SIGKILL the worker (one of workers, by peer ID) that served the
// killAfter-th result, while the batch goes on. It returns every result,
// the killed worker's peer ID and the batch's stderr, and fails the test
// unless every line has its result and the batch exited 0.
func batchKillingAWorker(t *testing.T, bin, api string, workers map[string]*nodeProcess, n, killAfter int, payload string) ([]killLine, string, string) {
	t.Helper()
	var in bytes.Buffer
	for range n {
		fmt.Fprintf(&in, `{"type": "sleep", "payload": %q}`+"\n", payload)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "submit", "--api", api, "--file", "-", "--concurrency", "8", "--progress", "off")
	cmd.Env = cliEnv(t, nil)
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var results []killLine
	var killed string
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l killLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("result line %q: %v", sc.Text(), err)
		}
		results = append(results, l)
		if len(results) == killAfter {
			// Kill the worker that served the latest result: it has work
			// in flight now.
			killed = l.Worker
			p := workers[killed]
			if p == nil {
				t.Fatalf("result %d served by %q, want one of the workers", len(results), killed)
			}
			if err := p.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
		}
	}
	err = cmd.Wait()
	if len(results) != n {
		t.Fatalf("%d results, want %d (%v)\nstderr %s", len(results), n, err, stderr.String())
	}
	if err != nil {
		var failed []string
		for _, r := range results {
			if r.Status != "ok" && len(failed) < 10 {
				failed = append(failed, fmt.Sprintf("line %d: %s: %s", r.Line, r.Status, r.Error))
			}
		}
		t.Fatalf("batch: %v after the worker %s was killed:\n%s\nstderr %s", err, killed, strings.Join(failed, "\n"), stderr.String())
	}
	return results, killed, stderr.String()
}
