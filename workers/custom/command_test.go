package custom

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
)

func newCommand(t *testing.T, c config.CustomTypeConfig) *Command {
	t.Helper()
	cmd, err := NewCommand("t", c, Options{MaxOutput: workers.DefaultMaxPayload})
	if err != nil {
		t.Fatal(err)
	}
	return cmd
}

func TestCommandUpperNoShell(t *testing.T) {
	dir := t.TempDir()
	c := newCommand(t, config.CustomTypeConfig{Command: []string{"tr", "a-z", "A-Z"}, Dir: dir})
	payload := "$(touch MARKER); touch MARKER2 `touch MARKER3`"
	r := c.Do(context.Background(), []byte(payload))
	if r.Outcome != workers.Success || string(r.Output) != strings.ToUpper(payload) {
		t.Fatalf("result %v %q %q, want the payload upper-cased", r.Outcome, r.Output, r.Error)
	}
	for _, m := range []string{"MARKER", "MARKER2", "MARKER3", "marker", "marker2"} {
		if _, err := os.Stat(filepath.Join(dir, m)); err == nil {
			t.Fatalf("%s was created: the payload ran as a command", m)
		}
	}
}

func TestCommandCleanEnvironment(t *testing.T) {
	c := newCommand(t, config.CustomTypeConfig{Command: []string{"env"}, Env: map[string]string{"GREETING": "hi"}})
	t.Setenv("WORKMESH_SECRET_OF_NODE", "x")
	r := c.Do(context.Background(), nil)
	if r.Outcome != workers.Success || string(r.Output) != "GREETING=hi\n" {
		t.Fatalf("env printed %q (%v %s), want only GREETING=hi", r.Output, r.Outcome, r.Error)
	}
}

func TestCommandExitCodes(t *testing.T) {
	c := newCommand(t, config.CustomTypeConfig{Command: []string{"sh", "-c", `cat >/dev/null; echo "first" >&2; echo "why: $1" >&2; exit "$1"`, "sh", "3"}})
	r := c.Do(context.Background(), []byte("x"))
	if r.Outcome != workers.PermanentError || workers.DetailOf(r) == nil || !workers.DetailOf(r).HasExitCode || workers.DetailOf(r).ExitCode != 3 ||
		workers.DetailOf(r).Stderr != "first\nwhy: 3" || !strings.Contains(r.Error, "exited with code 3: why: 3") {
		t.Fatalf("exit 3: %v %q %+v", r.Outcome, r.Error, workers.DetailOf(r))
	}
	c = newCommand(t, config.CustomTypeConfig{Command: []string{"sh", "-c", "exit 75"}})
	if r := c.Do(context.Background(), nil); r.Outcome != workers.RetryableError || workers.DetailOf(r) == nil || workers.DetailOf(r).ExitCode != 75 {
		t.Fatalf("exit 75: %v %q %+v, want a retryable error", r.Outcome, r.Error, workers.DetailOf(r))
	}
	c = newCommand(t, config.CustomTypeConfig{Command: []string{"sh", "-c", "exit 9"}, RetryableExitCode: 9})
	if r := c.Do(context.Background(), nil); r.Outcome != workers.RetryableError {
		t.Fatalf("exit 9 configured retryable: %v %q", r.Outcome, r.Error)
	}
}

func TestCommandStderrBounded(t *testing.T) {
	c := newCommand(t, config.CustomTypeConfig{Command: []string{"sh", "-c", `i=0; while [ $i -lt 3000 ]; do echo "line $i of a long complaint" >&2; i=$((i+1)); done; exit 1`}})
	r := c.Do(context.Background(), nil)
	if workers.DetailOf(r) == nil || len(workers.DetailOf(r).Stderr) > workers.MaxDetailText || strings.Count(workers.DetailOf(r).Stderr, "\n") >= stderrLines ||
		!strings.HasSuffix(workers.DetailOf(r).Stderr, "line 2999 of a long complaint") {
		t.Fatalf("stderr detail %+v, want the last lines within the bound", workers.DetailOf(r))
	}
}

func TestCommandOutputOverBoundFails(t *testing.T) {
	c := newCommand(t, config.CustomTypeConfig{Command: []string{"yes"}, MaxOutput: 1000})
	r := c.Do(context.Background(), nil)
	if r.Outcome != workers.PermanentError || !strings.Contains(r.Error, "longer than max-output 1000 bytes") || workers.DetailOf(r) == nil {
		t.Fatalf("endless output: %v %q (%d bytes), want a clear failure", r.Outcome, r.Error, len(r.Output))
	}
	c = newCommand(t, config.CustomTypeConfig{Command: []string{"head", "-c", "1000", "/dev/zero"}, MaxOutput: 1000})
	if r := c.Do(context.Background(), nil); r.Outcome != workers.Success || len(r.Output) != 1000 {
		t.Fatalf("output at the bound: %v %q %d bytes", r.Outcome, r.Error, len(r.Output))
	}
}

// gone reports nil once pid names no process at all, not even a zombie.
func gone(pid int) func() error {
	return func() error {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil
		}
		return fmt.Errorf("process %d still there: %s", pid, strings.TrimSpace(string(b)))
	}
}

// forkingSleeper is a command that forks a sleeping child, writes both
// pids to a file and sleeps itself.
func forkingSleeper(pidFile string, exitAtOnce bool) []string {
	tail := "sleep 300"
	if exitAtOnce {
		tail = "exit 0"
	}
	return []string{"/bin/sh", "-c", `sleep 300 & echo "$$ $!" > "$1"; ` + tail, "sh", pidFile}
}

