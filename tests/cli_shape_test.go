package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/workmesh/workmesh/tests/testkit"
)

// shapeCommands are the commands that print data, each with the arguments
// it needs besides --api and --output.
var shapeCommands = [][]string{
	{"submit", "--type", "echo", "--payload", "hi"},
	{"peers"},
	{"status"},
	{"plan", "--type", "echo"},
	{"config", "print"},
	{"version"},
}

// TestCLI_OutputShape runs every command that prints data against one node
// with each --output value: text and its synonym table print the same, json
// and yaml parse, any other value is refused with the same message, and
// completion offers the same set everywhere.
func TestCLI_OutputShape(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	n := startNodeProcess(t, bin, "--work-types", "echo")
	for _, c := range shapeCommands {
		args := slices.Clone(c)
		if c[0] != "config" && c[0] != "version" {
			args = append(args, "--api", n.api)
		}
		name := strings.Join(c[:1], " ")
		text := runCLI(t, bin, nil, append(args, "--output", "text")...)
		table := runCLI(t, bin, nil, append(args, "--output", "table")...)
		if text.code != 0 || table.code != 0 {
			t.Errorf("%s: text exit %d (%s), table exit %d (%s)", name, text.code, text.stderr, table.code, table.stderr)
		}
		if c[0] == "config" || c[0] == "version" || c[0] == "plan" {
			// No clock in their text: the synonym prints the same bytes.
			if text.stdout != table.stdout {
				t.Errorf("%s: --output table printed %q, text %q", name, table.stdout, text.stdout)
			}
		}
		j := runCLI(t, bin, nil, append(args, "--output", "json")...)
		var jv any
		if j.code != 0 || json.Unmarshal([]byte(j.stdout), &jv) != nil {
			t.Errorf("%s --output json: exit %d, stdout %q, stderr %s", name, j.code, j.stdout, j.stderr)
		}
		y := runCLI(t, bin, nil, append(args, "--output", "yaml")...)
		var yv any
		if y.code != 0 || yaml.Unmarshal([]byte(y.stdout), &yv) != nil || yv == nil {
			t.Errorf("%s --output yaml: exit %d, stdout %q, stderr %s", name, y.code, y.stdout, y.stderr)
		}
		bad := runCLI(t, bin, nil, append(args, "--output", "xml")...)
		if want := `--output "xml": want text (or table), json or yaml`; bad.code != 2 || !strings.Contains(bad.stderr, want) {
			t.Errorf("%s --output xml: exit %d, stderr %q; want 2 saying %q", name, bad.code, bad.stderr, want)
		}
		comp := runCLI(t, bin, nil, append(append([]string{"__complete"}, args...), "--output", "")...)
		got := completions(comp.stdout)
		if !slices.Equal(got, []string{"text", "table", "json", "yaml"}) {
			t.Errorf("%s: --output completes to %q", name, got)
		}
	}
}

// completions returns the candidates of a `workmesh __complete` answer,
// without their descriptions and the directive line.
func completions(out string) []string {
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" || strings.HasPrefix(line, ":") {
			continue
		}
		got = append(got, strings.SplitN(line, "\t", 2)[0])
	}
	return got
}

