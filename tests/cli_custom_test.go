package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// customResponse is the API's answer with the detail of a failed custom run.
type customResponse struct {
	cliResponse
	ExitCode   *int   `json:"exit_code"`
	Stderr     string `json:"stderr"`
	HTTPStatus int    `json:"http_status"`
	HTTPBody   string `json:"http_body"`
}

// writeCustomConfig writes a node's YAML settings file and returns its path.
func writeCustomConfig(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// workTypesOf returns the work types each peer advertises, as the node at
// api sees them (`workmesh peers --output json`).
func workTypesOf(t *testing.T, bin, api string) (map[string][]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "peers", "--api", api, "--output", "json")
	cmd.Env = cliEnv(t, nil)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("workmesh peers: %w", err)
	}
	var peers []struct {
		ID        string   `json:"id"`
		WorkTypes []string `json:"work_types"`
	}
	if err := json.Unmarshal(out, &peers); err != nil {
		return nil, fmt.Errorf("decode %q: %w", out, err)
	}
	m := map[string][]string{}
	for _, p := range peers {
		m[p.ID] = p.WorkTypes
	}
	return m, nil
}

// awaitAdvertised waits until the gateway sees peer advertise workType
// (want) or not (!want).
func awaitAdvertised(t *testing.T, bin string, gw, peer *nodeProcess, workType string, want bool) {
	t.Helper()
	testkit.WaitFor(t, 15*time.Second, fmt.Sprintf("the gateway sees %s advertise %s: %v", peer.peerID, workType, want), func() error {
		m, err := workTypesOf(t, bin, gw.api)
		if err != nil {
			return err
		}
		types, listed := m[peer.peerID]
		if !listed {
			return fmt.Errorf("peer not listed (%v)", m)
		}
		if slices.Contains(types, workType) != want {
			return fmt.Errorf("it advertises %v", types)
		}
		return nil
	})
}

// processGone reports nil once pid names no process, not even a zombie.
func processGone(pid int) func() error {
	return func() error {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil
		}
		return fmt.Errorf("process %d still there: %s", pid, strings.TrimSpace(string(b)))
	}
}