func readPids(t *testing.T, file string) []int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		p, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, p)
	}
	if len(pids) != 2 {
		t.Fatalf("pid file %q", b)
	}
	return pids
}

func TestCommandKilledAtDeadlineLeavesNoProcess(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pids")
	c := newCommand(t, config.CustomTypeConfig{Command: forkingSleeper(pidFile, false), Timeout: 300 * time.Millisecond})
	start := time.Now()
	r := c.Do(context.Background(), nil)
	if r.Outcome != workers.RetryableError || !strings.Contains(r.Error, "deadline passed") {
		t.Fatalf("hanging command: %v %q", r.Outcome, r.Error)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Do took %s", took)
	}
	for _, pid := range readPids(t, pidFile) {
		testkit.WaitFor(t, 5*time.Second, fmt.Sprintf("process %d gone", pid), gone(pid))
	}
}

func TestCommandCancelledLeavesNoProcess(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pids")
	c := newCommand(t, config.CustomTypeConfig{Command: forkingSleeper(pidFile, false)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan workers.Result, 1)
	go func() { done <- c.Do(ctx, nil) }()
	testkit.WaitFor(t, 5*time.Second, "pid file written", func() error {
		b, err := os.ReadFile(pidFile)
		if err != nil || len(strings.Fields(string(b))) < 2 {
			return fmt.Errorf("pid file %q: %v", b, err)
		}
		return nil
	})
	cancel()
	r := <-done
	if r.Outcome != workers.RetryableError || !strings.Contains(r.Error, "cancelled") {
		t.Fatalf("cancelled command: %v %q", r.Outcome, r.Error)
	}
	for _, pid := range readPids(t, pidFile) {
		testkit.WaitFor(t, 5*time.Second, fmt.Sprintf("process %d gone", pid), gone(pid))
	}
}

func TestCommandBackgroundChildDoesNotOutliveRun(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pids")
	c := newCommand(t, config.CustomTypeConfig{Command: forkingSleeper(pidFile, true)})
	if r := c.Do(context.Background(), nil); r.Outcome != workers.Success {
		t.Fatalf("%v %q", r.Outcome, r.Error)
	}
	for _, pid := range readPids(t, pidFile) {
		testkit.WaitFor(t, 5*time.Second, fmt.Sprintf("process %d gone", pid), gone(pid))
	}
}

func TestCommandConcurrencyBusy(t *testing.T) {
	// The first run lasts until it is cancelled (cat of an empty payload
	// would end at once, and its slot with it, before the check below).
	c := newCommand(t, config.CustomTypeConfig{Command: []string{"sleep", "60"}, Concurrency: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); c.Do(ctx, nil) }()
	testkit.WaitFor(t, 5*time.Second, "the first run holds its slot", func() error {
		if len(c.slots) != 1 {
			return fmt.Errorf("slots taken: %d", len(c.slots))
		}
		return nil
	})
	if r := c.Do(context.Background(), []byte("x")); r.Outcome != workers.Busy {
		t.Fatalf("second run with concurrency 1: %v %q, want busy", r.Outcome, r.Error)
	}
	cancel()
	<-done
}

func TestCommandMissingProgram(t *testing.T) {
	if _, err := NewCommand("t", config.CustomTypeConfig{Command: []string{"no-such-program-workmesh"}}, Options{}); err == nil {
		t.Fatal("a program that is not in PATH was accepted")
	}
}

// A program removed after the start is this worker's fault, not the
// work's: a run answers unsupported (the dispatcher goes on to another
// worker), the type reports itself out (the node withdraws it) and the
// node is told at once; put back, the type is healthy again.
func TestCommandProgramRemovedTakesTheTypeOut(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "enrich.sh")
	write := func() {
		if err := os.WriteFile(prog, []byte("#!/bin/sh\ncat\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write()
	c := newCommand(t, config.CustomTypeConfig{Command: []string{prog}})
	told := make(chan struct{}, 1)
	c.OnHealthChange(func() { told <- struct{}{} })
	if r := c.Do(context.Background(), []byte("x")); r.Outcome != workers.Success || c.TypeHealth() != nil {
		t.Fatalf("with the program there: %v %q, health %v", r.Outcome, r.Error, c.TypeHealth())
	}
	if err := os.Remove(prog); err != nil {
		t.Fatal(err)
	}
	r := c.Do(context.Background(), []byte("x"))
	if r.Outcome != workers.Unsupported || !strings.Contains(r.Error, "out on this worker") || !strings.Contains(r.Error, prog) {
		t.Fatalf("with the program gone: %v %q, want unsupported naming it", r.Outcome, r.Error)
	}
	if c.TypeHealth() == nil {
		t.Fatal("the type reports itself healthy with its program gone")
	}
	select {
	case <-told:
	default:
		t.Fatal("the node was not told the type's health changed")
	}
	write()
	if err := c.TypeHealth(); err != nil {
		t.Fatalf("the program is back: health %v", err)
	}
}

// A run killed because the node is stopping says so, not that its
// request was cancelled.
func TestCommandKilledSaysWhy(t *testing.T) {
	c := newCommand(t, config.CustomTypeConfig{Command: []string{"sleep", "10"}})
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan workers.Result, 1)
	go func() { done <- c.Do(ctx, nil) }()
	cancel(errors.New("local worker closed"))
	if r := <-done; r.Outcome != workers.RetryableError || !strings.Contains(r.Error, "killed after") || !strings.Contains(r.Error, ": local worker closed") {
		t.Fatalf("run killed as the node stops: %v %q, want it to say why", r.Outcome, r.Error)
	}
}