// TestCLI_ErrorsReadable runs a gateway and two workers as a user would:
// one drops every request (its stream is reset, as when a worker dies
// mid-request), the other stops without draining, so that its record still
// offers its work type but nothing answers at its address. The attempts'
// errors read "connection lost" and "unreachable: <cause>", in the JSON
// answer and in submit's summary line, with no transport internals.
func TestCLI_ErrorsReadable(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	// Polling off: the stopped worker stays a candidate, so that its
	// attempt is the dial that fails.
	a := startNodeProcess(t, bin, "--work-types", "echo", "--poll-interval", "0", "--poll-success-threshold", "0", "--connect-timeout", "500ms")
	dropper := startNodeProcess(t, bin, "--work-types", "sleep", "--bootstrap", a.join, "--fault-drop-rate", "1")
	gone := startNodeProcess(t, bin, "--work-types", "sha256", "--bootstrap", a.join, "--drain-timeout", "0")
	testkit.WaitFor(t, 15*time.Second, "sha256 served by the second worker", func() error {
		r := runCLI(t, bin, nil, "submit", "--api", a.api, "--type", "sha256", "--payload", "hello", "--output", "json")
		if r.code == 0 && decodeResponse(t, r).Worker == gone.peerID {
			return nil
		}
		return fmt.Errorf("exit %d, %s %s", r.code, r.stdout, r.stderr)
	})
	testkit.WaitFor(t, 15*time.Second, "the gateway lists the dropping worker", func() error {
		ids, err := peersOf(t, bin, a.api)
		if err != nil || !slices.Contains(ids, dropper.peerID) {
			return fmt.Errorf("peers %v, %v", ids, err)
		}
		return nil
	})

	internals := []string{"code: 0x", "stream reset", "failed to dial", "transport error", "\n  *"}
	check := func(what string, args []string, want string) {
		t.Helper()
		r := runCLI(t, bin, nil, append([]string{"submit", "--api", a.api, "--output", "json"}, args...)...)
		resp := decodeResponse(t, r)
		if len(resp.Attempts) == 0 || resp.Attempts[0].Error != want {
			t.Errorf("%s: attempts %+v, want the first one's error %q", what, resp.Attempts, want)
		}
		text := runCLI(t, bin, nil, append([]string{"submit", "--api", a.api}, args...)...)
		lines := strings.Split(strings.TrimSpace(text.stderr), "\n")
		if !strings.Contains(lines[0], "["+want+"]") {
			t.Errorf("%s: summary line %q lacks [%s]", what, lines[0], want)
		}
		for _, bad := range internals {
			if strings.Contains(r.stdout+text.stderr, bad) {
				t.Errorf("%s: shows %q:\n%s\n%s", what, bad, r.stdout, text.stderr)
			}
		}
		for _, l := range lines {
			// "…" starts a short peer ID or ends a clipped error; after a
			// letter it would mark a word cut in two.
			for i := strings.Index(l, "…"); i > 0; i = indexFrom(l, "…", i+1) {
				if c := l[i-1]; c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
					t.Errorf("%s: a word cut in %q", what, l)
				}
			}
		}
	}
	check("a dropped request", []string{"--type", "sleep", "--payload", "1ms"}, "connection lost")

	// A work type nobody serves: the error names what is on offer now,
	// the peers' types and the gateway's own.
	r := runCLI(t, bin, nil, "submit", "--api", a.api, "--type", "blake3", "--payload", "x")
	if want := "on offer: echo, sha256, sleep"; r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Errorf("unknown work type: exit %d, stderr %q; want 2 saying %q", r.code, r.stderr, want)
	}

	if err := gone.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-gone.done
	check("a worker that stopped", []string{"--type", "sha256", "--payload", "hello"}, "unreachable: no answer within 500ms")
}

// indexFrom is strings.Index of sub in s from byte from on, or -1.
func indexFrom(s, sub string, from int) int {
	if from > len(s) {
		return -1
	}
	if i := strings.Index(s[from:], sub); i >= 0 {
		return from + i
	}
	return -1
}