// TestCustomWorkTypes runs a gateway and two workers as real processes
// from config files with custom-types blocks, and submits through the
// gateway as a user would:
//   - upper (tr a-z A-Z) runs remotely and returns the payload upper-cased;
//     a payload of shell syntax that would create marker files comes
//     back upper-cased, and no marker appears;
//   - a command that hangs (and forked a sleeping child) is killed at the
//     request's deadline, and neither process is left, not even a zombie;
//   - exit 75 on one worker fails over to the other;
//   - exit 3 fails with its exit code and stderr, in JSON and in text;
//   - enrich forwards to a local HTTP server the test runs; its 4xx comes
//     back with the status and body as fields;
//   - a failing health URL withdraws enrich from its worker, whose other
//     types keep serving, and a passing one brings it back.
func TestCustomWorkTypes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	var healthy atomic.Bool
	healthy.Store(true)
	var enrichHits atomic.Int64
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			if !healthy.Load() {
				http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			}
		case "/enrich":
			enrichHits.Add(1)
			body, _ := io.ReadAll(r.Body)
			if r.Header.Get("Authorization") != "Bearer s3cret" {
				http.Error(w, "no token", http.StatusUnauthorized)
				return
			}
			if string(body) == "bad" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnprocessableEntity)
				io.WriteString(w, `{"error":"cannot enrich \"bad\""}`)
				return
			}
			fmt.Fprintf(w, "enriched(%s)", body)
		default:
			http.NotFound(w, r)
		}
	}))
	defer svc.Close()

	dir := t.TempDir()
	pidA, pidB := filepath.Join(dir, "hang-a.pids"), filepath.Join(dir, "hang-b.pids")
	// Label balancing makes the order of the workers fixed: a first, b
	// after a's retryable errors.
	workerYAML := func(label, pidFile, flaky string, extra string) string {
		return fmt.Sprintf(`labels: [`+label+`]
drain-timeout: 500ms
work-types: [upper, hang, flaky%s]
custom-types:
  upper:
    command: ["tr", "a-z", "A-Z"]
    timeout: 5s
    idempotent: true
    deterministic: true
    dir: %q
  hang:
    command: ["/bin/sh", "-c", "sleep 300 & echo \"$$ $!\" > \"$1\"; wait", "sh", %q]
    timeout: 60s
  flaky:
    command: ["/bin/sh", "-c", %q]
%s`, extra, dir, pidFile, flaky, "")
	}
	aYAML := workerYAML("first", pidA, `cat >/dev/null; echo "try later" >&2; exit 75`, ", fail3, onlya, enrich") + fmt.Sprintf(`  fail3:
    command: ["/bin/sh", "-c", "echo \"reading input\" >&2; echo \"bad input: $(cat)\" >&2; exit 3"]
  onlya:
    command: ["cat"]
  enrich:
    url: %s/enrich
    headers: {Authorization: "Bearer s3cret"}
    health-url: %s/healthz
    health-interval: 100ms
`, svc.URL, svc.URL)
	bYAML := workerYAML("second", pidB, `tr a-z A-Z`, "")
	a := startNodeProcess(t, bin, "--config", writeCustomConfig(t, "a", aYAML))
	b := startNodeProcess(t, bin, "--config", writeCustomConfig(t, "b", bYAML), "--bootstrap", a.join)
	g := startNodeProcess(t, bin, "--work-types", "echo", "--bootstrap", a.join,
		"--label-balancing-order", "first,second", "--label-balancing-pass-on-error")
	awaitListed(t, bin, g, a, b)
	awaitAdvertised(t, bin, g, a, "enrich", true)
	awaitAdvertised(t, bin, g, b, "flaky", true)

	submit := func(workType, payload string, extra ...string) (cliRun, customResponse) {
		t.Helper()
		args := append([]string{"submit", "--api", g.api, "--type", workType, "--payload", payload, "--output", "json"}, extra...)
		r := runCLI(t, bin, nil, args...)
		var resp customResponse
		if err := json.Unmarshal([]byte(r.stdout), &resp); err != nil {
			t.Fatalf("%s: decode %q: %v (stderr %s)", workType, r.stdout, err, r.stderr)
		}
		return r, resp
	}
	// The gateway's dispatcher takes its peers in a moment after its table.
	testkit.Poll(5*time.Second, func() error {
		if r, _ := submit("upper", "warm up"); r.code == 2 {
			return errors.New("unavailable")
		}
		return nil
	})

	t.Run("upper runs remotely", func(t *testing.T) {
		r, resp := submit("upper", "hello, mesh")
		if r.code != 0 || resp.Result == nil || *resp.Result != "HELLO, MESH" || (resp.Worker != a.peerID && resp.Worker != b.peerID) {
			t.Fatalf("exit %d, %+v, want HELLO, MESH from a worker\nstderr %s", r.code, resp, r.stderr)
		}
	})

	t.Run("the payload is never a command line", func(t *testing.T) {
		m1, m2 := filepath.Join(dir, "MARKER"), filepath.Join(dir, "MARKER2")
		payload := fmt.Sprintf("$(touch %s); touch %s `touch %s`", m1, m2, m1)
		for range 4 { // both workers, most likely
			r, resp := submit("upper", payload)
			if r.code != 0 || resp.Result == nil || *resp.Result != strings.ToUpper(payload) {
				t.Fatalf("exit %d, %+v, want the payload upper-cased\nstderr %s", r.code, resp, r.stderr)
			}
		}
		for _, m := range []string{m1, m2, strings.ToUpper(m1), strings.ToUpper(m2)} {
			if _, err := os.Stat(m); err == nil {
				t.Fatalf("%s exists: the payload ran in a shell", m)
			}
		}
	})

	t.Run("a hanging command is killed at the deadline and leaves no process", func(t *testing.T) {
		start := time.Now()
		r, resp := submit("hang", "", "--timeout", "1500ms")
		if r.code == 0 || resp.Status == "ok" {
			t.Fatalf("a hanging command succeeded: exit %d, %+v", r.code, resp)
		}
		if took := time.Since(start); took > 20*time.Second {
			t.Fatalf("the request took %s with a 1.5s timeout", took)
		}
		var pids []int
		for _, f := range []string{pidA, pidB} {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			for _, field := range strings.Fields(string(b)) {
				if p, err := strconv.Atoi(field); err == nil {
					pids = append(pids, p)
				}
			}
		}
		if len(pids) < 2 {
			t.Fatalf("no pid file written: the command did not run (%+v)", resp)
		}
		for _, pid := range pids {
			testkit.WaitFor(t, 10*time.Second, fmt.Sprintf("process %d (the command or its child) gone", pid), processGone(pid))
		}
	})

	t.Run("exit 75 fails over to the other worker", func(t *testing.T) {
		r, resp := submit("flaky", "again")
		if r.code != 0 || resp.Worker != b.peerID || resp.Result == nil || *resp.Result != "AGAIN" {
			t.Fatalf("flaky: exit %d, %+v, want AGAIN from %s\nstderr %s", r.code, resp, b.peerID, r.stderr)
		}
		if len(resp.Attempts) != 2 || resp.Attempts[0].Peer != a.peerID || resp.Attempts[0].Outcome != "retryable-error" ||
			!strings.Contains(resp.Attempts[0].Error, "exited with code 75") {
			t.Fatalf("attempts %+v, want a retryable error (exit 75) on %s, then %s", resp.Attempts, a.peerID, b.peerID)
		}
	})

	t.Run("exit 3 fails with its stderr", func(t *testing.T) {
		r, resp := submit("fail3", "oops")
		if r.code != 1 || resp.Status != "failed" || resp.ExitCode == nil || *resp.ExitCode != 3 ||
			resp.Stderr != "reading input\nbad input: oops" || !strings.Contains(resp.Error, "exited with code 3") {
			t.Fatalf("exit %d, %+v (exit code %v), want failed with exit code 3 and the stderr\nstdout %s", r.code, resp, resp.ExitCode, r.stdout)
		}
		text := runCLI(t, bin, nil, "submit", "--api", g.api, "--type", "fail3", "--payload", "oops")
		if text.code != 1 || !strings.Contains(text.stderr, "exit code: 3") || !strings.Contains(text.stderr, "stderr:\nreading input\nbad input: oops") {
			t.Fatalf("text output: exit %d, stderr %q, want the exit code and stderr shown", text.code, text.stderr)
		}
	})

	t.Run("enrich forwards to the local service, a 4xx comes back structured", func(t *testing.T) {
		r, resp := submit("enrich", "record 7")
		if r.code != 0 || resp.Result == nil || *resp.Result != "enriched(record 7)" || resp.Worker != a.peerID {
			t.Fatalf("exit %d, %+v, want enriched(record 7) from %s\nstderr %s", r.code, resp, a.peerID, r.stderr)
		}
		r, resp = submit("enrich", "bad")
		if r.code != 1 || resp.Status != "failed" || resp.HTTPStatus != 422 || resp.HTTPBody != `{"error":"cannot enrich \"bad\""}` {
			t.Fatalf("4xx: exit %d, %+v, want failed with http_status 422 and the body", r.code, resp)
		}
	})

	t.Run("a failing health URL withdraws only that type, a passing one brings it back", func(t *testing.T) {
		healthy.Store(false)
		awaitAdvertised(t, bin, g, a, "enrich", false)
		awaitAdvertised(t, bin, g, a, "onlya", true)
		hits := enrichHits.Load()
		r, resp := submit("enrich", "while out")
		if r.code != 2 || resp.Status != "unavailable" {
			t.Fatalf("enrich while its service is out: exit %d, %+v, want unavailable", r.code, resp)
		}
		if n := enrichHits.Load(); n != hits {
			t.Fatalf("the service got %d requests while out", n-hits)
		}
		r, resp = submit("onlya", "still here")
		if r.code != 0 || resp.Worker != a.peerID || resp.Result == nil || *resp.Result != "still here" {
			t.Fatalf("the worker's other type while enrich is out: exit %d, %+v", r.code, resp)
		}
		healthy.Store(true)
		awaitAdvertised(t, bin, g, a, "enrich", true)
		testkit.WaitFor(t, 10*time.Second, "enrich served again", func() error {
			r, resp := submit("enrich", "back")
			if r.code != 0 || resp.Result == nil || *resp.Result != "enriched(back)" {
				return fmt.Errorf("exit %d, %+v", r.code, resp)
			}
			return nil
		})
	})

	t.Run("a node that drains past its drain-timeout kills the command it runs", func(t *testing.T) {
		if err := os.Remove(pidA); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		type result struct {
			r    cliRun
			resp customResponse
		}
		res := make(chan result, 1)
		go func() {
			r, err := execCLI(bin, cliEnv(t, nil), nil, "submit", "--api", g.api, "--type", "hang", "--payload", "", "--timeout", "6s", "--output", "json")
			var resp customResponse
			if err == nil {
				_ = json.Unmarshal([]byte(r.stdout), &resp)
			}
			res <- result{r, resp}
		}()
		var pids []int
		testkit.WaitFor(t, 10*time.Second, "the hanging command runs on a", func() error {
			b, err := os.ReadFile(pidA)
			if err != nil {
				return err
			}
			pids = pids[:0]
			for _, field := range strings.Fields(string(b)) {
				if p, err := strconv.Atoi(field); err == nil {
					pids = append(pids, p)
				}
			}
			if len(pids) < 2 {
				return fmt.Errorf("pid file %q", b)
			}
			return nil
		})
		if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-a.done:
		case <-time.After(20 * time.Second):
			t.Fatalf("worker a did not stop within 20s of SIGTERM (drain-timeout 500ms)\n%s", a.stderr)
		}
		for _, pid := range pids {
			testkit.WaitFor(t, 10*time.Second, fmt.Sprintf("process %d gone after the drain", pid), processGone(pid))
		}
		if r := <-res; r.resp.Status == "ok" {
			t.Fatalf("the hanging request succeeded: %+v", r.resp)
		}
	})
}

