package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// writeConfig writes a YAML settings file and returns its path.
func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// problemLines returns the problems an error on stderr lists: the text
// after "workmesh: config: " for one, the indented lines under
// "workmesh: config (N problems):" for several.
func problemLines(stderr string) []string {
	stderr = strings.TrimSpace(stderr)
	if rest, ok := strings.CutPrefix(stderr, "workmesh: config: "); ok {
		return []string{rest}
	}
	lines := strings.Split(stderr, "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "workmesh: config (") {
		return nil
	}
	for i := range lines {
		lines[i] = strings.TrimPrefix(lines[i], "  ")
	}
	return lines[1:]
}

const knownTypesList = "echo, http, jsonrpc, sha256, sleep"

// `workmesh config validate` checks the settings as node start loads
// them and names every problem with its source; every configuration
// error exits 2, on every command that loads settings.
func TestCLI_ConfigChecked(t *testing.T) {
	bin := buildBinary(t)

	t.Run("a good file", func(t *testing.T) {
		path := writeConfig(t, "network: demo\nmax-retries: 2\nwork-types: [echo, sha256, http]\n")
		r := runCLIEnv(t, bin, nil, "config", "validate", "--config", path)
		if r.code != 0 || !strings.HasPrefix(r.stdout, "config ok: ") || r.stderr != "" {
			t.Errorf("exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
		}
	})

	t.Run("a file with three problems", func(t *testing.T) {
		path := writeConfig(t, `network: demo
max-retries: -1
selection-mode: best
work-types:
  - echo
  - echo
`)
		// In the order of the settings' declaration, node settings first.
		want := []string{
			fmt.Sprintf(`work-types entry 2 duplicates "echo" (file %s line 6)`, path),
			fmt.Sprintf("max-retries -1 must be >= 0 (file %s line 2)", path),
			fmt.Sprintf(`selection-mode "best" is not one of rating, round-robin, random (file %s line 3)`, path),
		}
		for _, args := range [][]string{{"config", "validate"}, {"config", "print"}, {"node", "start"}} {
			r := runCLIEnv(t, bin, nil, append(args, "--config", path)...)
			got := problemLines(r.stderr)
			if r.code != 2 || strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("%s: exit %d, want 2\nstderr:\n%s\nwant the lines:\n%s", strings.Join(args, " "), r.code, r.stderr, strings.Join(want, "\n"))
			}
		}
	})

	t.Run("a YAML syntax error", func(t *testing.T) {
		path := writeConfig(t, "network: demo\nmax-retries 2\nlabels: [a, b]\n")
		for _, args := range [][]string{{"config", "validate"}, {"config", "print"}, {"node", "start"}} {
			r := runCLIEnv(t, bin, nil, append(args, "--config", path)...)
			want := fmt.Sprintf("workmesh: config: file %s: yaml: line 2: ", path)
			if r.code != 2 || !strings.HasPrefix(r.stderr, want) {
				t.Errorf("%s: exit %d, want 2 and stderr starting %q\nstderr: %s", strings.Join(args, " "), r.code, want, r.stderr)
			}
		}
	})

	t.Run("a missing file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "missing.yaml")
		r := runCLIEnv(t, bin, nil, "config", "validate", "--config", path)
		if r.code != 2 || !strings.Contains(r.stderr, path) {
			t.Errorf("exit %d, want 2 naming %s: %s", r.code, path, r.stderr)
		}
	})

	t.Run("a bad env value", func(t *testing.T) {
		r := runCLIEnv(t, bin, []string{"WORKMESH_MAX_RETRIES=-1", "WORKMESH_WORKER_TIMEOUT=soon"}, "config", "validate")
		want := []string{
			`worker-timeout: want a duration such as "500ms", got string "soon" (env WORKMESH_WORKER_TIMEOUT)`,
			"max-retries -1 must be >= 0 (env WORKMESH_MAX_RETRIES)",
		}
		if got := problemLines(r.stderr); r.code != 2 || strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("exit %d, want 2\nstderr:\n%s\nwant:\n%s", r.code, r.stderr, strings.Join(want, "\n"))
		}
	})

	t.Run("a bad flag", func(t *testing.T) {
		r := runCLIEnv(t, bin, nil, "config", "validate", "--max-retries", "-1", "--poll-interval", "0s")
		want := []string{
			"max-retries -1 must be >= 0 (flag --max-retries)",
			"poll-success-threshold 2 needs poll-interval > 0 (polling is off) (flag --poll-interval)",
		}
		if got := problemLines(r.stderr); r.code != 2 || strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("exit %d, want 2\nstderr:\n%s\nwant:\n%s", r.code, r.stderr, strings.Join(want, "\n"))
		}
		r = runCLIEnv(t, bin, nil, "config", "validate", "--max-retries", "many")
		if r.code != 2 || !strings.Contains(r.stderr, `"--max-retries"`) {
			t.Errorf("a flag that does not parse: exit %d, want 2 naming the flag: %s", r.code, r.stderr)
		}
	})

	t.Run("an unknown work type", func(t *testing.T) {
		path := writeConfig(t, "work-types: [echo, sha265]\n")
		for _, tt := range []struct {
			env  []string
			args []string
			want string
		}{
			{args: []string{"--config", path}, want: fmt.Sprintf(`work-types entry 2 "sha265" is not a work type of this binary: want one of %s (file %s line 1)`, knownTypesList, path)},
			{env: []string{"WORKMESH_WORK_TYPES=resize"}, want: `work-types entry 1 "resize" is not a work type of this binary: want one of ` + knownTypesList + ` (env WORKMESH_WORK_TYPES)`},
			{args: []string{"--work-types", "echo,resize"}, want: `work-types entry 2 "resize" is not a work type of this binary: want one of ` + knownTypesList + ` (flag --work-types)`},
		} {
			for _, cmd := range [][]string{{"config", "validate"}, {"node", "start"}} {
				r := runCLIEnv(t, bin, tt.env, append(cmd, tt.args...)...)
				if got := problemLines(r.stderr); r.code != 2 || len(got) != 1 || got[0] != tt.want {
					t.Errorf("%s %v %v: exit %d, want 2\nstderr: %s\nwant:   %s", strings.Join(cmd, " "), tt.env, tt.args, r.code, r.stderr, tt.want)
				}
			}
		}
	})

	t.Run("a comma string for a list", func(t *testing.T) {
		path := writeConfig(t, "labels: fast,full\nwork-types: echo,sha256\n")
		for _, tt := range []struct {
			source string
			env    []string
			args   []string
		}{
			{"file", nil, []string{"--config", path}},
			{"env", []string{"WORKMESH_LABELS=fast,full", "WORKMESH_WORK_TYPES=echo,sha256"}, nil},
			{"flag", nil, []string{"--labels", "fast,full", "--work-types", "echo,sha256"}},
		} {
			r := runCLIEnv(t, bin, tt.env, append([]string{"config", "print", "--output", "json"}, tt.args...)...)
			if r.code != 0 {
				t.Errorf("%s: exit %d: %s", tt.source, r.code, r.stderr)
				continue
			}
			var settings []struct{ Key, Value, Source string }
			if err := json.Unmarshal([]byte(r.stdout), &settings); err != nil {
				t.Fatalf("%s: %v\n%s", tt.source, err, r.stdout)
			}
			got := map[string]string{}
			for _, s := range settings {
				got[s.Key] = s.Value + " from " + s.Source
			}
			if got["labels"] != "fast,full from "+tt.source || got["work-types"] != "echo,sha256 from "+tt.source {
				t.Errorf("%s: labels %q, work-types %q", tt.source, got["labels"], got["work-types"])
			}
			// Two work types, each known; one "echo,sha256" would not be.
			if r := runCLIEnv(t, bin, tt.env, append([]string{"config", "validate"}, tt.args...)...); r.code != 0 {
				t.Errorf("%s: config validate: exit %d: %s", tt.source, r.code, r.stderr)
			}
		}
	})
}

