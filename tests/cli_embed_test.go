package tests

import (
	"bufio"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// TestEmbedExample builds cmd/workmesh-embed-example, a Go program that
// starts a node with a handler of its own ("reverse") through
// workers/stack, runs it against a real workmesh node, and submits work
// to it through that node: the result is the payload reversed, produced
// by the embedding program. SIGTERM stops it cleanly.
func TestEmbedExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	bin := buildBinary(t)
	example := filepath.Join(t.TempDir(), "workmesh-embed-example")
	if out, err := exec.Command("go", "build", "-o", example, "github.com/workmesh/workmesh/cmd/workmesh-embed-example").CombinedOutput(); err != nil {
		t.Fatalf("go build the example: %v\n%s", err, out)
	}
	g := startNodeProcess(t, bin, "--work-types", "echo")

	cmd := exec.Command(example, "--bootstrap", g.join, "--data-dir", t.TempDir())
	cmd.Env = cliEnv(t, nil)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done, exited := make(chan error, 1), make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		err := cmd.Wait()
		close(exited)
		done <- err
	}()
	var peerID string
	timeout := time.After(15 * time.Second)
	for ready := false; !ready; {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("the example exited before ready; stderr:\n%s", stderr)
			}
			if id, found := strings.CutPrefix(line, "peer id: "); found {
				peerID = id
			}
			ready = line == "ready"
		case <-timeout:
			t.Fatalf("the example not ready within 15s; stderr:\n%s", stderr)
		}
	}
	go func() {
		for range lines {
		}
	}()

	var r cliRun
	var resp cliResponse
	testkit.WaitFor(t, 15*time.Second, "the node dispatches reverse to the embedding program", func() error {
		r = runCLI(t, bin, nil, "submit", "--api", g.api, "--type", "reverse", "--payload", "stressed", "--output", "json")
		if r.code != 0 {
			return fmt.Errorf("exit %d: %s %s", r.code, r.stdout, r.stderr)
		}
		resp = decodeResponse(t, r)
		return nil
	})
	if resp.Result == nil || *resp.Result != "desserts" || resp.Worker != peerID {
		t.Fatalf("reverse: %+v, want desserts from the example %s", resp, peerID)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the example after SIGTERM: %v; stderr:\n%s", err, stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the example did not stop within 20s of SIGTERM")
	}
}