// TestCustomTypesConfigValidate: `workmesh config validate` reports the
// problems of a custom-types block, each with its file and line, and
// exits 2; the block is valid.
func TestCustomTypesConfigValidate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	good := writeCustomConfig(t, "good", `work-types: [echo, upper, digest, enrich]
custom-types:
  upper:
    command: ["tr", "a-z", "A-Z"]
    timeout: 5s
    idempotent: true
    deterministic: true
  digest:
    command: ["sha256sum"]
    deterministic: true
  enrich:
    url: http://127.0.0.1:8081/enrich
    headers: {Authorization: "Bearer ..."}
    health-url: http://127.0.0.1:8081/healthz
`)
	if r := runCLI(t, bin, nil, "config", "validate", "--config", good); r.code != 0 {
		t.Fatalf("the issue's block: exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	// Headers (and env) carry credentials: config print hides them.
	if r := runCLI(t, bin, nil, "config", "print", "--config", good); r.code != 0 || strings.Contains(r.stdout, "Bearer") ||
		!strings.Contains(r.stdout, "custom-types.enrich.headers") {
		t.Fatalf("config print: exit %d, want the headers hidden\n%s", r.code, r.stdout)
	}
	bad := writeCustomConfig(t, "bad", `work-types: [echo, upper, nowhere]
custom-types:
  upper:
    timeout: 5s
  sha256:
    command: [cat]
  web:
    url: file:///etc/passwd
  slow:
    command: [cat]
    timeout: forever
`)
	r := runCLI(t, bin, nil, "config", "validate", "--config", bad)
	if r.code != 2 {
		t.Fatalf("a bad block: exit %d, want 2\nstderr %s", r.code, r.stderr)
	}
	for _, want := range []string{
		"custom-types upper: needs a command (a list: [program, args...]) or a url (file " + bad + " line 3)",
		`custom-types "sha256" clashes with the built-in work type of that name: choose another name (file ` + bad + " line 5)",
		`custom-types web: url "file:///etc/passwd" is not http or https (file ` + bad + " line 8)",
		"custom-types.slow.timeout: want a duration",
		`work-types entry 3 "nowhere" is not a work type of this binary`,
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("missing %q in:\n%s", want, r.stderr)
		}
	}
}