// startNodeEnv starts `workmesh node start` on loopback with env added to
// a clean environment and returns the API address it printed once ready.
// The process is killed when the test ends.
func startNodeEnv(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	args = append([]string{"node", "start", "--listen", loopbackQUIC, "--data-dir", t.TempDir(), "--log-level", "warn"}, args...)
	cmd := exec.Command(bin, args...)
	cmd.Env = cliEnv(t, env)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	found := make(chan string, 1)
	go func() {
		defer close(done)
		api := ""
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			switch line := sc.Text(); {
			case strings.HasPrefix(line, "api: "):
				api = strings.TrimPrefix(line, "api: ")
			case line == "ready":
				found <- api
			}
		}
		close(found)
		cmd.Wait()
	}()
	select {
	case api, ok := <-found:
		if !ok {
			t.Fatalf("node exited before ready; stderr:\n%s", stderr)
		}
		return api
	case <-time.After(15 * time.Second):
		t.Fatalf("node not ready within 15s; stderr:\n%s", stderr)
	}
	return ""
}

// WORKMESH_API is the client commands' target and never moves the API a
// node listens on; an unknown WORKMESH_* variable is refused the same way
// by every command.
func TestCLI_Environment(t *testing.T) {
	bin := buildBinary(t)
	const clientTarget = "WORKMESH_API=127.0.0.1:1"

	t.Run("WORKMESH_API does not move the node's API", func(t *testing.T) {
		flagAPI := startNodeEnv(t, bin, []string{clientTarget}, "--api", "127.0.0.1:0")
		envAPI := startNodeEnv(t, bin, []string{clientTarget, "WORKMESH_NODE_API=127.0.0.1:0"})
		for name, api := range map[string]string{"--api": flagAPI, "WORKMESH_NODE_API": envAPI} {
			if !strings.HasPrefix(api, "127.0.0.1:") || api == "127.0.0.1:0" || api == "127.0.0.1:1" {
				t.Errorf("node started with %s 127.0.0.1:0 and %s: api %q", name, clientTarget, api)
				continue
			}
			// submit takes its target from WORKMESH_API.
			r := runCLIEnv(t, bin, []string{"WORKMESH_API=" + api}, "submit", "--type", "echo", "--payload", "hi")
			if r.code != 0 || r.stdout != "hi\n" {
				t.Errorf("submit with WORKMESH_API=%s: exit %d, stdout %q, stderr %s", api, r.code, r.stdout, r.stderr)
			}
		}
		r := runCLIEnv(t, bin, []string{clientTarget}, "submit", "--type", "echo", "--payload", "hi")
		if r.code != 2 || !strings.Contains(r.stderr, "cannot reach the node's API at 127.0.0.1:1 ") {
			t.Errorf("submit with %s: exit %d, want 2 naming the target: %s", clientTarget, r.code, r.stderr)
		}
	})

	t.Run("an unknown WORKMESH_ variable", func(t *testing.T) {
		const want = "workmesh: config: environment variable WORKMESH_FOO is not a workmesh variable; " +
			"workmesh reads WORKMESH_API, WORKMESH_API_TOKEN and WORKMESH_<KEY> for every setting key " +
			"`workmesh config print` lists (WORKMESH_MAX_RETRIES for max-retries, but WORKMESH_NODE_API for api)\n"
		for _, args := range [][]string{
			{"node", "start", "--listen", loopbackQUIC, "--api", "127.0.0.1:0"},
			{"submit", "--type", "echo", "--payload", "hi", "--api", "127.0.0.1:1"},
			{"config", "print"},
			{"config", "validate"},
			{"status", "--api", "127.0.0.1:1"},
			{"devnet", "--api", "127.0.0.1:0"},
		} {
			r := runCLIEnv(t, bin, []string{"WORKMESH_FOO=1", "WORKMESH_API=127.0.0.1:1"}, args...)
			if r.code != 2 || r.stderr != want || r.stdout != "" {
				t.Errorf("%s: exit %d, want 2\nstderr %q\nwant   %q\nstdout %q", strings.Join(args, " "), r.code, r.stderr, want, r.stdout)
			}
		}
		// A typo is named with the variable it is nearest to.
		r := runCLIEnv(t, bin, []string{"WORKMESH_MAX_RETRYS=3"}, "submit", "--type", "echo", "--api", "127.0.0.1:1")
		if r.code != 2 || !strings.Contains(r.stderr, `WORKMESH_MAX_RETRYS is not a workmesh variable, did you mean "WORKMESH_MAX_RETRIES"?`) {
			t.Errorf("a typo: exit %d: %s", r.code, r.stderr)
		}
	})
}

