package config

import (
	"reflect"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// pinnedDefaults is every top-level setting of Defaults(), by koanf key.
// Changing a default is a behaviour change for every user: it must be a
// deliberate edit here, never a side effect.
var pinnedDefaults = map[string]any{
	"network":                "workmesh",
	"listen":                 []string{"/ip4/0.0.0.0/udp/4001/quic-v1", "/ip4/0.0.0.0/tcp/4001"},
	"bootstrap":              []string(nil),
	"data-dir":               "",
	"api":                    "127.0.0.1:7400",
	"labels":                 []string(nil),
	"work-types":             []string{"echo", "sha256", "sleep"},
	"announce-interval":      5 * time.Minute,
	"record-ttl":             15 * time.Minute,
	"log-level":              "info",
	"log-format":             "text",
	"drain-timeout":          10 * time.Second,
	"peer-table-cap":         10000,
	"newcomer-dials":         8,
	"newcomer-dial-interval": 2 * time.Second,

	"reachability": "auto", "announce": []string(nil), "no-announce": []string(nil), "mdns": false,
	"relay": []string(nil), "relay-service": true, "relay-max-reservations": 128, "relay-max-circuits": 16,
	"relay-limit-bytes": 1 << 17, "relay-limit-duration": 2 * time.Minute, "hole-punching": true,
	"public-ranges": []string(nil),

	"worker-timeout":              500 * time.Millisecond,
	"worker-response-timeout":     250 * time.Millisecond,
	"rtt-factor":                  3.0,
	"rtt-margin":                  100 * time.Millisecond,
	"peer-wait-max":               5 * time.Second,
	"max-retries":                 15,
	"max-spawn-attempts":          3,
	"worker-buffer-size":          100,
	"max-remote-workers":          16,
	"connect-timeout":             time.Second,
	"retry-delay":                 10 * time.Millisecond,
	"local-concurrency":           4,
	"retry-budget-window":         10 * time.Second,
	"retry-budget-ratio":          0.2,
	"retry-budget-min-per-second": 10.0,
	"admission-queue-size":        1024,
	"local-reserve":               0.25,

	"selection-mode": "rating",

	"poll-interval":          2 * time.Second,
	"poll-failure-threshold": 5,
	"poll-success-threshold": 2,
	"poll-budget":            512,
	"redial-backoff-min":     500 * time.Millisecond,
	"redial-backoff-max":     30 * time.Second,
	"stall-threshold":        2,
	"stall-cordon":           30 * time.Second,

	"rating-window":          30 * time.Second,
	"rating-min-samples":     3,
	"rating-spread":          1,
	"rating-latency-weight":  1.0,
	"rating-error-weight":    4.0,
	"rating-busy-weight":     2.0,
	"rating-head-lag-weight": 1.0,
	"rating-load-weight":     1.0,
	"rating-latency-floor":   time.Millisecond,

	"hedge-delay":        100 * time.Millisecond,
	"hedge-max-count":    0,
	"hedge-quantile":     0.95,
	"hedge-delay-factor": 2.0,
	"hedge-delay-min":    2 * time.Millisecond,
	"hedge-delay-max":    time.Second,
	"hedge-window":       30 * time.Second,
	"hedge-min-samples":  20,

	"accept-work-from": "any",
	"allow-peer":       []string(nil),
	"peer-max-streams": 64,
	"peer-rate":        0.0,
	"peer-burst":       100,
	"api-token":        "",

	"fault-error-rate": 0.0,
	"fault-delay":      time.Duration(0),
	"fault-drop-rate":  0.0,

	"http-allow":    []string(nil),
	"http-max-body": 1 << 20,

	"jsonrpc-upstream":      "",
	"jsonrpc-chain-id":      "",
	"jsonrpc-head-interval": 2 * time.Second,
	"jsonrpc-methods":       []string{"eth_*", "net_*", "web3_*"},
	"network-authority":     "",
	"membership-cert":       "",

	"label-balancing":    (*LabelBalancingConfig)(nil),
	"work-type-defaults": map[string]WorkTypeConfig(nil),
	"custom-types":       map[string]CustomTypeConfig(nil),
	"max-payload":        1 << 20,
	"max-result":         1 << 20,

	"explore-share":     0.1,
	"audit-rate":        0.0,
	"dispute-threshold": 3,
	"dispute-window":    time.Minute,
	"dispute-cordon":    5 * time.Minute,
}

// pinnedFields is the number of fields of every struct type reachable from
// Config. A new field fails this test until its default is pinned above (or,
// for a block that is off by default, below) and its bound is validated.
var pinnedFields = map[string]int{
	"Config":               16,
	"AccessConfig":         6,
	"FaultConfig":          3,
	"HTTPConfig":           2,
	"JSONRPCConfig":        4,
	"MembershipConfig":     2,
	"NodeConfig":           27,
	"WorkerConfig":         17,
	"SelectionConfig":      1,
	"LivenessConfig":       8,
	"RatingConfig":         9,
	"HedgeConfig":          8,
	"LabelBalancingConfig": 3,
	"WorkTypeConfig":       2,
	"CustomTypeConfig":     14,
	"LimitsConfig":         2,
	"TrustConfig":          5,
}

func TestDefaults_Unchanged(t *testing.T) {
	t.Run("every default is pinned", func(t *testing.T) {
		s := mustSchema()
		d := Defaults()
		v := reflect.ValueOf(d)
		seen := map[string]bool{}
		for _, f := range s.fields[v.Type()] {
			seen[f.name] = true
			want, ok := pinnedDefaults[f.name]
			if !ok {
				t.Errorf("default of %q is not pinned in pinnedDefaults", f.name)
				continue
			}
			if got := v.FieldByIndex(f.index).Interface(); !reflect.DeepEqual(got, want) {
				t.Errorf("default %s = %#v, want %#v", f.name, got, want)
			}
		}
		for key := range pinnedDefaults {
			if !seen[key] {
				t.Errorf("pinnedDefaults has %q, which is no setting", key)
			}
		}
	})

	t.Run("every struct field is counted", func(t *testing.T) {
		counted := map[string]bool{}
		var walk func(reflect.Type)
		walk = func(typ reflect.Type) {
			switch typ.Kind() {
			case reflect.Pointer, reflect.Slice, reflect.Map:
				walk(typ.Elem())
				return
			case reflect.Struct:
			default:
				return
			}
			if typ.PkgPath() != reflect.TypeFor[Config]().PkgPath() || counted[typ.Name()] {
				return
			}
			counted[typ.Name()] = true
			want, ok := pinnedFields[typ.Name()]
			if !ok {
				t.Errorf("struct %s is not in pinnedFields", typ.Name())
			} else if typ.NumField() != want {
				t.Errorf("%s has %d fields, pinnedFields says %d: pin the new field's default and bound", typ.Name(), typ.NumField(), want)
			}
			for i := range typ.NumField() {
				walk(typ.Field(i).Type)
			}
		}
		walk(reflect.TypeFor[Config]())
		for name := range pinnedFields {
			if !counted[name] {
				t.Errorf("pinnedFields has %s, which Config no longer holds", name)
			}
		}
	})

	t.Run("a label-balancing block takes its own defaults", func(t *testing.T) {
		lb := &LabelBalancingConfig{Order: []string{"full"}}
		lb.SetDefaults()
		want := &LabelBalancingConfig{Order: []string{"full"}, PassOnError: false, IncludeDefault: boolPtr(true)}
		if !reflect.DeepEqual(lb, want) {
			t.Errorf("SetDefaults() gave %s, want %s", showLB(lb), showLB(want))
		}
	})

	t.Run("loading nothing gives Defaults", func(t *testing.T) {
		fs := pflag.NewFlagSet("workmesh", pflag.ContinueOnError)
		BindFlags(fs)
		if err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		c, err := Load(LoadOptions{Flags: fs, Environ: []string{"HOME=/root"}})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c, Defaults()) {
			t.Errorf("Load with no settings = %+v, want Defaults() %+v", c, Defaults())
		}
	})

	// The seed review's point 1: turning label balancing on must not move
	// any other default (there, the retry delay silently dropped to zero).
	enable := []struct {
		name string
		opts func(t *testing.T) LoadOptions
	}{
		{"file", func(t *testing.T) LoadOptions {
			return LoadOptions{File: writeFile(t, "label-balancing:\n  order: [full, archive]\n")}
		}},
		{"env", func(t *testing.T) LoadOptions {
			return LoadOptions{Environ: []string{"WORKMESH_LABEL_BALANCING_ORDER=full,archive"}}
		}},
		{"flag", func(t *testing.T) LoadOptions {
			fs := pflag.NewFlagSet("workmesh", pflag.ContinueOnError)
			BindFlags(fs)
			if err := fs.Parse([]string{"--label-balancing-order=full,archive"}); err != nil {
				t.Fatal(err)
			}
			return LoadOptions{Flags: fs}
		}},
	}
	for _, e := range enable {
		t.Run("enabling label-balancing by "+e.name+" changes nothing else", func(t *testing.T) {
			c, err := Load(e.opts(t))
			if err != nil {
				t.Fatal(err)
			}
			want := &LabelBalancingConfig{Order: []string{"full", "archive"}, IncludeDefault: boolPtr(true)}
			if !reflect.DeepEqual(c.LabelBalancing, want) {
				t.Errorf("label-balancing = %s, want %s", showLB(c.LabelBalancing), showLB(want))
			}
			c.LabelBalancing = nil
			if !reflect.DeepEqual(c, Defaults()) {
				t.Errorf("enabling label-balancing changed other settings:\n got %+v\nwant %+v", c, Defaults())
			}
		})
	}
}
