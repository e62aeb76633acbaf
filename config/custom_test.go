package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func loadYAML(t *testing.T, text string) (Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return Load(LoadOptions{File: path, KnownWorkTypes: []string{"echo", "sha256", "sleep", "http", "jsonrpc"}})
}

// TestCustomTypesLoad: the block of the issue loads into CustomTypes.
func TestCustomTypesLoad(t *testing.T) {
	c, err := loadYAML(t, `
work-types: [echo, upper, digest, enrich]
custom-types:
  upper:
    command: ["tr", "a-z", "A-Z"]
    timeout: 5s
    idempotent: true
    deterministic: true
    env: {LANG: C, N: 3}
    concurrency: 2
  digest:
    command: ["sha256sum"]
    deterministic: true
  enrich:
    url: http://127.0.0.1:8081/enrich
    headers: {Authorization: "Bearer ...", X-Trace.Id: "a"}
    health-url: http://127.0.0.1:8081/healthz
`)
	if err != nil {
		t.Fatal(err)
	}
	up := c.CustomTypes["upper"]
	if strings.Join(up.Command, " ") != "tr a-z A-Z" || up.Timeout != 5*time.Second || !up.Idempotent || !up.Deterministic ||
		up.Env["LANG"] != "C" || up.Env["N"] != "3" || up.Concurrency != 2 {
		t.Fatalf("upper %+v", up)
	}
	en := c.CustomTypes["enrich"]
	if en.URL != "http://127.0.0.1:8081/enrich" || en.Headers["Authorization"] != "Bearer ..." || en.Headers["X-Trace.Id"] != "a" ||
		en.HealthURL != "http://127.0.0.1:8081/healthz" {
		t.Fatalf("enrich %+v", en)
	}
	if len(c.CustomTypes) != 3 || len(c.CustomTypes["digest"].Command) != 1 {
		t.Fatalf("custom types %+v", c.CustomTypes)
	}
}

// TestCustomTypesValidation: each problem of the block is reported with
// the file and line of the key at fault.
func TestCustomTypesValidation(t *testing.T) {
	_, err := loadYAML(t, `work-types: [echo, nothere, upper]
custom-types:
  nocmd:
    timeout: 1s
  both:
    command: [cat]
    url: http://127.0.0.1:1/x
  ftp:
    url: ftp://127.0.0.1/x
  echo:
    command: [cat]
  badtime:
    command: [cat]
    timeout: soon
  upper:
    command: [tr, a-z, A-Z]
  neg:
    command: [cat]
    max-output: -1
  hdr:
    url: http://127.0.0.1:1/x
    headers: {A: [1, 2]}
`)
	if err == nil {
		t.Fatal("a bad custom-types block loaded")
	}
	msg := err.Error()
	for _, want := range []string{
		"custom-types nocmd: needs a command (a list: [program, args...]) or a url (file ",
		"custom-types both: has both a command and a url: give one (custom-types.both.url from file ",
		`custom-types ftp: url "ftp://127.0.0.1/x" is not http or https (file `,
		`custom-types "echo" clashes with the built-in work type of that name: choose another name (file `,
		"custom-types.badtime.timeout: ",
		"max-output -1 must be >= 0",
		`work-types entry 2 "nothere" is not a work type of this binary`,
		"custom-types.hdr.headers: A: want a string",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
	for key, line := range map[string]string{"nocmd:": "line 3", "both: has": "line 6", "ftp: url": "line 9", `"echo" clashes`: "line 10", "max-output -1": "line 19"} {
		i := strings.Index(msg, key)
		if i < 0 {
			continue
		}
		rest := msg[i:]
		if j := strings.IndexByte(rest, '\n'); j >= 0 {
			rest = rest[:j]
		}
		if !strings.Contains(rest, line+")") {
			t.Errorf("%s: %q does not name %s", key, rest, line)
		}
	}
	if strings.Contains(msg, `"upper" is not a work type`) {
		t.Errorf("a declared custom type listed in work-types was refused:\n%s", msg)
	}
}
