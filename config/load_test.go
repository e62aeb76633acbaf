package config

import (
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// flags returns a flag set with every setting bound and args parsed.
func flags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("workmesh", pflag.ContinueOnError)
	BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs
}

func TestLoad_Precedence(t *testing.T) {
	const file = `
worker-timeout: 2s
work-types: [echo]
label-balancing: {order: [full], pass-on-error: true}
`
	tests := []struct {
		name        string
		file        bool
		env         []string
		args        []string
		wantTimeout time.Duration
		wantTypes   []string
		wantOrder   []string
		wantPass    bool
	}{
		{name: "defaults", wantTimeout: 500 * time.Millisecond, wantTypes: []string{"echo", "sha256", "sleep"}},
		{name: "file over defaults", file: true, wantTimeout: 2 * time.Second, wantTypes: []string{"echo"}, wantOrder: []string{"full"}, wantPass: true},
		{
			name: "env over file", file: true,
			env:         []string{"WORKMESH_WORKER_TIMEOUT=3s", "WORKMESH_WORK_TYPES=sha256", "WORKMESH_LABEL_BALANCING_PASS_ON_ERROR=false"},
			wantTimeout: 3 * time.Second, wantTypes: []string{"sha256"}, wantOrder: []string{"full"}, wantPass: false,
		},
		{
			name: "flag over env and file", file: true,
			env:         []string{"WORKMESH_WORKER_TIMEOUT=3s", "WORKMESH_WORK_TYPES=sha256"},
			args:        []string{"--worker-timeout=4s", "--work-types=sleep", "--label-balancing-order=archive"},
			wantTimeout: 4 * time.Second, wantTypes: []string{"sleep"}, wantOrder: []string{"archive"}, wantPass: true,
		},
		{
			name: "flag over file", file: true, args: []string{"--worker-timeout=4s"},
			wantTimeout: 4 * time.Second, wantTypes: []string{"echo"}, wantOrder: []string{"full"}, wantPass: true,
		},
		{
			name: "flag over env", env: []string{"WORKMESH_WORKER_TIMEOUT=3s"}, args: []string{"--worker-timeout=4s"},
			wantTimeout: 4 * time.Second, wantTypes: []string{"echo", "sha256", "sleep"},
		},
		{
			name: "unchanged flags do not override", file: true, env: []string{"WORKMESH_WORKER_TIMEOUT=3s"}, args: []string{"--max-retries=2"},
			wantTimeout: 3 * time.Second, wantTypes: []string{"echo"}, wantOrder: []string{"full"}, wantPass: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := LoadOptions{Environ: tt.env, Flags: flags(t, tt.args...)}
			if tt.file {
				opts.File = writeFile(t, file)
			}
			c, err := Load(opts)
			if err != nil {
				t.Fatal(err)
			}
			if c.Worker.WorkerTimeout != tt.wantTimeout {
				t.Errorf("worker-timeout = %s, want %s", c.Worker.WorkerTimeout, tt.wantTimeout)
			}
			if !reflect.DeepEqual(c.Node.WorkTypes, tt.wantTypes) {
				t.Errorf("work-types = %q, want %q", c.Node.WorkTypes, tt.wantTypes)
			}
			if tt.wantOrder == nil {
				if c.LabelBalancing != nil {
					t.Errorf("label-balancing = %s, want off", showLB(c.LabelBalancing))
				}
				return
			}
			if c.LabelBalancing == nil || !reflect.DeepEqual(c.LabelBalancing.Order, tt.wantOrder) || c.LabelBalancing.PassOnError != tt.wantPass {
				t.Errorf("label-balancing = %s, want order %q pass-on-error %t", showLB(c.LabelBalancing), tt.wantOrder, tt.wantPass)
			}
		})
	}
}

func TestLoad_UnknownFileKey(t *testing.T) {
	tests := []struct{ yaml, key, hint string }{
		{"worker-timout: 1s\n", "worker-timout", `, did you mean "worker-timeout"?`},
		{"label-balancing: {order: [full], oder: [x]}\n", "label-balancing.oder", `, did you mean "label-balancing.order"?`},
		{"work-type-defaults: {sha256: {retry-delay: 1s}}\n", "work-type-defaults.sha256.retry-delay", ""},
		{"work-type-defaults: {sha256: {label-balancing: {order: [a], bogus: 1}}}\n", "work-type-defaults.sha256.label-balancing.bogus", ""},
		{"Worker-Timeout: 1s\n", "Worker-Timeout", `, did you mean "worker-timeout"?`}, // one spelling per setting: keys are case-sensitive
		{"worker_timeout: 1s\n", "worker_timeout", `, did you mean "worker-timeout"?`},
	}
	for _, tt := range tests {
		path := writeFile(t, tt.yaml)
		_, err := Load(LoadOptions{File: path})
		want := fmt.Sprintf("config: unknown key %q%s (file %s line 1)", tt.key, tt.hint, path)
		if err == nil || err.Error() != want {
			t.Errorf("Load(%q) = %v, want %q", tt.yaml, err, want)
		}
		if !errors.Is(err, ErrUnknownSetting) {
			t.Errorf("Load(%q) error does not wrap ErrUnknownSetting", tt.yaml)
		}
	}
}

