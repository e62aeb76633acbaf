package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/api"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// fakeNode is a work API in front of a canned dispatcher, recording what it
// was asked.
type fakeNode struct {
	srv *httptest.Server
	got []dispatch.WorkRequest
	res dispatch.WorkResult
}

func newFakeNode(t *testing.T, res dispatch.WorkResult) *fakeNode {
	t.Helper()
	f := &fakeNode{res: res}
	api, err := api.NewWork(func(_ context.Context, req dispatch.WorkRequest) dispatch.WorkResult {
		f.got = append(f.got, req)
		return f.res
	})
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(api)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeNode) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

// runRoot runs the root command with args and stdin and returns the exit
// code main would use, stdout and stderr.
func runRoot(t *testing.T, stdin []byte, args ...string) (int, string, string) {
	t.Helper()
	cmd := newRootCommand()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetIn(bytes.NewReader(stdin))
	cmd.SetArgs(args)
	err := cmd.Execute()
	if err == nil {
		return 0, stdout.String(), stderr.String()
	}
	return exitCode(err), stdout.String(), stderr.String() + "workmesh: " + err.Error()
}

func TestSubmitExitCodes(t *testing.T) {
	attempts := []apiv1.Attempt{
		{Peer: "12D3KooWAAAAAAAAdeadpeer", Outcome: workers.Unreachable, DurationMS: 500, Group: "full", Error: "connect: timeout"},
		{Peer: "12D3KooWBBBBBBBBlivepeer", Outcome: workers.Success, DurationMS: 2.5, Group: "archive"},
	}
	for _, tc := range []struct {
		name       string
		res        dispatch.WorkResult
		code       int
		stdout     string
		stderrHas  []string
		jsonStatus string
	}{
		{"ok", dispatch.WorkResult{Status: apiv1.StatusOK, Output: []byte("digest"), Worker: "12D3KooWBBBBBBBBlivepeer", Attempts: attempts, Duration: 503 * time.Millisecond},
			0, "digest\n", []string{"ok by …livepeer in 503ms", "2 attempts: …deadpeer unreachable 500ms (group full) [connect: timeout], …livepeer success 2.5ms (group archive)"}, "ok"},
		{"ok with a newline", dispatch.WorkResult{Status: apiv1.StatusOK, Output: []byte("line\n"), Worker: "local"}, 0, "line\n", []string{"ok by local"}, "ok"},
		{"empty", dispatch.WorkResult{Status: apiv1.StatusEmpty, Worker: "local"}, 0, "", []string{"empty by local"}, "empty"},
		{"failed", dispatch.WorkResult{Status: apiv1.StatusFailed, Worker: "local", Error: "sleep: payload \"x\" is not a duration"}, 1, "", []string{"work failed: sleep: payload"}, "failed"},
		{"unavailable", dispatch.WorkResult{Status: apiv1.StatusUnavailable, Error: "no worker could take the work: no peer advertises work type nosuch"}, 2, "",
			[]string{"unavailable", "no peer advertises work type nosuch"}, "unavailable"},
		{"timeout", dispatch.WorkResult{Status: apiv1.StatusTimeout, Error: "no result within 300ms"}, 3, "", []string{"timed out: no result within 300ms"}, "timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeNode(t, tc.res)
			code, stdout, stderr := runRoot(t, nil, "submit", "--api", f.addr(), "--type", "sha256", "--payload", "hello")
			if code != tc.code || stdout != tc.stdout {
				t.Errorf("exit %d, stdout %q; want %d, %q (stderr %s)", code, stdout, tc.code, tc.stdout, stderr)
			}
			for _, want := range tc.stderrHas {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr %q lacks %q", stderr, want)
				}
			}
			code, stdout, _ = runRoot(t, nil, "submit", "--api", f.addr(), "--type", "sha256", "--payload", "hello", "--output", "json")
			var resp apiv1.WorkResponse
			if err := json.Unmarshal([]byte(stdout), &resp); err != nil {
				t.Fatalf("json output %q: %v", stdout, err)
			}
			if code != tc.code || string(resp.Status) != tc.jsonStatus {
				t.Errorf("json: exit %d status %q; want %d %q", code, resp.Status, tc.code, tc.jsonStatus)
			}
			if !strings.Contains(stdout, "\n  \"status\"") {
				t.Errorf("json output is not indented: %q", stdout)
			}
		})
	}
}