// TestCLI_PeerLeft stops a worker gracefully (SIGTERM: it withdraws its
// work types, drains, stops) and reads the gateway: `workmesh peers` shows
// it as left, in the table and in JSON, and the gateway's log says "peer
// left" rather than a liveness failure, even once its polls have marked it
// unreachable.
func TestCLI_PeerLeft(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	a := startNodeProcess(t, bin, "--work-types", "echo", "--poll-interval", "250ms", "--poll-failure-threshold", "1")
	b := startNodeProcess(t, bin, "--work-types", "sleep", "--bootstrap", a.join)
	testkit.WaitFor(t, 15*time.Second, "the gateway lists the worker", func() error {
		ids, err := peersOf(t, bin, a.api)
		if err != nil || !slices.Contains(ids, b.peerID) {
			return fmt.Errorf("peers %v, %v", ids, err)
		}
		return nil
	})
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-b.done
	state := func() string {
		r := runCLI(t, bin, nil, "peers", "--api", a.api, "--output", "json")
		var peers []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &peers); err != nil {
			return fmt.Sprintf("exit %d, %q: %v", r.code, r.stdout, err)
		}
		for _, p := range peers {
			if p.ID == b.peerID {
				return p.State
			}
		}
		return "not listed"
	}
	testkit.WaitFor(t, 10*time.Second, "the worker shown as left", func() error {
		if s := state(); s != "left" {
			return fmt.Errorf("state %s", s)
		}
		return nil
	})
	// Its polls fail from now on: liveness marks it unreachable, and it
	// still reads left.
	testkit.WaitFor(t, 10*time.Second, "liveness marks the worker unreachable", func() error {
		if v, _ := testkit.MetricValue(scrape(t, a.api), "workmesh_liveness_transitions_total", map[string]string{"to": "unreachable"}); v < 1 {
			return fmt.Errorf("%v transitions to unreachable", v)
		}
		return nil
	})
	if s := state(); s != "left" {
		t.Errorf("once unreachable by liveness, the worker reads %s, want left", s)
	}
	table := runCLI(t, bin, nil, "peers", "--api", a.api)
	if !strings.Contains(table.stdout, "1 peer: 1 left") || !strings.Contains(table.stdout, short(b.peerID)+"  left") {
		t.Errorf("peers table:\n%s\nwant the worker left", table.stdout)
	}
	log := a.stderr.String()
	if !strings.Contains(log, "peer left") {
		t.Errorf("the gateway's log lacks \"peer left\":\n%s", log)
	}
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "level=info") && strings.Contains(l, "peer liveness changed") && strings.Contains(l, b.peerID) {
			t.Errorf("the gateway logs a liveness failure for a peer that left: %s", l)
		}
	}
}

// TestCLI_JSONLogs runs a gateway and a worker with --log-format json at
// debug, sends work through them and stops the worker: stdout stays empty,
// every stderr line is a JSON object, the startup facts come as a "ready"
// line with fields, and every duration is a number of milliseconds in a
// field named *_ms (none is a time.Duration's nanoseconds).
func TestCLI_JSONLogs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	a := startNodeProcess(t, bin, "--work-types", "echo")
	cmd := exec.Command(bin, "node", "start", "--listen", loopbackQUIC, "--api", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--log-level", "debug", "--log-format", "json", "--work-types", "sha256", "--bootstrap", a.join, "--drain-timeout", "2s")
	cmd.Env = cliEnv(t, nil)
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done, exited := make(chan error, 1), make(chan struct{})
	go func() {
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
	lines := func() []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
			if l == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("a stderr line is not JSON: %q", l)
			}
			out = append(out, m)
		}
		return out
	}
	var ready map[string]any
	testkit.WaitFor(t, 15*time.Second, "the worker's ready line", func() error {
		for _, m := range lines() {
			if m["msg"] == "ready" {
				ready = m
				return nil
			}
		}
		return fmt.Errorf("no ready line yet")
	})
	id, _ := ready["peer_id"].(string)
	if id == "" || !strings.Contains(fmt.Sprint(ready["join"]), "--bootstrap ") || ready["api"] == "" || ready["listen"] == nil {
		t.Errorf("ready line %v: want peer_id, listen, join and api", ready)
	}
	testkit.WaitFor(t, 15*time.Second, "sha256 served by the worker", func() error {
		r := runCLI(t, bin, nil, "submit", "--api", a.api, "--type", "sha256", "--payload", "hello", "--output", "json")
		if r.code == 0 && decodeResponse(t, r).Worker == id {
			return nil
		}
		return fmt.Errorf("exit %d, %s %s", r.code, r.stdout, r.stderr)
	})
	// Its own API dispatches too: request and attempt lines.
	runCLI(t, bin, nil, "submit", "--api", ready["api"].(string), "--type", "echo", "--payload", "x")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-done
	if stdout.String() != "" {
		t.Errorf("stdout with --log-format json: %q, want nothing", stdout.String())
	}
	seen := map[string]bool{}
	for _, m := range lines() {
		for k, v := range m {
			switch k {
			case "duration", "took", "drain_timeout", "elapsed", "rtt":
				t.Errorf("line %v: field %s, want %s_ms", m, k, k)
			}
			if strings.HasSuffix(k, "_ms") {
				seen[k] = true
				if _, ok := v.(float64); !ok {
					t.Errorf("line %v: %s is %T, want a number of milliseconds", m, k, v)
				}
			}
		}
	}
	for _, k := range []string{"duration_ms", "drain_timeout_ms", "took_ms"} {
		if !seen[k] {
			t.Errorf("no line has %s; log:\n%s", k, stderr.String())
		}
	}
}

