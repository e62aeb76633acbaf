package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCLIDevnet runs `workmesh devnet` as a user would: the scripted demo,
// and a devnet driven from outside (submit, stop a worker, SIGTERM).
func TestCLIDevnet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	t.Run("demo", func(t *testing.T) { testDevnetDemo(t, bin) })
	t.Run("driven from outside", func(t *testing.T) { testDevnetDriven(t, bin) })
	t.Run("bad --nodes", func(t *testing.T) {
		if r := runCLI(t, bin, nil, "devnet", "--nodes", "1", "--api", "127.0.0.1:0"); r.code != 2 || !strings.Contains(r.stderr, "--nodes") {
			t.Errorf("exit code %d, stderr %q; want 2 naming --nodes", r.code, r.stderr)
		}
	})
}

// testDevnetDemo runs the tour and checks it shows what it promises: the
// remote worker of each sample, the exit codes of failures, the failover
// past the stopped worker and its ejection by liveness.
func testDevnetDemo(t *testing.T, bin string) {
	start := time.Now()
	r := runCLI(t, bin, nil, "devnet", "--demo", "--api", "127.0.0.1:0")
	if r.code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("demo took %s", time.Since(start).Round(time.Millisecond))
	for _, want := range []string{
		"ready",
		helloSHA256,
		"ok by node1",                    // the full group first
		"(exit code 3)",                  // the timeout
		"(exit code 2)",                  // the unknown type
		"node2 success",                  // the failover to the archive group
		"node0 marked node1 unreachable", // liveness
		"stopping the devnet",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("demo output lacks %q:\n%s", want, r.stdout)
		}
	}
	failover := strings.Index(r.stdout, "3. Failover")
	if failover < 0 || !strings.Contains(r.stdout[failover:], "2 attempts: node1 ") {
		t.Errorf("the failover does not show the stopped worker's attempt first:\n%s", r.stdout)
	}
	if dir := dataDirOf(r.stdout); dir == "" {
		t.Errorf("no data line in:\n%s", r.stdout)
	} else if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("data dir %s left behind (stat: %v)", dir, err)
	}
}

// dataDirOf returns the directory of the "data: DIR (removed on exit)" line.
func dataDirOf(out string) string {
	for line := range strings.Lines(out) {
		if rest, ok := strings.CutPrefix(line, "data: "); ok {
			return strings.TrimSuffix(strings.TrimSpace(rest), " (removed on exit)")
		}
	}
	return ""
}

// testDevnetDriven starts a three-node devnet, submits through its API,
// stops a worker through the control endpoint, and stops the devnet with
// SIGTERM.
func testDevnetDriven(t *testing.T, bin string) {
	cmd := exec.Command(bin, "devnet", "--nodes", "3", "--api", "127.0.0.1:0")
	cmd.Env = cliEnv(t, nil)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	api, dir := make(chan string, 1), make(chan string, 1)
	ready, exited := make(chan struct{}), make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "api: "):
				api <- strings.TrimPrefix(line, "api: ")
			case strings.HasPrefix(line, "data: "):
				dir <- dataDirOf(line)
			case line == "ready":
				close(ready)
			}
		}
		err := cmd.Wait()
		close(exited)
		done <- err
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("devnet exited before ready: %v\nstderr:\n%s", err, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("devnet not ready within 30s\nstderr:\n%s", stderr.String())
	}
	addr, dataDir := <-api, <-dir

	r := runCLI(t, bin, nil, "submit", "--api", addr, "--type", "sha256", "--payload", "hello", "--output", "json")
	if r.code != 0 {
		t.Fatalf("submit: exit code %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	first := decodeResponse(t, r)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/devnet/stop?peer="+first.Worker, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var stopped map[string]string
	json.NewDecoder(resp.Body).Decode(&stopped)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || stopped["peer"] != first.Worker {
		t.Fatalf("stop %s: %s %v", first.Worker, resp.Status, stopped)
	}

	r = runCLI(t, bin, nil, "submit", "--api", addr, "--type", "sha256", "--payload", "hello", "--output", "json")
	if r.code != 0 {
		t.Fatalf("submit after the stop: exit code %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	if second := decodeResponse(t, r); second.Worker == first.Worker || second.Result == nil || *second.Result != helloSHA256 {
		t.Errorf("after stopping %s: %+v", first.Worker, second)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("devnet exited with %v after SIGTERM\nstderr:\n%s", err, stderr.String())
		}
	case <-time.After(6 * time.Second):
		t.Fatalf("devnet still running 6s after SIGTERM")
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("data dir %s left behind (stat: %v)", dataDir, err)
	}
}