func TestSubmitBuildsTheRequest(t *testing.T) {
	f := newFakeNode(t, dispatch.WorkResult{Status: apiv1.StatusOK, Worker: "local"})
	file := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(file, []byte("from a file"), 0o600); err != nil {
		t.Fatal(err)
	}
	head := uint64(7)
	for _, tc := range []struct {
		name  string
		stdin []byte
		args  []string
		want  dispatch.WorkRequest
	}{
		{"payload flag", nil, []string{"--payload", "hi", "--timeout", "2s", "--labels", "full,eu", "--min-head", "7"},
			dispatch.WorkRequest{Type: "echo", Payload: []byte("hi"), Timeout: 2 * time.Second, Labels: []string{"full", "eu"}, MinHead: &head}},
		{"payload file", nil, []string{"--payload-file", file}, dispatch.WorkRequest{Type: "echo", Payload: []byte("from a file")}},
		{"text on stdin", []byte("piped"), nil, dispatch.WorkRequest{Type: "echo", Payload: []byte("piped")}},
		{"bytes on stdin", []byte{0xff, 0, 0xfe}, nil, dispatch.WorkRequest{Type: "echo", Payload: []byte{0xff, 0, 0xfe}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.got = nil
			args := append([]string{"submit", "--api", f.addr(), "--type", "echo"}, tc.args...)
			if code, _, stderr := runRoot(t, tc.stdin, args...); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if len(f.got) != 1 {
				t.Fatalf("%d requests", len(f.got))
			}
			got := f.got[0]
			if got.Type != tc.want.Type || !bytes.Equal(got.Payload, tc.want.Payload) || got.Timeout != tc.want.Timeout ||
				strings.Join(got.Labels, ",") != strings.Join(tc.want.Labels, ",") ||
				(got.MinHead == nil) != (tc.want.MinHead == nil) || (got.MinHead != nil && *got.MinHead != *tc.want.MinHead) {
				t.Errorf("sent %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestSubmitUsageErrors(t *testing.T) {
	f := newFakeNode(t, dispatch.WorkResult{Status: apiv1.StatusOK})
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"no type", []string{"--payload", "x"}, "--type is required"},
		{"two payloads", []string{"--type", "echo", "--payload", "x", "--payload-file", "y"}, "not both"},
		{"missing file", []string{"--type", "echo", "--payload-file", filepath.Join(t.TempDir(), "nope")}, "--payload-file"},
		{"bad output", []string{"--type", "echo", "--payload", "x", "--output", "xml"}, "--output"},
		{"bad timeout", []string{"--type", "echo", "--payload", "x", "--timeout", "soon"}, "timeout"},
		{"unknown flag", []string{"--type", "echo", "--colour"}, "colour"},
		{"refused by the API", []string{"--type", "bad type", "--payload", "x"}, "type: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runRoot(t, nil, append([]string{"submit", "--api", f.addr()}, tc.args...)...)
			if code != 2 || !strings.Contains(stderr, tc.says) {
				t.Errorf("exit %d, stderr %q; want 2 saying %q", code, stderr, tc.says)
			}
		})
	}
	if len(f.got) != 0 {
		t.Errorf("usage errors dispatched work: %+v", f.got)
	}
}

func TestSubmitAPIFromEnvironment(t *testing.T) {
	f := newFakeNode(t, dispatch.WorkResult{Status: apiv1.StatusOK, Output: []byte("x")})
	t.Setenv(apiEnv, f.addr())
	if code, _, stderr := runRoot(t, nil, "submit", "--type", "echo", "--payload", "x"); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if len(f.got) != 1 {
		t.Errorf("%s not used: %d requests", apiEnv, len(f.got))
	}
	// The flag wins over the environment.
	t.Setenv(apiEnv, "127.0.0.1:1")
	if code, _, stderr := runRoot(t, nil, "submit", "--api", f.addr(), "--type", "echo", "--payload", "x"); code != 0 {
		t.Fatalf("--api did not win over %s: exit %d: %s", apiEnv, code, stderr)
	}
}

func TestSubmitUnreachableAPI(t *testing.T) {
	f := newFakeNode(t, dispatch.WorkResult{Status: apiv1.StatusOK})
	addr := f.addr()
	f.srv.Close()
	code, _, stderr := runRoot(t, nil, "submit", "--api", addr, "--type", "echo", "--payload", "x")
	if code != 2 || !strings.Contains(stderr, "cannot reach the node's API at "+addr) {
		t.Errorf("exit %d, stderr %q; want 2 naming %s", code, stderr, addr)
	}
}

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"truncated", 5, "trunc…"},
		{"héllo", 2, "h…"}, // é is two bytes: not split
		{"upstream answered: bad gateway", 24, "upstream answered: bad …"},
		{"upstream answered, bad gateway", 20, "upstream answered …"}, // no word cut, no dangling comma
	} {
		if got := clip(tc.in, tc.n); got != tc.want {
			t.Errorf("clip(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