// TestCLI_VersionTokenCompletion checks `workmesh --version`, the API token
// read from a file by node start and by the client commands, and that
// completion offers the work types of the network the node is in and the
// values of the enum settings.
func TestCLI_VersionTokenCompletion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	flag, cmd := runCLI(t, bin, nil, "--version"), runCLI(t, bin, nil, "version")
	if flag.code != 0 || flag.stdout != cmd.stdout || !strings.HasPrefix(flag.stdout, "workmesh ") {
		t.Errorf("--version: exit %d, %q; version: %q", flag.code, flag.stdout, cmd.stdout)
	}

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open-token")
	if err := os.WriteFile(open, []byte("s3cret-token-0123456789\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, bin, nil, "node", "start", "--listen", loopbackQUIC, "--api", "127.0.0.1:0", "--api-token-file", open, "--data-dir", t.TempDir()); r.code != 2 || !strings.Contains(r.stderr, "chmod 600") {
		t.Errorf("node start with a token file others can read: exit %d, stderr %q; want 2 saying chmod 600", r.code, r.stderr)
	}
	n := startNodeProcess(t, bin, "--work-types", "sleep", "--api-token-file", tokenFile)
	submit := []string{"submit", "--api", n.api, "--type", "sleep", "--payload", "1ms"}
	if r := runCLI(t, bin, nil, submit...); r.code != 2 || !strings.Contains(r.stderr, "401") {
		t.Errorf("submit without the token: exit %d, stderr %q; want 2, refused", r.code, r.stderr)
	}
	if r := runCLI(t, bin, nil, append(submit, "--api-token-file", tokenFile)...); r.code != 0 || r.stdout != "slept 1ms\n" {
		t.Errorf("submit --api-token-file: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLIEnv(t, bin, []string{"WORKMESH_API_TOKEN=s3cret-token-0123456789"}, submit...); r.code != 0 {
		t.Errorf("submit with WORKMESH_API_TOKEN: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, c := range [][]string{{"status"}, {"peers"}, {"plan", "--type", "sleep"}} {
		if r := runCLI(t, bin, nil, append(c, "--api", n.api, "--api-token-file", tokenFile)...); r.code != 0 {
			t.Errorf("%s --api-token-file: exit %d, stderr %q", c[0], r.code, r.stderr)
		}
	}
	if r := runCLI(t, bin, nil, append(submit, "--api-token-file", open)...); r.code != 2 || !strings.Contains(r.stderr, "chmod 600") {
		t.Errorf("submit with a token file others can read: exit %d, stderr %q", r.code, r.stderr)
	}

	// Completion: the node's own types and its peer's, with the token.
	startNodeProcess(t, bin, "--work-types", "sha256", "--bootstrap", n.join)
	testkit.WaitFor(t, 15*time.Second, "completion offers the peer's work type", func() error {
		r := runCLI(t, bin, nil, "__complete", "submit", "--api", n.api, "--api-token-file", tokenFile, "--type", "")
		if got := completions(r.stdout); !slices.Equal(got, []string{"sha256", "sleep"}) {
			return fmt.Errorf("completes to %q", got)
		}
		return nil
	})
	for _, c := range [][]string{{"plan"}, {"peers"}} {
		r := runCLIEnv(t, bin, []string{"WORKMESH_API=" + n.api, "WORKMESH_API_TOKEN=s3cret-token-0123456789"}, append(append([]string{"__complete"}, c...), "--type", "")...)
		if got := completions(r.stdout); !slices.Equal(got, []string{"sha256", "sleep"}) {
			t.Errorf("%s --type completes to %q with WORKMESH_API", c[0], got)
		}
	}
	// No node at --api: the built-in types.
	r := runCLI(t, bin, nil, "__complete", "submit", "--api", freeLoopbackAddr(t), "--type", "")
	if got := completions(r.stdout); !slices.Equal(got, []string{"echo", "sha256", "sleep"}) {
		t.Errorf("--type without a node completes to %q, want the built-in types", got)
	}
	for flag, want := range map[string][]string{
		"--selection-mode":   {"rating", "round-robin", "random"},
		"--accept-work-from": {"any", "allowlist"},
		"--log-level":        {"trace", "debug", "info", "warn", "error"},
		"--log-format":       {"text", "json"},
	} {
		for _, c := range [][]string{{"node", "start"}, {"config", "print"}, {"config", "validate"}} {
			r := runCLI(t, bin, nil, append(append([]string{"__complete"}, c...), flag, "")...)
			if got := completions(r.stdout); !slices.Equal(got, want) {
				t.Errorf("%s %s completes to %q, want %q", strings.Join(c, " "), flag, got, want)
			}
		}
	}
	r = runCLI(t, bin, nil, "__complete", "node", "start", "--work-types", "")
	if got := completions(r.stdout); !slices.Contains(got, "http") || !slices.Contains(got, "sha256") {
		t.Errorf("node start --work-types completes to %q, want every work type of the binary", got)
	}
}

// TestCLI_NodeStartHelpGrouped reads `node start --help` as a new operator
// would: its flags stand under headed groups in a fixed order, each flag
// once and in its topic, and the jargon is explained in plain words.
func TestCLI_NodeStartHelpGrouped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	r := runCLI(t, bin, nil, "node", "start", "--help")
	if r.code != 0 {
		t.Fatalf("exit %d, %s", r.code, r.stderr)
	}
	headings := []string{"Node:", "Network:", "API:", "Work:", "Selection:", "Liveness:", "Access:", "Faults:", "Work type http:", "Work type jsonrpc:", "Other flags:"}
	groupOf := map[string]string{}
	heading, seen := "", []string{}
	for _, l := range strings.Split(r.stdout, "\n") {
		for _, h := range headings {
			if strings.HasPrefix(l, h) {
				heading = h
				seen = append(seen, h)
			}
		}
		f := strings.Fields(l)
		if heading == "" || len(f) == 0 {
			continue
		}
		name := f[0]
		if name == "-h," && len(f) > 1 {
			name = f[1]
		}
		if strings.HasPrefix(name, "--") {
			if g, dup := groupOf[name]; dup {
				t.Errorf("%s stands under %s and %s", name, g, heading)
			}
			groupOf[name] = heading
		}
	}
	if !slices.Equal(seen, headings) {
		t.Errorf("headings %q, want %q", seen, headings)
	}
	for flag, want := range map[string]string{
		"--network": "Network:", "--bootstrap": "Network:", "--api": "API:", "--data-dir": "Node:", "--config": "Node:",
		"--hedge-delay": "Work:", "--max-spawn-attempts": "Work:", "--selection-mode": "Selection:",
		"--label-balancing-order": "Selection:", "--poll-interval": "Liveness:", "--accept-work-from": "Access:",
		"--api-token": "Access:", "--api-token-file": "Access:", "--fault-drop-rate": "Faults:",
		"--http-allow": "Work type http:", "--jsonrpc-upstream": "Work type jsonrpc:", "--help": "Other flags:",
	} {
		if groupOf[flag] != want {
			t.Errorf("%s stands under %q, want %q", flag, groupOf[flag], want)
		}
	}
	// Every setting is there: config print lists them all.
	cp := runCLI(t, bin, nil, "config", "print", "--output", "json")
	var settings []struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal([]byte(cp.stdout), &settings); err != nil {
		t.Fatal(err)
	}
	for _, s := range settings {
		if flag := "--" + strings.ReplaceAll(s.Key, ".", "-"); groupOf[flag] == "" {
			t.Errorf("setting %s: %s is in no group of the help", s.Key, flag)
		}
	}
	for _, plain := range []string{"a hedge is a second copy of a request", "a spawn attempt is one", "a head is the newest"} {
		if !strings.Contains(strings.Join(strings.Fields(r.stdout), " "), plain) {
			t.Errorf("the help does not explain %q", plain)
		}
	}
}
