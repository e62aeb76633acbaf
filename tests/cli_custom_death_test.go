package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// A node killed with SIGKILL while a command of its runs takes the
// command with it: the program does not live on, orphaned.
func TestCLI_CommandDiesWithItsNode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	cfg := writeConfig(t, fmt.Sprintf("work-types: [hang]\ncustom-types:\n  hang:\n    command: [/bin/sh, -c, 'echo $$ > %s; exec sleep 1000']\n", pidFile))
	n := startNodeProcess(t, bin, "--config", cfg)
	submitted := make(chan cliRun, 1)
	go func() {
		r, _ := execCLI(bin, cliEnv(t, nil), nil, "submit", "--api", n.api, "--type", "hang", "--payload", "x", "--timeout", "20s")
		submitted <- r
	}()
	var pid int
	testkit.WaitFor(t, 10*time.Second, "the command running", func() error {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return err
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // should it have survived
	if err := n.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-n.done
	testkit.WaitFor(t, 5*time.Second, "the command gone with its node", func() error {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil // gone, and reaped
		}
		// "pid (comm) state ...": a zombie is dead, waiting for init.
		if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return nil
		}
		return fmt.Errorf("process %d still runs: %s", pid, stat)
	})
	<-submitted
}
