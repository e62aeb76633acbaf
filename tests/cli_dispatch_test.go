package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// helloSHA256 is the hex SHA-256 of "hello".
const helloSHA256 = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"

// cliRun is one finished run of the binary.
type cliRun struct {
	code           int
	stdout, stderr string
}

// runCLI runs the binary with args and stdin, within 30 seconds, in the
// environment cliEnv gives.
func runCLI(t *testing.T, bin string, stdin []byte, args ...string) cliRun {
	t.Helper()
	return runCLIIn(t, bin, cliEnv(t, nil), stdin, args...)
}

// runCLIEnv is runCLI with env added to the environment.
func runCLIEnv(t *testing.T, bin string, env []string, args ...string) cliRun {
	t.Helper()
	return runCLIIn(t, bin, cliEnv(t, env), nil, args...)
}

// runCLIIn runs the binary in the environment env, failing the test when
// it cannot be run at all.
func runCLIIn(t *testing.T, bin string, env []string, stdin []byte, args ...string) cliRun {
	t.Helper()
	r, err := execCLI(bin, env, stdin, args...)
	if err != nil {
		t.Fatalf("workmesh %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// execCLI runs the binary with args and stdin in the environment env,
// within 30 seconds; an error means it could not be run.
func execCLI(bin string, env []string, stdin []byte, args ...string) (cliRun, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	r := cliRun{stdout: stdout.String(), stderr: stderr.String()}
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		r.code = ee.ExitCode()
		return r, nil
	}
	return r, err
}

// cliEnv is this process's environment without WORKMESH_* variables (the
// binary refuses those that are not its own, and the tests' settings are
// not the node's), with HOME in a temporary directory and env added.
func cliEnv(t *testing.T, env []string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WORKMESH_") && !strings.HasPrefix(kv, "HOME=") {
			out = append(out, kv)
		}
	}
	return append(append(out, "HOME="+t.TempDir()), env...)
}

// cliAttempt and cliResponse are the parts of the API's JSON answer the
// tests read (decoded independently of workers, as a client would).
type cliAttempt struct {
	Peer    string `json:"peer"`
	Outcome string `json:"outcome"`
	Error   string `json:"error"`
}

type cliResponse struct {
	Status    string       `json:"status"`
	Result    *string      `json:"result"`
	ResultB64 []byte       `json:"result_b64"`
	Worker    string       `json:"worker"`
	Attempts  []cliAttempt `json:"attempts"`
	Error     string       `json:"error"`
}

func decodeResponse(t *testing.T, r cliRun) cliResponse {
	t.Helper()
	var resp cliResponse
	if err := json.Unmarshal([]byte(r.stdout), &resp); err != nil {
		t.Fatalf("decode the JSON output %q: %v (stderr %s)", r.stdout, err, r.stderr)
	}
	return resp
}

