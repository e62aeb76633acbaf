package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/api"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// batchNode is a work API whose dispatcher answers by work type and
// records how many requests it ran at once.
type batchNode struct {
	srv            *httptest.Server
	inFlight, peak atomic.Int64
	mu             sync.Mutex
	n              int
}

func newBatchNode(t *testing.T) *batchNode {
	t.Helper()
	b := &batchNode{}
	api, err := api.NewWork(func(_ context.Context, req dispatch.WorkRequest) dispatch.WorkResult {
		cur := b.inFlight.Add(1)
		defer b.inFlight.Add(-1)
		for {
			p := b.peak.Load()
			if cur <= p || b.peak.CompareAndSwap(p, cur) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond) // long enough for requests to overlap
		b.mu.Lock()
		b.n++
		n := b.n
		b.mu.Unlock()
		worker := []string{"12D3KooWAAAAAAAApeerAAAA", "12D3KooWBBBBBBBBpeerBBBB"}[n%2]
		switch req.Type {
		case "boom":
			return dispatch.WorkResult{Status: apiv1.StatusFailed, Worker: worker, Error: "boom", Duration: time.Millisecond}
		}
		return dispatch.WorkResult{Status: apiv1.StatusOK, Output: req.Payload, Worker: worker,
			Attempts: []apiv1.Attempt{{Peer: worker, Outcome: workers.Success}}, Duration: time.Duration(n) * time.Millisecond}
	})
	if err != nil {
		t.Fatal(err)
	}
	b.srv = httptest.NewServer(api)
	t.Cleanup(b.srv.Close)
	return b
}

func (b *batchNode) addr() string { return strings.TrimPrefix(b.srv.URL, "http://") }

// writeLines writes a batch file.
func writeLines(t *testing.T, lines ...string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "requests.jsonl")
	if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// batchLine is one result line as a script reads it.
type batchLine struct {
	Line   int    `json:"line"`
	Status string `json:"status"`
	Error  string `json:"error"`
	Result string `json:"result"`
	Worker string `json:"worker"`
}

func parseBatchOutput(t *testing.T, stdout string) map[int]batchLine {
	t.Helper()
	out := map[int]batchLine{}
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		var l batchLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("result line %q: %v", sc.Text(), err)
		}
		if _, dup := out[l.Line]; dup {
			t.Errorf("line %d answered twice", l.Line)
		}
		out[l.Line] = l
	}
	return out
}

// TestBatch runs a batch with good and bad lines against a fake node: one
// JSON result per line, bad lines named by number without stopping the
// others, bounded concurrency, and the summary.
func TestBatch(t *testing.T) {
	b := newBatchNode(t)
	var lines []string
	for i := range 30 {
		lines = append(lines, fmt.Sprintf(`{"type":"sha256","payload":"p%d"}`, i))
	}
	lines[3] = `{"type":"sha256","payloadx":"oops"}` // line 4: unknown field
	lines[5] = `not json`                            // line 6
	lines[7] = `{"payload":"typed by --type"}`       // line 8: type from the flag
	lines[9] = `{"type":"boom"}`                     // line 10: the work fails
	lines[11] = ``                                   // line 12: blank, skipped
	lines[13] = `{"type":"sha256","timeout":"x"}`    // line 14: the node refuses it
	f := writeLines(t, lines...)

	code, stdout, stderr := runRoot(t, nil, "submit", "--api", b.addr(), "--file", f, "--concurrency", "3", "--type", "echo", "--progress", "lines")
	if code != 1 {
		t.Errorf("exit code %d, want 1 (some lines failed)\nstderr: %s", code, stderr)
	}
	got := parseBatchOutput(t, stdout)
	if len(got) != 29 {
		t.Errorf("%d result lines, want 29 (30 lines, one blank)", len(got))
	}
	for n, want := range map[int]string{4: "invalid", 6: "invalid", 8: "ok", 10: "failed", 14: "error", 1: "ok", 30: "ok"} {
		if got[n].Status != want {
			t.Errorf("line %d: status %q, want %q (%+v)", n, got[n].Status, want, got[n])
		}
	}
	if !strings.Contains(got[4].Error, `unknown field "payloadx"`) || got[8].Result != "typed by --type" || !strings.Contains(got[14].Error, "timeout") {
		t.Errorf("lines 4, 8, 14: %+v %+v %+v", got[4], got[8], got[14])
	}
	if p := b.peak.Load(); p > 3 || p < 2 {
		t.Errorf("at most %d requests ran at once, want 2 or 3 (--concurrency 3)", p)
	}
	for _, want := range []string{
		"line 4: not a JSON request object", "line 6: ", "line 14: ",
		"progress: 29/29 100%",
		"batch: 29 requests in", "25 ok, 4 failed (1 failed, 1 error, 2 invalid)",
		"latency: p50 ", "p99 ",
		"served by: …peer", "…peerAAAA ", "…peerBBBB ",
		"4 of 29 requests did not succeed (lines 4, 6, 10, 14)",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "\r") {
		t.Errorf("--progress lines drew a bar:\n%q", stderr)
	}
}

