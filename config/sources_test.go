package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// problemLines returns the lines of a Load error after its heading.
func problemLines(err error) []string {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "config: "); ok {
		return []string{rest}
	}
	lines := strings.Split(msg, "\n")[1:]
	for i := range lines {
		lines[i] = strings.TrimPrefix(lines[i], "  ")
	}
	return lines
}

func TestLoad_ProblemSources(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		env  []string
		args []string
		want []string // {file} stands for the file's path
	}{
		{
			name: "each entry of a block list on its own line",
			yaml: "network: demo\nwork-types:\n  - echo\n  - echo\nlabels: [a, \"\"]\n",
			want: []string{
				`labels entry 2 is empty (file {file} line 5)`,
				`work-types entry 2 duplicates "echo" (file {file} line 4)`,
			},
		},
		{
			name: "the same setting from env and from a flag",
			env:  []string{"WORKMESH_MAX_RETRIES=-1"},
			args: []string{"--hedge-max-count=-2"},
			want: []string{
				`max-retries -1 must be >= 0 (env WORKMESH_MAX_RETRIES)`,
				`hedge-max-count -2 must be >= 0 (flag --hedge-max-count)`,
			},
		},
		{
			name: "two settings from two sources",
			yaml: "announce-interval: 1m\n",
			env:  []string{"WORKMESH_RECORD_TTL=30s"},
			want: []string{`record-ttl 30s must be > announce-interval 1m0s, or records expire between announcements ` +
				`(record-ttl from env WORKMESH_RECORD_TTL, announce-interval from file {file} line 1)`},
		},
		{
			name: "the other setting of a pair, when only it was set",
			yaml: "\nannounce-interval: 1h\n",
			want: []string{`record-ttl 15m0s must be > announce-interval 1h0m0s, or records expire between announcements (file {file} line 2)`},
		},
		{
			name: "a block turned on by env without its order",
			env:  []string{"WORKMESH_LABEL_BALANCING_PASS_ON_ERROR=true"},
			want: []string{`label-balancing: order is required when label-balancing is set (env WORKMESH_LABEL_BALANCING_PASS_ON_ERROR)`},
		},
		{
			name: "a block in the file without its order",
			yaml: "network: demo\nlabel-balancing:\n  pass-on-error: true\n",
			want: []string{`label-balancing: order is required when label-balancing is set (file {file} line 2)`},
		},
		{
			name: "a refused value is not checked again against its default",
			yaml: "worker-timeout: 100ms\nworker-response-timeout: soon\n",
			want: []string{`worker-response-timeout: want a duration such as "500ms", got string "soon" (file {file} line 2)`},
		},
		{
			name: "problems of the sources and of validation together",
			yaml: "max-retrys: 1\nmax-remote-workers: 0\n",
			env:  []string{"WORKMESH_PEER_RATE=fast"},
			want: []string{
				`unknown key "max-retrys", did you mean "max-retries"? (file {file} line 1)`,
				`peer-rate: want a number, got string "fast" (env WORKMESH_PEER_RATE)`,
				`max-remote-workers 0 must be >= 1 (file {file} line 2)`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := LoadOptions{Environ: tt.env, Flags: flags(t, tt.args...)}
			if tt.yaml != "" {
				opts.File = writeFile(t, tt.yaml)
			}
			_, err := Load(opts)
			want := make([]string, len(tt.want))
			for i, w := range tt.want {
				want[i] = strings.ReplaceAll(w, "{file}", opts.File)
			}
			if got := problemLines(err); !reflect.DeepEqual(got, want) {
				t.Errorf("Load = %v\ngot  %q\nwant %q", err, got, want)
			}
		})
	}
}

