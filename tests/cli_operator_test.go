package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"go.yaml.in/yaml/v3"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// syncBuffer is a bytes.Buffer that a process and a test may use at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// devnetProcess is a running `workmesh devnet`.
type devnetProcess struct {
	cmd    *exec.Cmd
	api    string
	ids    map[string]string // node name -> peer ID
	stderr *syncBuffer
	done   chan error
	exited chan struct{} // closed once the process has been waited for
}

// startDevnetProcess starts `workmesh devnet` and waits for "ready",
// collecting the API address and the nodes' peer IDs.
func startDevnetProcess(t *testing.T, bin string, args ...string) *devnetProcess {
	t.Helper()
	d := &devnetProcess{cmd: exec.Command(bin, append([]string{"devnet"}, args...)...), ids: map[string]string{},
		stderr: &syncBuffer{}, done: make(chan error, 1), exited: make(chan struct{})}
	d.cmd.Env = cliEnv(t, nil)
	d.cmd.Stderr = d.stderr
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-d.exited:
			return
		default:
		}
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(8 * time.Second):
			d.cmd.Process.Kill()
			<-d.exited
		}
	})
	ready := make(chan struct{})
	var mu sync.Mutex
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			f := strings.Fields(line)
			mu.Lock()
			switch {
			case strings.HasPrefix(line, "api: "):
				d.api = strings.TrimPrefix(line, "api: ")
			case len(f) > 2 && strings.HasPrefix(f[0], "node") && strings.HasPrefix(f[1], "12D3"):
				d.ids[f[0]] = f[1]
			case line == "ready":
				close(ready)
			}
			mu.Unlock()
		}
		err := d.cmd.Wait()
		close(d.exited)
		d.done <- err
	}()
	select {
	case <-ready:
	case err := <-d.done:
		t.Fatalf("devnet exited before ready: %v\nstderr:\n%s", err, d.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("devnet not ready within 30s\nstderr:\n%s", d.stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	return d
}

// ttyRun is a run of the binary with some of its output on a
// pseudo-terminal, as a user at a terminal sees it.
type ttyRun struct {
	cmd    *exec.Cmd
	screen *syncBuffer // what the terminal showed
	copied chan struct{}
	done   chan error
	exited chan struct{} // closed once the process has been waited for
}

// startOnTTY starts the binary with stdout, stderr or both on a
// pseudo-terminal; the other stream goes to other.
func startOnTTY(t *testing.T, bin string, stdoutTTY, stderrTTY bool, other io.Writer, args ...string) *ttyRun {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 160}); err != nil {
		t.Fatal(err)
	}
	r := &ttyRun{cmd: exec.Command(bin, args...), screen: &syncBuffer{}, copied: make(chan struct{}), done: make(chan error, 1), exited: make(chan struct{})}
	r.cmd.Env = cliEnv(t, nil)
	r.cmd.Stdin = tty
	r.cmd.Stdout, r.cmd.Stderr = other, other
	if stdoutTTY {
		r.cmd.Stdout = tty
	}
	if stderrTTY {
		r.cmd.Stderr = tty
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close() // the child holds it now; reads end when the child does
	go func() {
		io.Copy(r.screen, ptmx) // ends with EIO once the child is gone
		ptmx.Close()
		close(r.copied)
	}()
	go func() {
		err := r.cmd.Wait()
		close(r.exited)
		r.done <- err
	}()
	t.Cleanup(func() {
		select {
		case <-r.exited:
		default:
			r.cmd.Process.Kill()
			<-r.exited
		}
	})
	return r
}

// wait waits for the run to end and returns its exit code and screen.
func (r *ttyRun) wait(t *testing.T, within time.Duration) (int, string) {
	t.Helper()
	var err error
	select {
	case err = <-r.done:
	case <-time.After(within):
		t.Fatalf("%v still running after %s; screen:\n%s", r.cmd.Args, within, r.screen)
	}
	select {
	case <-r.copied:
	case <-time.After(2 * time.Second):
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, r.screen.String()
}

// runOnTTY runs the binary to its end with stdout and stderr on a terminal.
func runOnTTY(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	return startOnTTY(t, bin, true, true, io.Discard, args...).wait(t, 20*time.Second)
}

// scrape reads the node's /metrics with Prometheus's own text parser.
func scrape(t *testing.T, api string) map[string]*dto.MetricFamily {
	t.Helper()
	return testkit.Scrape(t, "http://"+api+apiv1.MetricsPath)
}

// short is how the CLI abbreviates a peer ID.
func short(id string) string { return "…" + id[len(id)-8:] }

// cliPeer is what a script reads of `workmesh peers --output json`.
type cliPeer struct {
	ID     string   `json:"id"`
	State  string   `json:"state"`
	Labels []string `json:"labels"`
	Scores []struct {
		WorkType string  `json:"work_type"`
		Score    float64 `json:"score"`
		Group    string  `json:"group"`
	} `json:"scores"`
	RTTMS *float64 `json:"rtt_ms"`
}

// cliPlan is what a script reads of `workmesh plan --output json`.
type cliPlan struct {
	Groups []struct {
		Label string `json:"label"`
		Peers []struct {
			Peer     string `json:"peer"`
			Excluded string `json:"excluded"`
		} `json:"peers"`
	} `json:"groups"`
	Order    []struct{ Peer, Group string }  `json:"order"`
	Excluded []struct{ Peer, Reason string } `json:"excluded"`
	Counts   []struct {
		Reason string `json:"reason"`
		N      int    `json:"n"`
	} `json:"counts"`
	Explanation string `json:"explanation"`
	Fallback    bool   `json:"fallback"`
}

// TestCLIOperator runs the operator's commands against a devnet as a user
// would: peers and a batch on a terminal, plans, status, the JSON forms,
// metrics after real dispatches, and a failover seen in all of them.
func TestCLIOperator(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a devnet")
	}
	bin := buildBinary(t)
	dn := startDevnetProcess(t, bin, "--nodes", "4", "--api", "127.0.0.1:0", "--log-level", "info")
	api := dn.api
	node1 := dn.ids["node1"]
	if node1 == "" || len(dn.ids) != 4 {
		t.Fatalf("devnet nodes %v", dn.ids)
	}
	for range 3 {
		if r := runCLI(t, bin, nil, "submit", "--api", api, "--type", "sha256", "--payload", "hello"); r.code != 0 {
			t.Fatalf("submit: exit %d: %s", r.code, r.stderr)
		}
	}
	peersJSON := func() []cliPeer {
		t.Helper()
		r := runCLI(t, bin, nil, "peers", "--api", api, "--output", "json")
		var ps []cliPeer
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &ps) != nil {
			t.Fatalf("peers --output json: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
		}
		return ps
	}
	// Liveness polls every 500ms; wait for one round so every peer has a
	// round-trip time to show.
	testkit.WaitFor(t, 5*time.Second, "every peer polled", func() error {
		ps, polled := peersJSON(), 0
		for _, p := range ps {
			if p.RTTMS != nil {
				polled++
			}
		}
		if polled != 3 {
			return fmt.Errorf("%d of 3 with a round-trip time: %+v", polled, ps)
		}
		return nil
	})

	t.Run("peers table on a terminal", func(t *testing.T) {
		code, screen := runOnTTY(t, bin, "peers", "--api", api)
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, screen)
		}
		lines := strings.Split(strings.ReplaceAll(screen, "\r\n", "\n"), "\n")
		if lines[0] != "3 peers: 3 alive" {
			t.Errorf("headline %q, want \"3 peers: 3 alive\"", lines[0])
		}
		header := regexp.MustCompile(`^PEER\s+STATE\s+SCORE\s+LABELS\s+WORK TYPES\s+LOAD\s+RTT\s+LAST SEEN\s+CONN\s*$`)
		if len(lines) < 5 || !header.MatchString(lines[1]) {
			t.Fatalf("no header line:\n%s", screen)
		}
		row := regexp.MustCompile(`^…\S{8}\s+alive\s+(\d\.\d\d|unrated|\S+=\S+.*)\s+\S+\s+\S+\s+\d+\+\d+/\d+\s+\d+(\.\d+)?(µs|ms)\s+\d+s ago\s+(direct|relayed|none)\s*$`)
		rows := 0
		for _, l := range lines[2:] {
			if l == "" {
				continue
			}
			rows++
			if !row.MatchString(l) {
				t.Errorf("row %q does not read as peer, alive, score, labels, work types, load, RTT, last seen", l)
			}
		}
		if rows != 3 {
			t.Errorf("%d rows, want 3:\n%s", rows, screen)
		}
		if !strings.Contains(screen, short(node1)) || !strings.Contains(screen, "echo,sha256,sleep") {
			t.Errorf("node1 (%s, full, echo,sha256,sleep) not shown:\n%s", short(node1), screen)
		}
		if strings.Contains(screen, "\x1b") {
			t.Errorf("escape sequences in a one-shot table:\n%q", screen)
		}
	})

	t.Run("peers as json and yaml", func(t *testing.T) {
		ps := peersJSON()
		if len(ps) != 3 {
			t.Fatalf("%d peers, want 3", len(ps))
		}
		for _, p := range ps {
			if p.State != "alive" || len(p.Scores) == 0 {
				t.Errorf("peer %+v: want alive with scores", p)
			}
			if p.ID == node1 && (len(p.Labels) != 1 || p.Labels[0] != "full" || p.Scores[0].Group != "full") {
				t.Errorf("node1: %+v, want label and group full", p)
			}
		}
		r := runCLI(t, bin, nil, "peers", "--api", api, "--output", "yaml")
		var ys []map[string]any
		if err := yaml.Unmarshal([]byte(r.stdout), &ys); err != nil || len(ys) != 3 || ys[0]["state"] != "alive" {
			t.Errorf("yaml: %v\n%s", err, r.stdout)
		}
	})

	t.Run("peers --watch redraws until Ctrl-C", func(t *testing.T) {
		run := startOnTTY(t, bin, true, true, io.Discard, "peers", "--api", api, "--watch", "--interval", "300ms")
		testkit.WaitFor(t, 5*time.Second, "two redraws", func() error {
			if screen := run.screen.String(); strings.Count(screen, "every 300ms") < 2 {
				return fmt.Errorf("fewer than two:\n%s", screen)
			}
			return nil
		})
		run.cmd.Process.Signal(os.Interrupt)
		code, screen := run.wait(t, 3*time.Second)
		if code != 0 {
			t.Errorf("exit %d after Ctrl-C", code)
		}
		if strings.Count(screen, "\x1b[H\x1b[2J") < 2 || strings.Count(screen, "3 peers: 3 alive") < 2 {
			t.Errorf("the watch does not redraw the table in place:\n%q", screen)
		}
	})

	t.Run("plan", func(t *testing.T) {
		r := runCLI(t, bin, nil, "plan", "--api", api, "--type", "sha256", "--output", "json")
		var p cliPlan
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &p) != nil {
			t.Fatalf("plan --output json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		var groups []string
		for _, g := range p.Groups {
			groups = append(groups, g.Label)
		}
		if strings.Join(groups, ",") != "full,archive," {
			t.Errorf("groups %q, want full, archive, then the default group", groups)
		}
		if len(p.Order) != 3 || p.Order[0].Peer != node1 || p.Order[0].Group != "full" || !p.Fallback {
			t.Errorf("order %+v (fallback %t), want node1 from the full group first, then the local worker", p.Order, p.Fallback)
		}
		if p.Explanation != "3 candidates for work type sha256: 3 selectable" {
			t.Errorf("explanation %q", p.Explanation)
		}

		r = runCLI(t, bin, nil, "plan", "--api", api, "--type", "sha256")
		for _, want := range []string{
			"plan for sha256: selection rating, groups full > archive > unlabelled",
			"full        1  " + short(node1) + "  alive",
			"would try: " + short(node1) + " (full), ",
			"then the local worker",
			"counts: 3 candidates for work type sha256: 3 selectable",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("plan lacks %q:\n%s", want, r.stdout)
			}
		}

		// Required labels hold for the local worker too (issue 17): the
		// gateway has no label gpu, so nothing could take the request.
		r = runCLI(t, bin, nil, "plan", "--api", api, "--type", "sha256", "--labels", "gpu")
		if r.code != 2 || !strings.Contains(r.stdout, "counts: 3 candidates for work type sha256: 3 lacks label gpu") ||
			!strings.Contains(r.stdout, "excluded: ") || !strings.Contains(r.stdout, "no remote peer, and the local node lacks label gpu") {
			t.Errorf("plan --labels gpu: exit %d\n%s", r.code, r.stdout)
		}
		r = runCLI(t, bin, nil, "plan", "--api", api, "--type", "nosuch")
		if r.code != 2 || !strings.Contains(r.stdout, "counts: no peer advertises work type nosuch") ||
			!strings.Contains(r.stderr, "no worker could take nosuch work") {
			t.Errorf("plan --type nosuch: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
		}
	})

	t.Run("submit --explain and the counts of a request that was not placed", func(t *testing.T) {
		r := runCLI(t, bin, nil, "submit", "--api", api, "--type", "sha256", "--payload", "hello", "--explain")
		plan, done := strings.Index(r.stderr, "would try: "), strings.Index(r.stderr, "ok by ")
		if r.code != 0 || r.stdout != helloSHA256+"\n" || plan < 0 || done < plan || !strings.Contains(r.stderr, "counts: 3 candidates") {
			t.Errorf("submit --explain: exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
		}
		r = runCLI(t, bin, nil, "submit", "--api", api, "--type", "echo", "--labels", "gpu", "--payload", "x")
		if r.code != 2 || !strings.Contains(r.stderr, "unavailable") || !strings.Contains(r.stderr, "2 candidates for work type echo: 2 lacks label gpu; the local node lacks label gpu") {
			t.Errorf("echo --labels gpu: exit %d\n%s", r.code, r.stderr)
		}
		r = runCLI(t, bin, nil, "submit", "--api", api, "--type", "nosuch", "--payload", "x")
		if r.code != 2 || !strings.Contains(r.stderr, "no peer advertises work type nosuch") {
			t.Errorf("nosuch: exit %d\n%s", r.code, r.stderr)
		}
	})

	batch := filepath.Join(t.TempDir(), "requests.jsonl")
	var lines []string
	for i := range 40 {
		switch {
		case i == 6:
			lines = append(lines, `{"type":"sha256","payloadz":"x"}`)
		case i%10 == 9:
			lines = append(lines, `{"type":"sleep","payload":"50ms","timeout":"2s"}`)
		default:
			lines = append(lines, fmt.Sprintf(`{"type":"sha256","payload":"item %d"}`, i))
		}
	}
	if err := os.WriteFile(batch, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	checkBatchStdout := func(t *testing.T, stdout string) {
		t.Helper()
		seen := map[int]string{}
		for l := range strings.Lines(stdout) {
			var r struct {
				Line   int    `json:"line"`
				Status string `json:"status"`
				Error  string `json:"error"`
				Worker string `json:"worker"`
			}
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatalf("result line %q: %v", l, err)
			}
			seen[r.Line] = r.Status
			if r.Line == 7 && !strings.Contains(r.Error, `unknown field "payloadz"`) {
				t.Errorf("line 7: %q, want the unknown field named", r.Error)
			}
		}
		if len(seen) != 40 || seen[7] != "invalid" || seen[1] != "ok" || seen[10] != "ok" {
			t.Errorf("%d result lines (want one per line, 40); line 1 %q, 7 %q, 10 %q", len(seen), seen[1], seen[7], seen[10])
		}
	}

	t.Run("batch on a terminal", func(t *testing.T) {
		var stdout syncBuffer
		run := startOnTTY(t, bin, false, true, &stdout, "submit", "--api", api, "--file", batch, "--concurrency", "4")
		code, screen := run.wait(t, 20*time.Second)
		if code != 1 {
			t.Errorf("exit %d, want 1 (line 7 is invalid)", code)
		}
		checkBatchStdout(t, stdout.String())
		bar := regexp.MustCompile(`\r\x1b\[K\[=+\] 40/40 100%  \d+\.\d/s  ETA 0s  ok 39  failed 1`)
		if !bar.MatchString(screen) || !strings.Contains(screen, "\r\x1b[K[") || !strings.Contains(screen, "ETA ") {
			t.Errorf("no progress bar with rate and ETA on the terminal:\n%q", screen)
		}
		for _, want := range []string{
			"line 7: not a JSON request object",
			"batch: 40 requests in ", "39 ok, 1 failed (1 invalid)",
			"latency: p50 ", ", p99 ",
			"served by: " + short(node1) + " ",
		} {
			if !strings.Contains(screen, want) {
				t.Errorf("terminal lacks %q:\n%s", want, screen)
			}
		}
	})

	t.Run("batch without a terminal", func(t *testing.T) {
		r := runCLI(t, bin, nil, "submit", "--api", api, "--file", batch, "--concurrency", "4")
		if r.code != 1 {
			t.Errorf("exit %d, want 1", r.code)
		}
		checkBatchStdout(t, r.stdout)
		if !strings.Contains(r.stderr, "progress: 40/40 100%") || strings.ContainsAny(r.stderr, "\r\x1b") {
			t.Errorf("want plain progress lines, no bar:\n%q", r.stderr)
		}
		if !strings.Contains(r.stderr, "batch: 40 requests in ") {
			t.Errorf("no summary:\n%s", r.stderr)
		}
	})

	t.Run("status", func(t *testing.T) {
		r := runCLI(t, bin, nil, "status", "--api", api, "--output", "json")
		var st struct {
			PeerID   string `json:"peer_id"`
			Peers    struct{ Fresh, Connected int }
			Liveness struct {
				Alive int `json:"alive"`
			} `json:"liveness"`
			Requests struct {
				Requests uint64 `json:"requests"`
			} `json:"requests"`
			Local struct {
				MaxConcurrent int `json:"max_concurrent"`
			} `json:"local"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
			t.Fatalf("status --output json: exit %d\n%s", r.code, r.stdout)
		}
		if st.PeerID != dn.ids["node0"] || st.Peers.Fresh != 3 || st.Liveness.Alive != 3 || st.Requests.Requests < 80 || st.Local.MaxConcurrent == 0 {
			t.Errorf("status %+v", st)
		}
		r = runCLI(t, bin, nil, "status", "--api", api)
		if !strings.Contains(r.stdout, "liveness:   3 alive, 0 unreachable, 0 probing") || !strings.Contains(r.stdout, "peers:      3 fresh, 3 connected") {
			t.Errorf("status:\n%s", r.stdout)
		}
	})

	t.Run("metrics after real dispatches", func(t *testing.T) {
		mfs := scrape(t, api)
		for name := range mfs {
			if !strings.HasPrefix(name, "workmesh_") && !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") {
				t.Errorf("metric %s: not workmesh_ prefixed", name)
			}
		}
		atLeast := func(name string, labels map[string]string, min float64) {
			t.Helper()
			if v, ok := testkit.MetricValue(mfs, name, labels); !ok || v < min {
				t.Errorf("%s%v = %v (found %t), want at least %v", name, labels, v, ok, min)
			}
		}
		atLeast("workmesh_requests_total", map[string]string{"work_type": "sha256", "status": "ok"}, 70)
		atLeast("workmesh_requests_total", map[string]string{"work_type": "sleep", "status": "ok"}, 8)
		atLeast("workmesh_requests_total", map[string]string{"work_type": "unknown", "status": "unavailable"}, 1)
		atLeast("workmesh_attempts_total", map[string]string{"outcome": "success", "peer": node1}, 1)
		// The echo request with labels no one carries is refused, not run
		// locally (issue 17; it used to be this test's one fallback).
		atLeast("workmesh_requests_total", map[string]string{"work_type": "echo", "status": "unavailable"}, 1)
		if v, ok := testkit.MetricValue(mfs, "workmesh_fallbacks_total", map[string]string{"work_type": "echo"}); ok && v > 0 {
			t.Errorf("workmesh_fallbacks_total{work_type=echo} = %v, want none: the only echo request that was not placed remotely required label gpu", v)
		}
		atLeast("workmesh_polls_total", map[string]string{"result": "ok"}, 3)
		atLeast("workmesh_peers_fresh", nil, 3)
		atLeast("workmesh_peers_by_liveness", map[string]string{"state": "alive"}, 3)
		atLeast("workmesh_peer_liveness_state", map[string]string{"peer": node1, "state": "alive"}, 1)
		atLeast("workmesh_api_refused_total", map[string]string{"reason": "bad_request"}, 0)
		atLeast("workmesh_gossip_dropped_total", map[string]string{"queue": "validation_queue"}, 0)
		atLeast("workmesh_gossip_dropped_total", map[string]string{"queue": "peer_queue"}, 0)
		atLeast("workmesh_gossip_left_out_total", nil, 0)
		if _, ok := testkit.MetricValue(mfs, "workmesh_peer_score", map[string]string{"peer": node1, "work_type": "sha256"}); !ok {
			t.Error("no workmesh_peer_score for node1 sha256")
		}
		if _, ok := testkit.MetricValue(mfs, "workmesh_nodedata_rejections_total", map[string]string{"source": "gossip", "reason": "forged"}); !ok {
			t.Error("no workmesh_nodedata_rejections_total{source=gossip,reason=forged}")
		}
	})

	t.Run("failover seen in plan, peers and metrics", func(t *testing.T) {
		resp, err := http.Post("http://"+api+"/v1/devnet/stop?node=1", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		var p cliPlan
		testkit.WaitFor(t, 10*time.Second, "node1 excluded as unreachable", func() error {
			r := runCLI(t, bin, nil, "plan", "--api", api, "--type", "sha256", "--output", "json")
			p = cliPlan{}
			json.Unmarshal([]byte(r.stdout), &p)
			if len(p.Excluded) == 1 && p.Excluded[0].Peer == node1 && p.Excluded[0].Reason == "unreachable" {
				return nil
			}
			return fmt.Errorf("plan:\n%s", r.stdout)
		})
		if len(p.Order) == 0 || p.Order[0].Peer == node1 || p.Order[0].Group != "archive" {
			t.Errorf("order after the failover %+v, want the archive group first", p.Order)
		}
		r := runCLI(t, bin, nil, "plan", "--api", api, "--type", "sha256")
		if !strings.Contains(r.stdout, "excluded: "+short(node1)+" unreachable") || !strings.Contains(r.stdout, "1 unreachable, 2 selectable") {
			t.Errorf("plan after the failover:\n%s", r.stdout)
		}
		code, screen := runOnTTY(t, bin, "peers", "--api", api)
		if code != 0 || !strings.Contains(screen, "3 peers: 2 alive, 1 unreachable") ||
			!regexp.MustCompile(regexp.QuoteMeta(short(node1))+`\s+unreachable\s`).MatchString(screen) {
			t.Errorf("peers after the failover:\n%s", screen)
		}
		mfs := scrape(t, api)
		if v, _ := testkit.MetricValue(mfs, "workmesh_liveness_transitions_total", map[string]string{"from": "alive", "to": "unreachable"}); v != 1 {
			t.Errorf("alive->unreachable transitions = %v, want 1", v)
		}
		if v, _ := testkit.MetricValue(mfs, "workmesh_peer_liveness_state", map[string]string{"peer": node1, "state": "unreachable"}); v != 1 {
			t.Errorf("node1 unreachable = %v, want 1", v)
		}
		if v, _ := testkit.MetricValue(mfs, "workmesh_polls_total", map[string]string{"result": "failed"}); v < 1 {
			t.Errorf("failed polls = %v", v)
		}
	})

	t.Run("logs carry request_id, peer and work_type", func(t *testing.T) {
		logs := dn.stderr.String()
		failed := regexp.MustCompile(`msg="request did not succeed".*peer=none.*request_id=\S+.*work_type=nosuch`)
		liveness := regexp.MustCompile(`msg="peer liveness changed".*peer=` + node1)
		if !failed.MatchString(logs) || !liveness.MatchString(logs) {
			t.Errorf("logs lack the request and liveness lines with their fields:\n%s", logs)
		}
	})
}

// TestMetricsHedgesAndBeyondHead dispatches on an in-process mesh and
// scrapes the gateway's own registry: a hedge that fires and wins against
// a slow first group, and a beyond-head request answered by one attempt.
func TestMetricsHedgesAndBeyondHead(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a mesh")
	}
	hits := newHitCounter()
	slowSHA := workers.HandlerFunc(func(ctx context.Context, p []byte) workers.Result {
		select {
		case <-time.After(2 * time.Second):
		case <-ctx.Done():
		}
		return workers.OK([]byte("slow"))
	})
	gw, ms := startMesh(t, "sha256",
		memberSpec{name: "gw", cfg: func(c *config.Config) {
			c.Hedge.MaxCount, c.Hedge.Delay = 1, 50*time.Millisecond
			c.Worker.MaxRemoteWorkers = 2
			c.LabelBalancing = &config.LabelBalancingConfig{Order: []string{"slow", "fast"}}
		}},
		memberSpec{name: "slow", labels: []string{"slow"}, handlers: map[string]workers.Handler{"sha256": slowSHA}},
		memberSpec{name: "fast", labels: []string{"fast"}, handlers: map[string]workers.Handler{
			"sha256": sha256Handler("fast", hits),
			"chain":  headHandler{name: "fast", head: 10, hits: hits},
		}},
	)
	waitRanked(t, gw, "chain", 1)
	res := gw.submit(t, dispatch.WorkRequest{Type: "sha256", Payload: []byte("hello"), Timeout: 5 * time.Second})
	if res.Status != apiv1.StatusOK || res.Worker != ms[1].node.ID().String() {
		t.Fatalf("hedged request: %s", describe(res, peerName(append(ms, gw)...)))
	}
	res = gw.submit(t, dispatch.WorkRequest{Type: "chain", Payload: []byte("20"), MinHead: u64(20)})
	if res.Status != apiv1.StatusEmpty || len(res.Attempts) != 1 {
		t.Fatalf("beyond-head request: %s", describe(res, peerName(append(ms, gw)...)))
	}

	// Through the text format, as /metrics serves them.
	var buf bytes.Buffer
	for _, mf := range testkit.Gather(t, gw.disp.Collector(), gw.node.Collector()) {
		expfmt.MetricFamilyToText(&buf, mf)
	}
	parsed := testkit.ParseMetrics(t, &buf)
	slow, fast := ms[0].node.ID().String(), ms[1].node.ID().String()
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"workmesh_hedges_fired_total", nil, 1},
		{"workmesh_hedges_won_total", nil, 1},
		{"workmesh_attempts_total", map[string]string{"outcome": "success", "peer": fast}, 1},
		{"workmesh_attempts_total", map[string]string{"outcome": "cancelled", "peer": slow}, 1},
		{"workmesh_beyond_head_total", map[string]string{"work_type": "chain"}, 1},
		{"workmesh_requests_total", map[string]string{"work_type": "chain", "status": "empty"}, 1},
		{"workmesh_requests_total", map[string]string{"work_type": "sha256", "status": "ok"}, 1},
		{"workmesh_peers_fresh", nil, 2},
	} {
		if v, ok := testkit.MetricValue(parsed, c.name, c.labels); !ok || v != c.want {
			t.Errorf("%s%v = %v (found %t), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if _, ok := testkit.MetricValue(parsed, "workmesh_fallbacks_total", nil); ok {
		t.Error("a fallback counted, but every request was answered remotely")
	}
}

// TestPeerTableMetrics scrapes a peer table's collector: peers known and
// fresh as records age, and refused records counted by the source they
// arrived from and why.
func TestPeerTableMetrics(t *testing.T) {
	clock := testkit.NewFakeClockAt(time.Now())
	table := node.NewPeerTable(node.PeerTableConfig{Network: "metrics", TTL: time.Minute, Clock: clock, Logger: testLogger()})
	key, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(key)
	rec, err := node.SignNodeData(node.NodeData{PeerID: id, Network: "metrics", Sequence: 2}, key)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := table.Submit(rec, "", node.SourceGossip); !ok || err != nil {
		t.Fatalf("submit: %t %v", ok, err)
	}
	table.Submit([]byte("not a record"), "", node.SourceDHT)
	old, _ := node.SignNodeData(node.NodeData{PeerID: id, Network: "metrics", Sequence: 1}, key)
	table.Submit(old, "", node.SourceSync)
	clock.Advance(2 * time.Minute) // past the TTL, not yet expired

	byName := testkit.Gather(t, table.Collector())
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"workmesh_peers_known", nil, 1},
		{"workmesh_peers_fresh", nil, 0},
		{"workmesh_nodedata_rejections_total", map[string]string{"source": "dht", "reason": "malformed"}, 1},
		{"workmesh_nodedata_rejections_total", map[string]string{"source": "sync", "reason": "replay"}, 1},
		{"workmesh_nodedata_rejections_total", map[string]string{"source": "gossip", "reason": "malformed"}, 0},
	} {
		if v, ok := testkit.MetricValue(byName, c.name, c.labels); !ok || v != c.want {
			t.Errorf("%s%v = %v (found %t), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
}