func TestLoad_WrongType(t *testing.T) {
	tests := []struct{ yaml, want string }{
		{"max-retries: abc\n", `max-retries: want an integer, got string "abc"`},
		{"max-retries: 1.5\n", `max-retries: want an integer, got number 1.5`},
		{"worker-timeout: 5\n", `worker-timeout: want a duration with a unit such as "500ms", got integer 5`},
		{"worker-timeout: soon\n", `worker-timeout: want a duration such as "500ms", got string "soon"`},
		{"network: 42\n", `network: want a string, got integer 42`},
		{"listen: {a: b}\n", `listen: want a list of strings, got a mapping`},
		{"labels: [full, 2]\n", `labels: entry 2: want a string, got integer 2`},
		{"rating-error-weight: high\n", `rating-error-weight: want a number, got string "high"`},
		{"label-balancing: [full]\n", `label-balancing: want a mapping, got a list`},
		{"label-balancing: {order: [full], pass-on-error: maybe}\n", `label-balancing.pass-on-error: want true or false, got string "maybe"`},
		{"work-type-defaults: [sha256]\n", `work-type-defaults: want a mapping from name to settings, got a list`},
		{"work-type-defaults: {sha256: {label-balancing: {order: 3}}}\n", `work-type-defaults.sha256.label-balancing.order: want a list of strings, got integer 3`},
	}
	for _, tt := range tests {
		path := writeFile(t, tt.yaml)
		_, err := Load(LoadOptions{File: path})
		want := fmt.Sprintf("config: %s (file %s line 1)", tt.want, path)
		if err == nil || err.Error() != want {
			t.Errorf("Load(%q) = %v\nwant %s", tt.yaml, err, want)
		}
		if !errors.Is(err, ErrBadValue) {
			t.Errorf("Load(%q) error does not wrap ErrBadValue", tt.yaml)
		}
	}
}

func TestLoad_UnknownEnv(t *testing.T) {
	_, err := Load(LoadOptions{Environ: []string{
		"HOME=/root", "PATH=/bin", "workmesh_worker_timeout=1s", // not ours: ignored
		"WORKMESH_WORKER_TIMOUT=1s",
	}})
	want := "config: environment variable WORKMESH_WORKER_TIMOUT is not a workmesh variable, " +
		`did you mean "WORKMESH_WORKER_TIMEOUT"? workmesh reads WORKMESH_<KEY> for every setting key ` +
		"`workmesh config print` lists (WORKMESH_MAX_RETRIES for max-retries, but WORKMESH_NODE_API for api)"
	if err == nil || err.Error() != want {
		t.Fatalf("Load = %v, want %q", err, want)
	}
	if !errors.Is(err, ErrUnknownSetting) {
		t.Errorf("error does not wrap ErrUnknownSetting")
	}
	// The file-only block has no environment variables.
	_, err = Load(LoadOptions{Environ: []string{"WORKMESH_WORK_TYPE_DEFAULTS=x"}})
	if !errors.Is(err, ErrUnknownSetting) {
		t.Errorf("WORKMESH_WORK_TYPE_DEFAULTS: Load = %v, want ErrUnknownSetting", err)
	}
	// A bad value names its variable.
	_, err = Load(LoadOptions{Environ: []string{"WORKMESH_MAX_RETRIES=many"}})
	want = `config: max-retries: want an integer, got string "many" (env WORKMESH_MAX_RETRIES)`
	if err == nil || err.Error() != want || !errors.Is(err, ErrBadValue) {
		t.Errorf("Load = %v, want %q wrapping ErrBadValue", err, want)
	}
}