func TestBatchAllOK(t *testing.T) {
	b := newBatchNode(t)
	f := writeLines(t, `{"type":"echo","payload":"a"}`, `{"type":"echo","payload_b64":"Yg=="}`)
	code, stdout, stderr := runRoot(t, nil, "submit", "--api", b.addr(), "--file", f, "--progress", "off")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got := parseBatchOutput(t, stdout)
	if got[1].Result != "a" || got[2].Result != "b" {
		t.Errorf("results %+v", got)
	}
	if strings.Contains(stderr, "progress") || !strings.Contains(stderr, "2 ok, 0 failed") {
		t.Errorf("stderr %q", stderr)
	}
}

func TestBatchUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--file", "/nonexistent/requests.jsonl"},
		{"--file", "x", "--concurrency", "0"},
		{"--file", "x", "--payload", "p"},
		{"--file", "x", "--progress", "sometimes"},
	} {
		code, _, stderr := runRoot(t, nil, append([]string{"submit", "--api", "127.0.0.1:1"}, args...)...)
		if code != 2 {
			t.Errorf("submit %v: exit %d, want 2 (%s)", args, code, stderr)
		}
	}
	// Flags of one request do not go with a batch of them.
	batch := filepath.Join(t.TempDir(), "batch.jsonl")
	if err := os.WriteFile(batch, []byte(`{"type":"echo","payload":"x"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, flag := range [][]string{{"--explain"}, {"--payload-file", batch}} {
		code, _, stderr := runRoot(t, nil, append([]string{"submit", "--api", "127.0.0.1:1", "--file", batch}, flag...)...)
		if code != 2 || !strings.Contains(stderr, flag[0]+" does not go with --file") {
			t.Errorf("submit --file %s: exit %d, want 2 saying it does not go with --file (%s)", flag[0], code, stderr)
		}
	}
}

func TestReadLineBounds(t *testing.T) {
	long := strings.Repeat("x", 100)
	br := bufio.NewReaderSize(strings.NewReader("short\r\n"+long+"\nlast"), 16)
	for _, want := range []struct {
		line    string
		tooLong bool
	}{{"short", false}, {"", true}, {"last", false}} {
		line, tooLong, _ := readLine(br, 50)
		if string(line) != want.line || tooLong != want.tooLong {
			t.Errorf("readLine = %q, %t; want %q, %t", line, tooLong, want.line, want.tooLong)
		}
	}
	if n, err := countLines(strings.NewReader("a\n\n  \nb\nc")); n != 3 || err != nil {
		t.Errorf("countLines = %d, %v; want 3", n, err)
	}
}

func TestProgressRendering(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, progressBar, 100)
	p.start = time.Now().Add(-5 * time.Second)
	got := p.line(50, 48, 2, p.start.Add(5*time.Second), true)
	want := "[============>           ] 50/100  50%  10.0/s  ETA 5s  ok 48  failed 2"
	if got != want {
		t.Errorf("bar line\n got %q\nwant %q", got, want)
	}
	p = newProgress(&buf, progressLines, -1)
	if got := p.line(7, 7, 0, p.start.Add(time.Second), false); got != "7 done  7.0/s  ok 7  failed 0" {
		t.Errorf("line of unknown total: %q", got)
	}
	if got := percentile([]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 50); got != 5 {
		t.Errorf("p50 = %v", got)
	}
	if got := percentile([]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 99); got != 10 {
		t.Errorf("p99 = %v", got)
	}
}

func TestPeerTableRendering(t *testing.T) {
	rtt := 0.42
	now := time.Now()
	peers := []apiv1.PeerStatus{
		{State: "alive", Scores: []apiv1.TypeScore{{WorkType: "echo", Score: 0.9, Rated: true}, {WorkType: "sha256", Score: 0.5, Rated: true}}, RTTMS: &rtt},
		{State: "unreachable", Scores: []apiv1.TypeScore{{WorkType: "sha256", Score: 0.3}}, RTTMS: &rtt, PollError: "timeout",
			Reason: "stalled: 2 accepted work requests left unanswered past their deadline"},
	}
	peers[0].ID, peers[0].WorkTypes, peers[0].Labels, peers[0].LastSeen = "12D3KooWAAAAAAAApeerAAAA", []string{"sha256", "echo"}, []string{"full"}, now.Add(-3*time.Second)
	peers[0].Heads = map[string]uint64{"sha256": 12}
	peers[0].Load.InFlight, peers[0].Capacity.MaxConcurrent = 1, 4
	peers[1].ID, peers[1].WorkTypes = "12D3KooWBBBBBBBBpeerBBBB", []string{"sha256"}

	var buf bytes.Buffer
	if err := printPeerTable(&buf, peers, "", false, now); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"2 peers: 1 alive, 1 unreachable",
		"PEER", "STATE", "SCORE", "LABELS", "WORK TYPES", "LOAD", "RTT", "LAST SEEN", "CONN",
		"…peerAAAA", "echo=0.90 sha256=0.50", "full", "echo,sha256@12", "1+0/4", "420µs", "3s ago",
		"…peerBBBB", "unreachable", "unrated", "failed", "-",
		"…peerBBBB unreachable: stalled: 2 accepted work requests left unanswered past their deadline\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	printPeerTable(&buf, peers, "sha256", true, now)
	if !strings.Contains(buf.String(), "12D3KooWAAAAAAAApeerAAAA") || !strings.Contains(buf.String(), "0.50") || strings.Contains(buf.String(), "echo=") {
		t.Errorf("--type sha256 --wide:\n%s", buf.String())
	}
}

func TestConfigPrint(t *testing.T) {
	t.Setenv("WORKMESH_MAX_RETRIES", "3")
	t.Setenv("WORKMESH_API_TOKEN", "a-secret-token-of-32-bytes-long!")
	code, stdout, stderr := runRoot(t, nil, "config", "print", "--worker-timeout", "750ms", "--output", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var settings []configSetting
	if err := json.Unmarshal([]byte(stdout), &settings); err != nil {
		t.Fatalf("json %q: %v", stdout, err)
	}
	by := map[string]configSetting{}
	for _, s := range settings {
		by[s.Key] = s
	}
	for key, want := range map[string]configSetting{
		"worker-timeout":  {"worker-timeout", "750ms", "flag"},
		"max-retries":     {"max-retries", "3", "env"},
		"connect-timeout": {"connect-timeout", "1s", "default"},
		"api-token":       {"api-token", hiddenValue, "env"},
	} {
		if by[key] != want {
			t.Errorf("%s: %+v, want %+v", key, by[key], want)
		}
	}
	if strings.Contains(stdout, "a-secret-token") {
		t.Error("config print shows the api-token")
	}
	code, stdout, _ = runRoot(t, nil, "config", "print")
	if code != 0 || !strings.Contains(stdout, "KEY") || !strings.Contains(stdout, "SOURCE") {
		t.Errorf("table: exit %d\n%s", code, stdout)
	}
	if code, _, _ := runRoot(t, nil, "config", "print", "--max-retries", "-5"); code != 2 {
		t.Errorf("an invalid setting: exit %d, want 2", code)
	}
}

func TestCompletion(t *testing.T) {
	code, stdout, _ := runRoot(t, nil, "completion", "bash")
	if code != 0 || !strings.Contains(stdout, "__start_workmesh") {
		t.Errorf("completion bash: exit %d, %d bytes", code, len(stdout))
	}
	code, stdout, _ = runRoot(t, nil, "__complete", "plan", "--type", "")
	if code != 0 || !strings.Contains(stdout, "sha256") {
		t.Errorf("completing plan --type: %q", stdout)
	}
	code, stdout, _ = runRoot(t, nil, "__complete", "peers", "--output", "")
	if code != 0 || !strings.Contains(stdout, "yaml") {
		t.Errorf("completing peers --output: %q", stdout)
	}
}

// The status line's counts add up to its requests: those the API refused
// before dispatching them, which have no status, are counted too.
func TestStatusCountsAddUp(t *testing.T) {
	v := apiv1.StatusView{Requests: &apiv1.WorkStats{Requests: 38,
		ByStatus: map[apiv1.Status]uint64{apiv1.StatusOK: 19, apiv1.StatusUnavailable: 7, apiv1.StatusTimeout: 4}}}
	var buf bytes.Buffer
	printStatus(&buf, "127.0.0.1:7400", v)
	if want := "38 requests so far: 19 ok, 8 refused by the API, 7 unavailable, 4 timeout"; !strings.Contains(buf.String(), want) {
		t.Fatalf("status lacks %q:\n%s", want, buf.String())
	}
}
