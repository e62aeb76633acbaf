package config

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func boolPtr(b bool) *bool { return &b }

func TestLabelBalancing_Validation(t *testing.T) {
	tests := []struct {
		name   string
		global *LabelBalancingConfig
		sha256 *LabelBalancingConfig // override for work type sha256
		want   string                // the exact error; "" means valid
	}{
		{name: "off", want: ""},
		{name: "valid global", global: &LabelBalancingConfig{Order: []string{"full", "archive"}}},
		{name: "valid global with every field", global: &LabelBalancingConfig{Order: []string{"full"}, PassOnError: true, IncludeDefault: boolPtr(false)}},
		{name: "valid override", sha256: &LabelBalancingConfig{Order: []string{"archive", "full"}}},
		{
			name:   "empty order",
			global: &LabelBalancingConfig{PassOnError: true},
			want:   "label-balancing: order is required when label-balancing is set",
		},
		{
			name:   "empty entry",
			global: &LabelBalancingConfig{Order: []string{"", "full"}},
			want:   "label-balancing: order entry 1 is empty",
		},
		{
			name:   "duplicate entry in global",
			global: &LabelBalancingConfig{Order: []string{"full", "archive", "full"}},
			want:   `label-balancing: order entry 3 duplicates "full"`,
		},
		{
			name:   "duplicate entry in override",
			global: &LabelBalancingConfig{Order: []string{"full", "archive"}},
			sha256: &LabelBalancingConfig{Order: []string{"full", "full"}},
			want:   `label-balancing for work type sha256: order entry 2 duplicates "full"`,
		},
		{
			name:   "empty order in override",
			sha256: &LabelBalancingConfig{},
			want:   "label-balancing for work type sha256: order is required when label-balancing is set",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Defaults()
			c.LabelBalancing = tt.global
			if tt.sha256 != nil {
				c.WorkTypeDefaults = map[string]WorkTypeConfig{"sha256": {LabelBalancing: tt.sha256}}
			}
			c.SetDefaults()
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Validate() = %v, want %q", err, tt.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestLiveness_PollIntervalGuard(t *testing.T) {
	tests := []struct {
		threshold int
		interval  time.Duration
		want      string
	}{
		{threshold: 3, interval: 0, want: "poll-success-threshold 3 needs poll-interval > 0 (polling is off)"},
		{threshold: 1, interval: 0, want: "poll-success-threshold 1 needs poll-interval > 0 (polling is off)"},
		{threshold: 0, interval: 0},
		{threshold: 0, interval: time.Second},
		{threshold: 3, interval: time.Second},
	}
	for _, tt := range tests {
		c := Defaults()
		c.Liveness.PollSuccessThreshold, c.Liveness.PollInterval = tt.threshold, tt.interval
		err := c.Validate()
		if tt.want == "" {
			if err != nil {
				t.Errorf("threshold %d, interval %s: Validate() = %v, want nil", tt.threshold, tt.interval, err)
			}
			continue
		}
		if err == nil || err.Error() != tt.want || !errors.Is(err, ErrInvalid) {
			t.Errorf("threshold %d, interval %s: Validate() = %v, want %q", tt.threshold, tt.interval, err, tt.want)
		}
	}
}

func TestValidate_Bounds(t *testing.T) {
	if err := validDefaults(); err != nil {
		t.Fatalf("Defaults() do not validate: %v", err)
	}
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"network empty", func(c *Config) { c.Node.Network = "" }, "network is required"},
		{"network charset", func(c *Config) { c.Node.Network = "Work Mesh" }, `network "Work Mesh" may only hold a-z, 0-9, '-', '_' and '.'`},
		{"network slash", func(c *Config) { c.Node.Network = "a/b" }, `network "a/b" may only hold`},
		{"network length", func(c *Config) { c.Node.Network = strings.Repeat("a", 65) }, "is 65 bytes long, at most 64"},
		{"listen not multiaddr", func(c *Config) { c.Node.Listen = []string{"0.0.0.0:4001"} }, `listen entry 1 "0.0.0.0:4001" is not a multiaddr`},
		{"bootstrap without peer id", func(c *Config) { c.Node.Bootstrap = []string{"/ip4/1.2.3.4/udp/4001/quic-v1"} }, "bootstrap entry 1"},
		{"api not host:port", func(c *Config) { c.Node.API = "localhost" }, `api "localhost" is not host:port`},
		{"label empty", func(c *Config) { c.Node.Labels = []string{"full", ""} }, "labels entry 2 is empty"},
		{"work type empty", func(c *Config) { c.Node.WorkTypes = []string{""} }, "work-types entry 1 is empty"},
		{"work type repeated", func(c *Config) { c.Node.WorkTypes = []string{"echo", "echo"} }, `work-types entry 2 duplicates "echo"`},
		{"announce-interval zero", func(c *Config) { c.Node.AnnounceInterval = 0 }, "announce-interval 0s must be > 0"},
		{"record-ttl not above announce-interval", func(c *Config) { c.Node.RecordTTL = c.Node.AnnounceInterval }, "record-ttl 5m0s must be > announce-interval 5m0s"},
		{"log-level", func(c *Config) { c.Node.LogLevel = "verbose" }, `log-level "verbose" is not one of`},
		{"log-format", func(c *Config) { c.Node.LogFormat = "xml" }, `log-format "xml" is not one of text, json`},
		{"drain-timeout negative", func(c *Config) { c.Node.DrainTimeout = -time.Second }, "drain-timeout -1s must be >= 0"},
		{"worker-timeout negative", func(c *Config) { c.Worker.WorkerTimeout = -time.Second }, "worker-timeout -1s must be > 0"},
		{"worker-response-timeout negative", func(c *Config) { c.Worker.WorkerResponseTimeout = -time.Second }, "worker-response-timeout -1s must be > 0"},
		{"worker-response-timeout above worker-timeout", func(c *Config) { c.Worker.WorkerResponseTimeout = time.Second }, "worker-response-timeout 1s must be <= worker-timeout 500ms"},
		{"rtt-factor below 1", func(c *Config) { c.Worker.RTTFactor = 0.5 }, "rtt-factor 0.5 must be between 1 and 100"},
		{"rtt-factor NaN", func(c *Config) { c.Worker.RTTFactor = math.NaN() }, "rtt-factor NaN must be between 1 and 100"},
		{"rtt-factor too large", func(c *Config) { c.Worker.RTTFactor = 1000 }, "rtt-factor 1000 must be between 1 and 100"},
		{"rtt-margin negative", func(c *Config) { c.Worker.RTTMargin = -time.Millisecond }, "rtt-margin -1ms must be >= 0"},
		{"peer-wait-max zero", func(c *Config) { c.Worker.PeerWaitMax = 0 }, "peer-wait-max 0s must be > 0"},
		{"peer-wait-max below worker-timeout", func(c *Config) { c.Worker.PeerWaitMax = 100 * time.Millisecond }, "peer-wait-max 100ms must be >= worker-timeout 500ms"},
		{"max-retries negative", func(c *Config) { c.Worker.MaxRetries = -1 }, "max-retries -1 must be >= 0"},
		{"max-spawn-attempts zero", func(c *Config) { c.Worker.MaxSpawnAttempts = 0 }, "max-spawn-attempts 0 must be >= 1"},
		{"worker-buffer-size zero", func(c *Config) { c.Worker.WorkerBufferSize = 0 }, "worker-buffer-size 0 must be >= 1"},
		{"worker-buffer-size huge", func(c *Config) { c.Worker.WorkerBufferSize = 1 << 30 }, "worker-buffer-size 1073741824 must be <= 1048576"},
		{"admission-queue-size negative", func(c *Config) { c.Worker.AdmissionQueueSize = -1 }, "admission-queue-size -1 must be >= 0"},
		{"admission-queue-size huge", func(c *Config) { c.Worker.AdmissionQueueSize = 1 << 20 }, "admission-queue-size 1048576 must be <= 65536"},
		{"max-remote-workers zero", func(c *Config) { c.Worker.MaxRemoteWorkers = 0 }, "max-remote-workers 0 must be >= 1"},
		{"accept-work-from", func(c *Config) { c.Access.AcceptWorkFrom = "friends" }, `accept-work-from "friends": want any or allowlist`},
		{"allow-peer empty", func(c *Config) { c.Access.AcceptWorkFrom = "allowlist"; c.Access.AllowPeers = []string{" "} }, "allow-peer entry 1 is empty"},
		{"allowlist without peers", func(c *Config) { c.Access.AcceptWorkFrom = "allowlist" }, "accept-work-from allowlist needs at least one allow-peer"},
		{"allow-peer under any", func(c *Config) { c.Access.AllowPeers = []string{"12D3KooW"} }, "allow-peer is set but accept-work-from is any"},
		{"fault rate NaN", func(c *Config) { c.Fault.DropRate = math.NaN() }, "fault-drop-rate NaN must be between 0 and 1"},
		{"peer-rate negative", func(c *Config) { c.Access.PeerRate = -1 }, "peer-rate -1 must be >= 0"},
		{"fault-error-rate above 1", func(c *Config) { c.Fault.ErrorRate = 1.5 }, "fault-error-rate 1.5 must be between 0 and 1"},
		{"fault-delay negative", func(c *Config) { c.Fault.Delay = -time.Second }, "fault-delay -1s"},
		{"http-max-body zero", func(c *Config) { c.HTTP.MaxBody = 0 }, "http-max-body 0 must be >= 1"},
		{"jsonrpc-upstream not a URL", func(c *Config) { c.JSONRPC.Upstream = "localhost:8545" }, `jsonrpc-upstream "localhost:8545": want an http:// or https:// URL`},
		{"jsonrpc-methods empty", func(c *Config) { c.JSONRPC.Methods = []string{} }, "jsonrpc-methods is empty: list the methods to relay"},
		{"jsonrpc-methods bad entry", func(c *Config) { c.JSONRPC.Methods = []string{"eth_*", "debug *"} }, `jsonrpc-methods entry 2 "debug *": want a method name (eth_call), a namespace (eth_*) or *`},
		{"jsonrpc-methods star alone in the middle", func(c *Config) { c.JSONRPC.Methods = []string{"eth*x"} }, `jsonrpc-methods entry 1 "eth*x"`},
		{"connect-timeout zero", func(c *Config) { c.Worker.ConnectTimeout = 0 }, "connect-timeout 0s must be > 0"},
		{"retry-delay negative", func(c *Config) { c.Worker.RetryDelay = -time.Millisecond }, "retry-delay -1ms must be >= 0"},
		{"local-concurrency zero", func(c *Config) { c.Worker.LocalConcurrency = 0 }, "local-concurrency 0 must be >= 1"},
		{"selection-mode", func(c *Config) { c.Selection.Mode = "fastest" }, `selection-mode "fastest" is not one of rating, round-robin, random`},
		{"poll-interval negative", func(c *Config) { c.Liveness.PollInterval = -time.Second }, "poll-interval -1s must be >= 0"},
		{"poll-failure-threshold zero", func(c *Config) { c.Liveness.PollFailureThreshold = 0 }, "poll-failure-threshold 0 must be >= 1"},
		{"poll-success-threshold negative", func(c *Config) { c.Liveness.PollSuccessThreshold = -1 }, "poll-success-threshold -1 must be >= 0"},
		{"poll-budget negative", func(c *Config) { c.Liveness.PollBudget = -1 }, "poll-budget -1 must be >= 0"},
		{"redial-backoff-min zero", func(c *Config) { c.Liveness.RedialBackoffMin = 0 }, "redial-backoff-min 0s must be > 0"},
		{"redial-backoff-min above max", func(c *Config) { c.Liveness.RedialBackoffMin = time.Minute }, "redial-backoff-min 1m0s must be <= redial-backoff-max 30s"},
		{"stall-threshold negative", func(c *Config) { c.Liveness.StallThreshold = -1 }, "stall-threshold -1 must be >= 0"},
		{"stall-cordon zero", func(c *Config) { c.Liveness.StallCordon = 0 }, "stall-cordon 0s must be > 0"},
		{"local-reserve above 1", func(c *Config) { c.Worker.LocalReserve = 1.5 }, "local-reserve 1.5 must be between 0 and 1"},
		{"rating-window zero", func(c *Config) { c.Rating.Window = 0 }, "rating-window 0s must be > 0"},
		{"rating-min-samples negative", func(c *Config) { c.Rating.MinSamples = -1 }, "rating-min-samples -1 must be >= 0"},
		{"rating-spread zero", func(c *Config) { c.Rating.Spread = 0 }, "rating-spread 0 must be >= 1"},
		{"rating-latency-weight negative", func(c *Config) { c.Rating.LatencyWeight = -1 }, "rating-latency-weight -1 must be a finite number >= 0"},
		{"rating-error-weight NaN", func(c *Config) { c.Rating.ErrorWeight = math.NaN() }, "rating-error-weight NaN must be"},
		{"rating-busy-weight Inf", func(c *Config) { c.Rating.BusyWeight = math.Inf(1) }, "rating-busy-weight +Inf must be"},
		{"rating-head-lag-weight negative", func(c *Config) { c.Rating.HeadLagWeight = -0.5 }, "rating-head-lag-weight -0.5 must be"},
		{"rating-load-weight negative", func(c *Config) { c.Rating.LoadWeight = -2 }, "rating-load-weight -2 must be"},
		{"rating-latency-floor negative", func(c *Config) { c.Rating.LatencyFloor = -time.Millisecond }, "rating-latency-floor -1ms must be >= 0"},
		{"hedge-delay negative", func(c *Config) { c.Hedge.Delay = -time.Millisecond }, "hedge-delay -1ms must be >= 0"},
		{"hedge-max-count negative", func(c *Config) { c.Hedge.MaxCount = -1 }, "hedge-max-count -1 must be >= 0"},
		{"hedge-quantile one", func(c *Config) { c.Hedge.Quantile = 1 }, "hedge-quantile 1 must be at least 0 and below 1"},
		{"hedge-quantile NaN", func(c *Config) { c.Hedge.Quantile = math.NaN() }, "hedge-quantile NaN must be"},
		{"hedge-delay-min above max", func(c *Config) { c.Hedge.DelayMin, c.Hedge.DelayMax = time.Second, time.Millisecond },
			"hedge-delay-min 1s must be <= hedge-delay-max 1ms"},
		{"hedge-delay-max zero", func(c *Config) { c.Hedge.DelayMax = 0 }, "hedge-delay-max 0s must be > 0"},
		{"hedge-window zero", func(c *Config) { c.Hedge.Window = 0 }, "hedge-window 0s must be > 0"},
		{"hedge-min-samples zero", func(c *Config) { c.Hedge.MinSamples = 0 }, "hedge-min-samples 0 must be >= 1"},
		{"hedge-delay-factor below 1", func(c *Config) { c.Hedge.Factor = 0.5 }, "hedge-delay-factor 0.5 must be at least 1"},
		{"work type name empty", func(c *Config) {
			c.WorkTypeDefaults = map[string]WorkTypeConfig{"": {LabelBalancing: &LabelBalancingConfig{Order: []string{"a"}}}}
		}, "work-type-defaults: a work type name is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Defaults()
			tt.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want it to contain %q", err, tt.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if n := len(leaves(err)); n != 1 {
				t.Errorf("one bad setting gave %d problems: %v", n, err)
			}
		})
	}
}

func validDefaults() error {
	c := Defaults()
	c.SetDefaults()
	return c.Validate()
}

func TestValidate_ReportsEveryProblem(t *testing.T) {
	c := Defaults()
	c.Worker.MaxRemoteWorkers = 0
	c.Hedge.Delay = -time.Second
	c.LabelBalancing = &LabelBalancingConfig{Order: []string{"a", ""}}
	err := c.Validate()
	got := leaves(err)
	want := []string{
		"max-remote-workers 0 must be >= 1",
		"hedge-delay -1s must be >= 0",
		"label-balancing: order entry 2 is empty",
	}
	if len(got) != len(want) {
		t.Fatalf("Validate() gave %d problems, want %d: %v", len(got), len(want), err)
	}
	for i := range want {
		if got[i].Error() != want[i] {
			t.Errorf("problem %d = %q, want %q", i, got[i], want[i])
		}
	}
}