// TestCLI_ConfigChecksTheAPIToken: config validate and config print check
// the API's address and token as node start does, with --api-token-file:
// an exposed API without a token, or with a guessable one, exits 2 naming
// why; a random token from a file passes and shows as set from a flag.
func TestCLI_ConfigChecksTheAPIToken(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	tokenFile := func(token string) string {
		path := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	weak, good := tokenFile("aaaaaaaaaaaaaaaa"), tokenFile("6f1c9e0a7b3d24e85f9a0c1b")
	for _, cmd := range [][]string{{"config", "validate"}, {"config", "print"}} {
		name := strings.Join(cmd, " ")
		if r := runCLIEnv(t, bin, nil, append(cmd, "--api", "0.0.0.0:7400")...); r.code != 2 || !strings.Contains(r.stderr, "not loopback: set api-token") {
			t.Errorf("%s, exposed without a token: exit %d, stderr %q; want 2 naming the token", name, r.code, r.stderr)
		}
		if r := runCLIEnv(t, bin, nil, append(cmd, "--api", "0.0.0.0:7400", "--api-token-file", weak)...); r.code != 2 || !strings.Contains(r.stderr, "too easy to guess") {
			t.Errorf("%s, a guessable token: exit %d, stderr %q; want 2 saying it is too easy to guess", name, r.code, r.stderr)
		}
		r := runCLIEnv(t, bin, nil, append(cmd, "--api", "0.0.0.0:7400", "--api-token-file", good)...)
		if r.code != 0 {
			t.Errorf("%s, a random token: exit %d, stderr %q; want 0", name, r.code, r.stderr)
		}
		if cmd[1] == "print" && !regexp.MustCompile(`api-token\s+\(set, hidden\)\s+flag`).MatchString(r.stdout) {
			t.Errorf("config print does not show the token as set from a flag:\n%s", r.stdout)
		}
	}
}
