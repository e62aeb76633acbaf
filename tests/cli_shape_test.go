package tests

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
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