func TestLoad_FileSyntax(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"broken YAML", "network: demo\nmax-retries 1\nlabels: [a\n", "yaml: line "},
		{"a key set twice", "network: demo\nmax-retries: 1\nmax-retries: 2\n", `key "max-retries" is set twice (first on line 2) (file {file} line 3)`},
		{"not a mapping", "- network\n", "file {file} line 1: want a mapping of settings, got a list"},
		{"a scalar", "network\n", `file {file} line 1: want a mapping of settings, got the value "network"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.yaml)
			_, err := Load(LoadOptions{File: path, Environ: []string{"WORKMESH_RECORD_TTL=1s"}})
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("Load = %v, want ErrSyntax", err)
			}
			if want := strings.ReplaceAll(tt.want, "{file}", path); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
				t.Errorf("Load = %v, want it to name %s and contain %q", err, path, want)
			}
			// The file's settings are unknown, so the others are not
			// checked against defaults in their place.
			if strings.Contains(err.Error(), "record-ttl") {
				t.Errorf("Load = %v, checked settings against a file it could not read", err)
			}
		})
	}
	if c, err := Load(LoadOptions{File: writeFile(t, "# nothing set\n")}); err != nil || !reflect.DeepEqual(c.Node, Defaults().Node) {
		t.Errorf("an empty file: Load = %+v, %v", c.Node, err)
	}
}

// A string where a list is wanted is the comma-separated list the flag
// takes, from every source.
func TestLoad_CommaStringIsAList(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		env  []string
		args []string
	}{
		{name: "file", yaml: "labels: fast,full\nwork-types: echo\nlabel-balancing: {order: 'full, archive'}\n"},
		{name: "env", env: []string{"WORKMESH_LABELS=fast,full", "WORKMESH_WORK_TYPES=echo", "WORKMESH_LABEL_BALANCING_ORDER=full, archive"}},
		{name: "flag", args: []string{"--labels=fast,full", "--work-types=echo", "--label-balancing-order=full,archive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := LoadOptions{Environ: tt.env, Flags: flags(t, tt.args...)}
			if tt.yaml != "" {
				opts.File = writeFile(t, tt.yaml)
			}
			c, err := Load(opts)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Node.Labels, []string{"fast", "full"}) || !reflect.DeepEqual(c.Node.WorkTypes, []string{"echo"}) ||
				c.LabelBalancing == nil || !reflect.DeepEqual(c.LabelBalancing.Order, []string{"full", "archive"}) {
				t.Errorf("labels %q, work-types %q, label-balancing %s", c.Node.Labels, c.Node.WorkTypes, showLB(c.LabelBalancing))
			}
		})
	}
}

func TestLoad_KnownWorkTypes(t *testing.T) {
	known := []string{"sleep", "echo", "sha256", "http", "jsonrpc"}
	path := writeFile(t, "work-types: [echo, sha265]\nwork-type-defaults:\n  shaa256:\n    label-balancing: {order: [a]}\n")
	_, err := Load(LoadOptions{File: path, KnownWorkTypes: known})
	want := []string{
		fmt.Sprintf(`work-types entry 2 "sha265" is not a work type of this binary: want one of echo, http, jsonrpc, sha256, sleep (file %s line 1)`, path),
		fmt.Sprintf(`work-type-defaults "shaa256" is not a work type of this binary: want one of echo, http, jsonrpc, sha256, sleep (file %s line 3)`, path),
	}
	if got := problemLines(err); !reflect.DeepEqual(got, want) || !errors.Is(err, ErrInvalid) {
		t.Errorf("Load = %v\ngot  %q\nwant %q", err, got, want)
	}
	_, err = Load(LoadOptions{Flags: flags(t, "--work-types=echo,nope"), KnownWorkTypes: known})
	if got := problemLines(err); len(got) != 1 || !strings.HasSuffix(got[0], "sleep (flag --work-types)") {
		t.Errorf("Load = %v, want the flag named", err)
	}
	if _, err := Load(LoadOptions{File: path}); err != nil {
		t.Errorf("without KnownWorkTypes work types are not checked: %v", err)
	}
}

// WORKMESH_API is the client commands' target, never the node's own API
// address, which is WORKMESH_NODE_API.
func TestLoad_APIEnv(t *testing.T) {
	other := []string{"WORKMESH_API", "WORKMESH_API_TOKEN"}
	c, err := Load(LoadOptions{Environ: []string{"WORKMESH_API=127.0.0.1:1"}, OtherEnv: other})
	if err != nil || c.Node.API != Defaults().Node.API {
		t.Errorf("WORKMESH_API set: api = %q, %v; want the default", c.Node.API, err)
	}
	c, err = Load(LoadOptions{Environ: []string{"WORKMESH_API=127.0.0.1:1", "WORKMESH_NODE_API=127.0.0.1:0"}, OtherEnv: other})
	if err != nil || c.Node.API != "127.0.0.1:0" {
		t.Errorf("WORKMESH_NODE_API set: api = %q, %v", c.Node.API, err)
	}
	if _, err := Load(LoadOptions{Environ: []string{"WORKMESH_API=127.0.0.1:1"}}); !errors.Is(err, ErrUnknownSetting) {
		t.Errorf("WORKMESH_API not named as another's: Load = %v, want ErrUnknownSetting", err)
	}
}

// CheckEnviron refuses with the very error Load gives.
func TestCheckEnviron(t *testing.T) {
	environ := []string{"HOME=/root", "WORKMESH_API=x", "WORKMESH_MAX_RETRIES=oops", "WORKMESH_FOO=1"}
	other := []string{"WORKMESH_API"}
	checked := CheckEnviron(environ, other...)
	_, loaded := Load(LoadOptions{Environ: environ, OtherEnv: other})
	if checked == nil || !errors.Is(checked, ErrUnknownSetting) {
		t.Fatalf("CheckEnviron = %v, want ErrUnknownSetting", checked)
	}
	if got := checked.Error(); !strings.HasPrefix(got, "config: environment variable WORKMESH_FOO is not a workmesh variable;") ||
		!strings.Contains(loaded.Error(), strings.TrimPrefix(got, "config: ")) {
		t.Errorf("CheckEnviron = %q\nLoad = %q", got, loaded)
	}
	if err := CheckEnviron([]string{"WORKMESH_API=x", "WORKMESH_NODE_API=y", "PATH=/bin"}, other...); err != nil {
		t.Errorf("CheckEnviron of known variables = %v", err)
	}
}

func TestDidYouMean(t *testing.T) {
	for _, tt := range []struct {
		name string
		want string
	}{
		{"max-retrys", `, did you mean "max-retries"?`},
		{"max-retries", `, did you mean "max-retries"?`},
		{"retries", ""},
		{"ab", ""}, // too short to guess
	} {
		if got := didYouMean(tt.name, []string{"ab-x", "max-retries", "retry-delay"}); got != tt.want {
			t.Errorf("didYouMean(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}