func TestLoad_Durations(t *testing.T) {
	path := writeFile(t, `
worker-timeout: 1s
worker-response-timeout: 500ms
redial-backoff-max: 1m30s
hedge-delay: 0
`)
	c, err := Load(LoadOptions{
		File:    path,
		Environ: []string{"WORKMESH_RETRY_DELAY=750ms", "WORKMESH_RATING_WINDOW=2m"},
		Flags:   flags(t, "--connect-timeout=3s"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name      string
		got, want time.Duration
	}{
		{"worker-timeout", c.Worker.WorkerTimeout, time.Second},
		{"worker-response-timeout", c.Worker.WorkerResponseTimeout, 500 * time.Millisecond},
		{"redial-backoff-max", c.Liveness.RedialBackoffMax, 90 * time.Second},
		{"hedge-delay", c.Hedge.Delay, 0},
		{"retry-delay", c.Worker.RetryDelay, 750 * time.Millisecond},
		{"rating-window", c.Rating.Window, 2 * time.Minute},
		{"connect-timeout", c.Worker.ConnectTimeout, 3 * time.Second},
	} {
		if tt.got != tt.want {
			t.Errorf("%s = %s, want %s", tt.name, tt.got, tt.want)
		}
	}
	_, err = Load(LoadOptions{Environ: []string{"WORKMESH_RETRY_DELAY=10"}})
	if err == nil || !strings.Contains(err.Error(), "WORKMESH_RETRY_DELAY") {
		t.Errorf("a duration without unit in the environment: Load = %v, want an error naming the variable", err)
	}
}

func TestLoad_EnvSlices(t *testing.T) {
	tests := []struct {
		env  string
		want []string
		get  func(c Config) []string
	}{
		{"WORKMESH_LABEL_BALANCING_ORDER=full,archive", []string{"full", "archive"}, func(c Config) []string { return c.LabelBalancing.Order }},
		{"WORKMESH_LABEL_BALANCING_ORDER= full , archive ", []string{"full", "archive"}, func(c Config) []string { return c.LabelBalancing.Order }},
		{"WORKMESH_WORK_TYPES=echo", []string{"echo"}, func(c Config) []string { return c.Node.WorkTypes }},
		{"WORKMESH_LABELS=", []string{}, func(c Config) []string { return c.Node.Labels }},
		{"WORKMESH_LISTEN=/ip4/0.0.0.0/tcp/4001,/ip4/0.0.0.0/udp/4001/quic-v1", []string{"/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/udp/4001/quic-v1"}, func(c Config) []string { return c.Node.Listen }},
	}
	for _, tt := range tests {
		c, err := Load(LoadOptions{Environ: []string{tt.env}})
		if err != nil {
			t.Errorf("%s: %v", tt.env, err)
			continue
		}
		if got := tt.get(c); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s gave %q, want %q", tt.env, got, tt.want)
		}
	}
	// An empty entry is kept, so that validation reports it.
	_, err := Load(LoadOptions{Environ: []string{"WORKMESH_LABEL_BALANCING_ORDER=full,,archive"}})
	if err == nil || err.Error() != "config: label-balancing: order entry 2 is empty (env WORKMESH_LABEL_BALANCING_ORDER)" {
		t.Errorf("Load = %v, want the empty entry reported", err)
	}
}

func TestLoad_MissingFile(t *testing.T) {
	path := t.TempDir() + "/missing.yaml"
	_, err := Load(LoadOptions{File: path})
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "config: file "+path+": ") {
		t.Errorf("Load = %v, want a not-exist error naming %s", err, path)
	}
	_, err = Load(LoadOptions{File: writeFile(t, "worker-timeout: [1s\n")})
	if err == nil || !strings.Contains(err.Error(), "yaml: line 1:") || !errors.Is(err, ErrSyntax) {
		t.Errorf("Load of broken YAML = %v, want a YAML error with its line", err)
	}
}

func TestLoad_ValidatesAndReportsAll(t *testing.T) {
	path := writeFile(t, `
max-remote-workers: 0
poll-interval: 0s
work-type-defaults:
  sha256:
    label-balancing: {order: [full, full]}
`)
	_, err := Load(LoadOptions{File: path})
	want := `config (3 problems):
  max-remote-workers 0 must be >= 1 (file ` + path + ` line 2)
  poll-success-threshold 2 needs poll-interval > 0 (polling is off) (file ` + path + ` line 3)
  label-balancing for work type sha256: order entry 2 duplicates "full" (file ` + path + ` line 6)`
	if err == nil || err.Error() != want {
		t.Fatalf("Load = %v\nwant %s", err, want)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Error("error does not wrap ErrInvalid")
	}
	// Problems in the sources are all reported too, before validation.
	path = writeFile(t, "worker-timout: 1s\nmax-retries: x\n")
	_, err = Load(LoadOptions{File: path, Environ: []string{"WORKMESH_NOPE=1"}})
	if err == nil || !strings.HasPrefix(err.Error(), "config (3 problems):\n") {
		t.Errorf("Load = %v, want 3 problems", err)
	}
}