// freeLoopbackAddr returns a loopback address nothing listens on.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestCLIDispatch builds the binary, starts three nodes and submits work
// with `workmesh submit` as a user would: gateway A serves only echo and
// sleep, so sha256 must go to B or C. It checks results, workers, exit
// codes, and the failover after the serving worker is killed with SIGKILL.
func TestCLIDispatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	// Two remote workers per request, so that a dead first choice is
	// followed by the other remote one rather than the local worker
	// (which does not serve sha256 anyway).
	a := startNodeProcess(t, bin, "--work-types", "echo,sleep", "--max-remote-workers", "2")
	b := startNodeProcess(t, bin, "--work-types", "sha256", "--bootstrap", a.join)
	c := startNodeProcess(t, bin, "--work-types", "sha256", "--bootstrap", a.join)
	workers := map[string]*nodeProcess{b.peerID: b, c.peerID: c}

	awaitListed(t, bin, a, b, c)
	submit := func(stdin []byte, args ...string) cliRun {
		return runCLI(t, bin, stdin, append([]string{"submit", "--api", a.api}, args...)...)
	}

	var served string
	t.Run("sha256 goes to a remote worker", func(t *testing.T) {
		// The gateway lists its peers a moment before its dispatcher has
		// taken them in; only that first moment may answer unavailable
		// (exit code 2). What the last try answered is checked below.
		var r cliRun
		testkit.Poll(2*time.Second, func() error {
			if r = submit(nil, "--type", "sha256", "--payload", "hello", "--output", "json"); r.code == 2 {
				return errors.New("unavailable")
			}
			return nil
		})
		if r.code != 0 {
			t.Fatalf("exit code %d, want 0\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
		}
		resp := decodeResponse(t, r)
		if resp.Status != "ok" || resp.Result == nil || *resp.Result != helloSHA256 {
			t.Fatalf("got %+v, want status ok and result %s", resp, helloSHA256)
		}
		if workers[resp.Worker] == nil {
			t.Fatalf("worker %q, want B %s or C %s", resp.Worker, b.peerID, c.peerID)
		}
		last := resp.Attempts[len(resp.Attempts)-1]
		if last.Peer != resp.Worker || last.Outcome != "success" {
			t.Errorf("last attempt %+v, want a success on %s", last, resp.Worker)
		}
		served = resp.Worker
	})

	t.Run("text output", func(t *testing.T) {
		r := submit(nil, "--type", "sha256", "--payload", "hello")
		if r.code != 0 || r.stdout != helloSHA256+"\n" {
			t.Fatalf("exit code %d, stdout %q; want 0 and the digest\nstderr %s", r.code, r.stdout, r.stderr)
		}
		if !strings.HasPrefix(r.stderr, "ok by ") || !strings.Contains(r.stderr, "success") {
			t.Errorf("summary line %q, want it to say ok, the worker and the attempt", r.stderr)
		}
	})

	t.Run("bytes on stdin run on the local worker", func(t *testing.T) {
		payload := []byte{0xff, 0x00, 0xfe}
		r := submit(payload, "--type", "echo", "--output", "json")
		if r.code != 0 {
			t.Fatalf("exit code %d\nstderr %s", r.code, r.stderr)
		}
		resp := decodeResponse(t, r)
		if resp.Worker != "local" || !bytes.Equal(resp.ResultB64, payload) {
			t.Errorf("got %+v, want the payload back as result_b64 from the local worker", resp)
		}
	})

	t.Run("no --type is a usage error", func(t *testing.T) {
		r := submit(nil, "--payload", "hello")
		if r.code != 2 || !strings.Contains(r.stderr, "--type") {
			t.Errorf("exit code %d, stderr %q; want 2 naming --type", r.code, r.stderr)
		}
	})

	t.Run("unknown work type is unavailable", func(t *testing.T) {
		r := submit(nil, "--type", "nosuch", "--payload", "x")
		if r.code != 2 {
			t.Fatalf("exit code %d, want 2\nstderr %s", r.code, r.stderr)
		}
		for _, want := range []string{"unavailable", "no worker could take the work", "nosuch"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("stderr %q does not say %q", r.stderr, want)
			}
		}
	})

	t.Run("bad request refused by the API", func(t *testing.T) {
		r := submit(nil, "--type", "bad type", "--payload", "x")
		if r.code != 2 || !strings.Contains(r.stderr, "type: ") {
			t.Errorf("exit code %d, stderr %q; want 2 naming the field", r.code, r.stderr)
		}
	})

	t.Run("timeout exits 3", func(t *testing.T) {
		start := time.Now()
		r := submit(nil, "--type", "sleep", "--payload", "5s", "--timeout", "300ms", "--output", "json")
		if r.code != 3 {
			t.Fatalf("exit code %d, want 3\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
		}
		if resp := decodeResponse(t, r); resp.Status != "timeout" {
			t.Errorf("status %q, want timeout", resp.Status)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("a 300ms timeout took %s", d)
		}
	})

	t.Run("API unreachable", func(t *testing.T) {
		addr := freeLoopbackAddr(t)
		r := runCLI(t, bin, nil, "submit", "--api", addr, "--type", "echo", "--payload", "x")
		if r.code != 2 || !strings.Contains(r.stderr, addr) {
			t.Errorf("exit code %d, stderr %q; want 2 naming %s", r.code, r.stderr, addr)
		}
	})

	t.Run("failover after kill -9", func(t *testing.T) {
		if served == "" {
			t.Skip("no worker served sha256")
		}
		dead := workers[served]
		if err := dead.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-dead.done
		var other string
		for id := range workers {
			if id != served {
				other = id
			}
		}
		r := submit(nil, "--type", "sha256", "--payload", "hello", "--output", "json")
		if r.code != 0 {
			t.Fatalf("exit code %d, want 0\nstdout %s\nstderr %s\ngateway stderr:\n%s", r.code, r.stdout, r.stderr, a.stderr)
		}
		resp := decodeResponse(t, r)
		if resp.Worker != other || resp.Result == nil || *resp.Result != helloSHA256 {
			t.Fatalf("got %+v, want %s from the surviving worker %s", resp, helloSHA256, other)
		}
		for _, at := range resp.Attempts {
			if at.Peer == served && at.Outcome == "success" {
				t.Errorf("the killed worker succeeded: %+v", at)
			}
		}
		t.Logf("attempts after killing %s: %+v", served, resp.Attempts)
	})
}
