package tests

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// buildBinary builds cmd/workmesh into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not found; cannot build the binary")
	}
	bin := filepath.Join(t.TempDir(), "workmesh")
	cmd := exec.Command(goTool, "build", "-o", bin, "github.com/workmesh/workmesh/cmd/workmesh")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// nodeProcess is a running `workmesh node start`.
type nodeProcess struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	peerID string
	join   string // the bootstrap address from the "join with:" line
	api    string
	done   chan error
	// exited is closed once the process has been waited for (done has
	// its error): what cleanup checks, as ProcessState is Wait's to write.
	exited chan struct{}
}

// startNodeProcess starts the binary and waits for its "ready" line,
// collecting the peer ID, join line and API address it printed.
func startNodeProcess(t *testing.T, bin string, args ...string) *nodeProcess {
	t.Helper()
	p, err := launchNode(t, bin, "node", "debug", 15*time.Second, args...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// launchNode starts `workmesh node start` (on loopback, logging at
// logLevel, with args added) and waits up to wait for its "ready" line,
// collecting the peer ID, join line and API address it printed. It returns
// an error rather than failing the test, so that several nodes can be
// started at once; name is for the error. The process is killed when the
// test ends, if it still runs.
func launchNode(t *testing.T, bin, name, logLevel string, wait time.Duration, args ...string) (*nodeProcess, error) {
	args = append([]string{"node", "start", "--listen", loopbackQUIC, "--api", "127.0.0.1:0",
		"--data-dir", t.TempDir(), "--log-level", logLevel}, args...)
	p := &nodeProcess{cmd: exec.Command(bin, args...), stderr: &syncBuffer{}, done: make(chan error, 1), exited: make(chan struct{})}
	p.cmd.Env = cliEnv(t, nil)
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		err := p.cmd.Wait()
		close(p.exited)
		p.done <- err
	}()
	deadline := time.After(wait)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				return nil, fmt.Errorf("%s exited before ready; stderr:\n%s", name, p.stderr)
			}
			switch {
			case strings.HasPrefix(line, "peer id: "):
				p.peerID = strings.TrimPrefix(line, "peer id: ")
			case strings.HasPrefix(line, "join with: "):
				i := strings.Index(line, "--bootstrap ")
				if i < 0 {
					return nil, fmt.Errorf("%s: join line without --bootstrap: %q", name, line)
				}
				p.join = strings.TrimSpace(line[i+len("--bootstrap "):])
			case strings.HasPrefix(line, "api: "):
				p.api = strings.TrimPrefix(line, "api: ")
			case line == "ready":
				if p.peerID == "" || p.join == "" || p.api == "" {
					return nil, fmt.Errorf("%s ready before peer id, join line and api address (%+v)", name, p)
				}
				go func() {
					for range lines {
					}
				}()
				return p, nil
			}
		case <-deadline:
			return nil, fmt.Errorf("%s not ready within %s; stderr:\n%s", name, wait, p.stderr)
		}
	}
}

// awaitListed waits, within 10 seconds, until `workmesh peers` on gw lists
// every one of peers, and fails the test with gw's log otherwise.
func awaitListed(t *testing.T, bin string, gw *nodeProcess, peers ...*nodeProcess) {
	t.Helper()
	if _, err := testkit.Poll(10*time.Second, func() error {
		ids, err := peersOf(t, bin, gw.api)
		if err != nil {
			return err
		}
		for _, p := range peers {
			if !slices.Contains(ids, p.peerID) {
				return fmt.Errorf("%s not among %v", p.peerID, ids)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("the gateway does not list its peers: %v\nstderr:\n%s", err, gw.stderr)
	}
}

// peersOf runs `workmesh peers --output json` against a node's API and
// returns the peer IDs it lists, sorted.
func peersOf(t *testing.T, bin, api string) ([]string, error) {
	m, err := workTypesOf(t, bin, api)
	if err != nil {
		return nil, err
	}
	ids := slices.Sorted(maps.Keys(m))
	return ids, nil
}

// TestNetworkBinary builds the binary once and runs it as a user would.
func TestNetworkBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	t.Run("two nodes join and list each other", func(t *testing.T) { testBinaryTwoNodes(t, bin) })
	t.Run("bad bootstrap address", func(t *testing.T) { testBinaryBadBootstrap(t, bin) })
}

// testBinaryTwoNodes starts a first node, a second one joined with the line
// the first printed, checks `workmesh peers` on each shows the other, then
// sends SIGTERM and expects a clean exit.
func testBinaryTwoNodes(t *testing.T, bin string) {
	first := startNodeProcess(t, bin, "--work-types", "echo")
	second := startNodeProcess(t, bin, "--work-types", "sha256", "--labels", "zone-b", "--bootstrap", first.join)

	deadline := time.Now().Add(10 * time.Second) // for both
	for _, pair := range []struct{ self, other *nodeProcess }{{first, second}, {second, first}} {
		if _, err := testkit.Poll(time.Until(deadline), func() error {
			ids, err := peersOf(t, bin, pair.self.api)
			if err == nil && len(ids) == 1 && ids[0] == pair.other.peerID {
				return nil
			}
			return fmt.Errorf("%v %v", ids, err)
		}); err != nil {
			t.Fatalf("node %s does not list %s: %v\nstderr:\n%s", pair.self.peerID, pair.other.peerID, err, pair.self.stderr)
		}
	}

	for _, p := range []*nodeProcess{first, second} {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*nodeProcess{first, second} {
		select {
		case err := <-p.done:
			if err != nil {
				t.Errorf("node %s exited with %v after SIGTERM; stderr:\n%s", p.peerID, err, p.stderr)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("node %s still running 5s after SIGTERM", p.peerID)
		}
	}
}

// testBinaryBadBootstrap checks that a bootstrap address that does not
// parse is refused with an error naming it and exit code 2.
func testBinaryBadBootstrap(t *testing.T, bin string) {
	for _, bad := range []string{
		"/ip4/127.0.0.1/udp/4001/quic-v1", // no /p2p/<id>
		"/ip4/300.0.0.1/udp/1/quic-v1/p2p/12D3KooWQCLYgTws4HRovXJ3H3YmiCseQNiGcBNeqdS1WC1xARKt", // bad IP
		"/ip4/127.0.0.1/udp/1/quic-v1/p2p/not-a-peer-id",
	} {
		cmd := exec.Command(bin, "node", "start", "--listen", loopbackQUIC, "--api", "127.0.0.1:0",
			"--data-dir", t.TempDir(), "--bootstrap", bad)
		cmd.Env = cliEnv(t, nil)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		cmd.Stdout = io.Discard
		err := cmd.Run()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 {
			t.Errorf("--bootstrap %s: %v, want exit code 2; stderr: %s", bad, err, stderr.String())
			continue
		}
		if !strings.Contains(stderr.String(), bad) {
			t.Errorf("--bootstrap %s: error does not name the address: %s", bad, stderr.String())
		}
	}
}