func TestExplain_Sources(t *testing.T) {
	path := writeFile(t, `
worker-timeout: 2s
max-retries: 2
work-type-defaults:
  sha256:
    label-balancing: {order: [archive]}
`)
	got, err := Explain(LoadOptions{
		File:    path,
		Environ: []string{"WORKMESH_MAX_RETRIES=3", "WORKMESH_HEDGE_DELAY=50ms"},
		Flags:   flags(t, "--hedge-delay=70ms", "--labels=fast,full"),
	})
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]Setting{}
	var keys []string
	for _, s := range got {
		if _, dup := byKey[s.Key]; dup {
			t.Errorf("Explain lists %s twice", s.Key)
		}
		byKey[s.Key] = s
		keys = append(keys, s.Key)
	}
	for _, want := range []Setting{
		{"worker-timeout", "2s", SourceFile},
		{"max-retries", "3", SourceEnv},
		{"hedge-delay", "70ms", SourceFlag},
		{"labels", "fast,full", SourceFlag},
		{"connect-timeout", "1s", SourceDefault},
		{"work-types", "echo,sha256,sleep", SourceDefault},
		{"rating-error-weight", "4", SourceDefault},
		{"bootstrap", "", SourceDefault},
		{"work-type-defaults.sha256.label-balancing.order", "archive", SourceFile},
		{"work-type-defaults.sha256.label-balancing.include-default", "true", SourceDefault},
	} {
		if g := byKey[want.Key]; g != want {
			t.Errorf("Explain %s = %+v, want %+v", want.Key, g, want)
		}
	}
	if _, ok := byKey["label-balancing.order"]; ok {
		t.Error("Explain lists label-balancing.order while label balancing is off")
	}
	// Every flag-settable setting but the global label-balancing ones,
	// plus the sha256 override's four (its verify too).
	if want := len(mustSchema().settings) - 3 + 4; len(got) != want {
		t.Errorf("Explain listed %d settings, want %d: %q", len(got), want, keys)
	}
	if _, err := Explain(LoadOptions{Environ: []string{"WORKMESH_NOPE=1"}}); !errors.Is(err, ErrUnknownSetting) {
		t.Errorf("Explain with a bad source = %v, want its error", err)
	}
}

func TestBindFlags_OneNamePerSetting(t *testing.T) {
	fs := flags(t)
	s := mustSchema()
	d := Defaults()
	kebab := regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*(\.[a-z0-9]+(-[a-z0-9]+)*)*$`)
	n := 0
	fs.VisitAll(func(*pflag.Flag) { n++ })
	if n != len(s.settings) {
		t.Errorf("BindFlags registered %d flags for %d settings", n, len(s.settings))
	}
	for _, st := range s.settings {
		if !kebab.MatchString(st.key) {
			t.Errorf("key %q is not kebab-case", st.key)
		}
		if want := strings.ReplaceAll(st.key, ".", "-"); st.flag != want {
			t.Errorf("flag of %s = %q, want %q", st.key, st.flag, want)
		}
		wantEnv := "WORKMESH_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(st.key))
		if st.key == "api" {
			wantEnv = "WORKMESH_NODE_API" // WORKMESH_API is the client commands' target
		}
		if st.env != wantEnv {
			t.Errorf("env of %s = %q, want %q", st.key, st.env, wantEnv)
		}
		f := fs.Lookup(st.flag)
		if f == nil {
			t.Errorf("no flag --%s", st.flag)
			continue
		}
		if f.Usage == "" || help[st.key] == "" {
			t.Errorf("flag --%s has no help text", st.flag)
		}
		// The flag's default is the setting's default (for a block that is
		// off, the default it takes once on).
		v, _ := st.value(reflect.ValueOf(&d), true)
		want := format(st.kind, v)
		got := f.DefValue
		if st.kind == kindStrings {
			got = strings.Trim(got, "[]")
		}
		if got != want {
			t.Errorf("flag --%s default %q, want %q", st.flag, got, want)
		}
	}
	for key := range help {
		if s.byKey[key] == nil {
			t.Errorf("help has %q, which is no flag-settable setting", key)
		}
	}
	for _, name := range []string{"worker-timeout", "label-balancing-order", "label-balancing-pass-on-error", "label-balancing-include-default"} {
		if fs.Lookup(name) == nil {
			t.Errorf("no flag --%s", name)
		}
	}
	for _, name := range []string{"WORKMESH_WORKER_TIMEOUT", "WORKMESH_LABEL_BALANCING_ORDER", "WORKMESH_LABEL_BALANCING_INCLUDE_DEFAULT"} {
		if s.byEnv[name] == nil {
			t.Errorf("no environment variable %s", name)
		}
	}
}

// A flag set that also holds flags of its own (cobra's --help, a --config
// flag) loads fine: those are not settings.
func TestLoad_ForeignFlagsIgnored(t *testing.T) {
	fs := pflag.NewFlagSet("workmesh", pflag.ContinueOnError)
	BindFlags(fs)
	cfg := fs.String("config", "", "config file")
	if err := fs.Parse([]string{"--config=/nowhere.yaml", "--max-retries=0"}); err != nil {
		t.Fatal(err)
	}
	c, err := Load(LoadOptions{Flags: fs})
	if err != nil || c.Worker.MaxRetries != 0 || *cfg != "/nowhere.yaml" {
		t.Errorf("Load = %+v, %v", c.Worker, err)
	}
}
