package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
)

// Sentinel errors every configuration error wraps, for callers that branch
// on the class of a problem (for example to choose an exit code).
var (
	// ErrInvalid marks a setting whose value is out of bounds or
	// inconsistent with another setting.
	ErrInvalid = errors.New("invalid setting")
	// ErrUnknownSetting marks a YAML key or WORKMESH_* variable that names
	// no setting (often a typo).
	ErrUnknownSetting = errors.New("unknown setting")
	// ErrBadValue marks a value of the wrong type or that does not parse.
	ErrBadValue = errors.New("bad value")
	// ErrSyntax marks a file that is not YAML, or not a mapping of
	// settings, or that sets a key twice.
	ErrSyntax = errors.New("not a YAML settings file")
)

// problem is one configuration error: its message says what is wrong, and
// it unwraps to the sentinel of its class. Load fills where, the source of
// the value, from keys and entry.
type problem struct {
	msg   string
	class error
	// keys are the settings the problem is about, the one to change first;
	// empty when it names no setting.
	keys []string
	// entry is the list entry (from 1) of keys[0] the problem is about; 0
	// means the whole value.
	entry int
	// where says where the value came from ("file node.yaml line 12",
	// "env WORKMESH_MAX_RETRIES", "flag --max-retries"); empty when
	// unknown or when Validate ran outside Load.
	where string
}

func (p *problem) Error() string {
	if p.where == "" {
		return p.msg
	}
	return p.msg + " (" + p.where + ")"
}
func (p *problem) Unwrap() error { return p.class }

// checks collects the problems of one struct so that all are reported.
type checks []error

// failf records a problem with the setting key.
func (c *checks) failf(key, format string, args ...any) {
	c.add([]string{key}, 0, format, args...)
}

// entryf records a problem with entry (from 1) of the list setting key.
func (c *checks) entryf(key string, entry int, format string, args ...any) {
	c.add([]string{key}, entry, format, args...)
}

// pairf records a problem between two settings, key the one to change.
func (c *checks) pairf(key, other, format string, args ...any) {
	c.add([]string{key, other}, 0, format, args...)
}

func (c *checks) add(keys []string, entry int, format string, args ...any) {
	*c = append(*c, &problem{msg: fmt.Sprintf(format, args...), class: ErrInvalid, keys: keys, entry: entry})
}

func (c *checks) join() error { return errors.Join(*c...) }

// Bounds that are not obvious from the setting's meaning.
const (
	// maxNetworkLen keeps protocol IDs and DHT keys that embed the network short.
	maxNetworkLen = 64
	// maxWorkerBufferSize bounds the local queue, which is allocated up front.
	maxWorkerBufferSize = 1 << 20
	// maxAdmissionQueueSize bounds the requests waiting at a node: each
	// holds a goroutine and its caller's connection.
	maxAdmissionQueueSize = 1 << 16
	// maxRTTFactor keeps a wait derived from a round trip meaningful.
	maxRTTFactor = 100
)

// Validate reports every setting that is out of bounds or inconsistent with
// another, joined with errors.Join; each wraps ErrInvalid. It does not
// change c; call SetDefaults first when c was not built by Load.
func (c *Config) Validate() error {
	errs := []error{
		c.Node.Validate(),
		c.Worker.Validate(),
		c.Selection.Validate(),
		c.Liveness.Validate(),
		c.Rating.Validate(),
		c.Hedge.Validate(),
		c.LabelBalancing.Validate(),
		c.Access.Validate(),
		c.Fault.Validate(),
		c.HTTP.Validate(),
		c.JSONRPC.Validate(),
		c.Membership.Validate(),
		c.Limits.Validate(),
	}
	names := make([]string, 0, len(c.WorkTypeDefaults))
	for name := range c.WorkTypeDefaults {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		errs = append(errs, c.WorkTypeDefaults[name].validate(name))
	}
	errs = append(errs, c.validateCustomTypes())
	errs = append(errs, c.validateTrust())
	return errors.Join(errs...)
}

// Validate reports the node settings that are out of bounds.
func (n *NodeConfig) Validate() error {
	var c checks
	switch {
	case n.Network == "":
		c.failf("network", "network is required")
	case len(n.Network) > maxNetworkLen:
		c.failf("network", "network %q is %d bytes long, at most %d", n.Network, len(n.Network), maxNetworkLen)
	case strings.IndexFunc(n.Network, notNetworkRune) >= 0:
		c.failf("network", "network %q may only hold a-z, 0-9, '-', '_' and '.'", n.Network)
	}
	for i, a := range n.Listen {
		if !strings.HasPrefix(a, "/") {
			c.entryf("listen", i+1, "listen entry %d %q is not a multiaddr (it starts with \"/\")", i+1, a)
		}
	}
	for i, a := range n.Bootstrap {
		if !strings.HasPrefix(a, "/") || !strings.Contains(a, "/p2p/") {
			c.entryf("bootstrap", i+1, "bootstrap entry %d %q is not a full multiaddr ending in /p2p/<peer-id>", i+1, a)
		}
	}
	if n.API != "" {
		if _, port, err := net.SplitHostPort(n.API); err != nil {
			c.failf("api", "api %q is not host:port: %v", n.API, err)
		} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			c.failf("api", "api %q: port %q is not a number from 0 to 65535", n.API, port)
		}
	}
	for i, l := range n.Labels {
		if l == "" {
			c.entryf("labels", i+1, "labels entry %d is empty", i+1)
		}
	}
	seen := map[string]bool{}
	for i, w := range n.WorkTypes {
		switch {
		case w == "":
			c.entryf("work-types", i+1, "work-types entry %d is empty", i+1)
		case seen[w]:
			c.entryf("work-types", i+1, "work-types entry %d duplicates %q", i+1, w)
		}
		seen[w] = true
	}
	positive(&c, "announce-interval", n.AnnounceInterval)
	if n.AnnounceInterval > 0 && n.RecordTTL <= n.AnnounceInterval {
		c.pairf("record-ttl", "announce-interval", "record-ttl %s must be > announce-interval %s, or records expire between announcements", n.RecordTTL, n.AnnounceInterval)
	}
	if _, err := logrus.ParseLevel(n.LogLevel); err != nil {
		c.failf("log-level", "log-level %q is not one of trace, debug, info, warn, error, fatal, panic", n.LogLevel)
	}
	if n.LogFormat != "text" && n.LogFormat != "json" {
		c.failf("log-format", "log-format %q is not one of text, json", n.LogFormat)
	}
	notNegative(&c, "drain-timeout", n.DrainTimeout)
	if n.PeerTableCap < 1 {
		c.failf("peer-table-cap", "peer-table-cap %d must be >= 1", n.PeerTableCap)
	}
	if n.NewcomerDials < 0 {
		c.failf("newcomer-dials", "newcomer-dials %d must be >= 0", n.NewcomerDials)
	}
	positive(&c, "newcomer-dial-interval", n.NewcomerDialInterval)
	n.validateNAT(&c)
	return c.join()
}

// documentationRanges are the IPv4 ranges public-ranges may name.
var documentationRanges = []string{"192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"}

// validateNAT checks the NAT settings.
func (n *NodeConfig) validateNAT(c *checks) {
	switch n.Reachability {
	case ReachabilityAuto, ReachabilityPublic, ReachabilityPrivate:
	default:
		c.failf("reachability", "reachability %q is not one of auto, public, private", n.Reachability)
	}
	for _, l := range []struct {
		key  string
		list []string
	}{{"announce", n.Announce}, {"no-announce", n.NoAnnounce}} {
		for i, a := range l.list {
			if !strings.HasPrefix(a, "/") {
				c.entryf(l.key, i+1, "%s entry %d %q is not a multiaddr (it starts with \"/\")", l.key, i+1, a)
			}
		}
	}
	for i, a := range n.Relays {
		if !strings.HasPrefix(a, "/") || !strings.Contains(a, "/p2p/") {
			c.entryf("relay", i+1, "relay entry %d %q is not a full multiaddr ending in /p2p/<peer-id>", i+1, a)
		}
	}
	if n.RelayService {
		for _, b := range []struct {
			key string
			v   int
		}{{"relay-max-reservations", n.RelayMaxReservations}, {"relay-max-circuits", n.RelayMaxCircuits}, {"relay-limit-bytes", n.RelayLimitBytes}} {
			if b.v <= 0 {
				c.failf(b.key, "%s %d must be positive while relay-service is on", b.key, b.v)
			}
		}
		positive(c, "relay-limit-duration", n.RelayLimitDuration)
	}
	for i, r := range n.PublicRanges {
		if !slices.Contains(documentationRanges, r) {
			c.entryf("public-ranges", i+1, "public-ranges entry %d %q is not one of %s", i+1, r, strings.Join(documentationRanges, ", "))
		}
	}
}

func notNetworkRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
}

// Validate reports the worker settings that are out of bounds.
func (w *WorkerConfig) Validate() error {
	var c checks
	positive(&c, "worker-timeout", w.WorkerTimeout)
	positive(&c, "worker-response-timeout", w.WorkerResponseTimeout)
	if w.WorkerTimeout > 0 && w.WorkerResponseTimeout > w.WorkerTimeout {
		c.pairf("worker-response-timeout", "worker-timeout", "worker-response-timeout %s must be <= worker-timeout %s", w.WorkerResponseTimeout, w.WorkerTimeout)
	}
	if !(w.RTTFactor >= 1 && w.RTTFactor <= maxRTTFactor) { // NaN fails too
		c.failf("rtt-factor", "rtt-factor %g must be between 1 and %d", w.RTTFactor, maxRTTFactor)
	}
	notNegative(&c, "rtt-margin", w.RTTMargin)
	positive(&c, "peer-wait-max", w.PeerWaitMax)
	if w.PeerWaitMax > 0 && w.WorkerTimeout > w.PeerWaitMax {
		c.pairf("peer-wait-max", "worker-timeout", "peer-wait-max %s must be >= worker-timeout %s", w.PeerWaitMax, w.WorkerTimeout)
	}
	atLeast(&c, "max-retries", w.MaxRetries, 0)
	atLeast(&c, "max-spawn-attempts", w.MaxSpawnAttempts, 1)
	atLeast(&c, "worker-buffer-size", w.WorkerBufferSize, 1)
	if w.WorkerBufferSize > maxWorkerBufferSize {
		c.failf("worker-buffer-size", "worker-buffer-size %d must be <= %d", w.WorkerBufferSize, maxWorkerBufferSize)
	}
	atLeast(&c, "max-remote-workers", w.MaxRemoteWorkers, 1)
	positive(&c, "connect-timeout", w.ConnectTimeout)
	notNegative(&c, "retry-delay", w.RetryDelay)
	atLeast(&c, "local-concurrency", w.LocalConcurrency, 1)
	notNegative(&c, "retry-budget-window", w.RetryBudgetWindow)
	if w.RetryBudgetRatio < 0 || w.RetryBudgetRatio > 1 || math.IsNaN(w.RetryBudgetRatio) {
		c.failf("retry-budget-ratio", "retry-budget-ratio %v must be between 0 and 1", w.RetryBudgetRatio)
	}
	if w.RetryBudgetMinPerSecond < 0 || math.IsNaN(w.RetryBudgetMinPerSecond) || math.IsInf(w.RetryBudgetMinPerSecond, 0) {
		c.failf("retry-budget-min-per-second", "retry-budget-min-per-second %v must be a number >= 0", w.RetryBudgetMinPerSecond)
	}
	atLeast(&c, "admission-queue-size", w.AdmissionQueueSize, 0)
	if w.AdmissionQueueSize > maxAdmissionQueueSize {
		c.failf("admission-queue-size", "admission-queue-size %d must be <= %d", w.AdmissionQueueSize, maxAdmissionQueueSize)
	}
	if !(w.LocalReserve >= 0 && w.LocalReserve <= 1) { // NaN fails too
		c.failf("local-reserve", "local-reserve %v must be between 0 and 1", w.LocalReserve)
	}
	return c.join()
}

// Validate reports access settings that are out of bounds.
func (a *AccessConfig) Validate() error {
	var c checks
	switch a.AcceptWorkFrom {
	case AcceptAny, AcceptAllowlist:
	default:
		c.failf("accept-work-from", "accept-work-from %q: want %s or %s", a.AcceptWorkFrom, AcceptAny, AcceptAllowlist)
	}
	for i, p := range a.AllowPeers {
		if strings.TrimSpace(p) == "" {
			c.entryf("allow-peer", i+1, "allow-peer entry %d is empty", i+1)
		}
	}
	switch {
	case a.AcceptWorkFrom == AcceptAllowlist && len(a.AllowPeers) == 0:
		c.pairf("allow-peer", "accept-work-from", "accept-work-from allowlist needs at least one allow-peer")
	case a.AcceptWorkFrom == AcceptAny && len(a.AllowPeers) > 0:
		c.pairf("accept-work-from", "allow-peer", "allow-peer is set but accept-work-from is any: set accept-work-from allowlist")
	}
	atLeast(&c, "peer-max-streams", a.PeerMaxStreams, 1)
	if math.IsNaN(a.PeerRate) || a.PeerRate < 0 {
		c.failf("peer-rate", "peer-rate %g must be >= 0", a.PeerRate)
	}
	atLeast(&c, "peer-burst", a.PeerBurst, 1)
	return c.join()
}

// Validate reports fault rates outside [0, 1] and negative delays.
func (f *FaultConfig) Validate() error {
	var c checks
	for _, r := range []struct {
		name string
		v    float64
	}{{"fault-error-rate", f.ErrorRate}, {"fault-drop-rate", f.DropRate}} {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			c.failf(r.name, "%s %g must be between 0 and 1", r.name, r.v)
		}
	}
	notNegative(&c, "fault-delay", f.Delay)
	return c.join()
}

// Validate reports http work type settings that are out of bounds.
func (h *HTTPConfig) Validate() error {
	var c checks
	for i, a := range h.Allow {
		if strings.TrimSpace(a) == "" {
			c.entryf("http-allow", i+1, "http-allow entry %d is empty", i+1)
		}
	}
	atLeast(&c, "http-max-body", h.MaxBody, 1)
	return c.join()
}

// Validate reports jsonrpc settings that are out of bounds.
func (j *JSONRPCConfig) Validate() error {
	var c checks
	if j.Upstream != "" && !strings.HasPrefix(j.Upstream, "http://") && !strings.HasPrefix(j.Upstream, "https://") {
		c.failf("jsonrpc-upstream", "jsonrpc-upstream %q: want an http:// or https:// URL", j.Upstream)
	}
	positive(&c, "jsonrpc-head-interval", j.HeadInterval)
	if j.Methods != nil && len(j.Methods) == 0 {
		c.failf("jsonrpc-methods", "jsonrpc-methods is empty: list the methods to relay (eth_call, eth_*), or * for every one")
	}
	for i, m := range j.Methods {
		if !validMethodPattern(m) {
			c.entryf("jsonrpc-methods", i+1, "jsonrpc-methods entry %d %q: want a method name (eth_call), a namespace (eth_*) or *", i+1, m)
		}
	}
	return c.join()
}

// validMethodPattern reports whether p is a jsonrpc-methods entry: "*", or
// letters, digits and underscores, with a "*" at the end for a prefix.
func validMethodPattern(p string) bool {
	if p == "*" {
		return true
	}
	name := strings.TrimSuffix(p, "*")
	if name == "" {
		return false
	}
	for _, r := range name {
		if !(r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// Validate reports an unknown selection mode.
func (s *SelectionConfig) Validate() error {
	var c checks
	switch s.Mode {
	case ModeRating, ModeRoundRobin, ModeRandom:
	default:
		c.failf("selection-mode", "selection-mode %q is not one of %s, %s, %s", s.Mode, ModeRating, ModeRoundRobin, ModeRandom)
	}
	return c.join()
}

// Validate reports the liveness settings that are out of bounds, including
// a success threshold that could never be met because polling is off.
func (l *LivenessConfig) Validate() error {
	var c checks
	notNegative(&c, "poll-interval", l.PollInterval)
	atLeast(&c, "poll-failure-threshold", l.PollFailureThreshold, 1)
	atLeast(&c, "poll-success-threshold", l.PollSuccessThreshold, 0)
	atLeast(&c, "poll-budget", l.PollBudget, 0)
	// Without polling no ping is ever answered, so an unreachable peer
	// waiting for good pings would never come back.
	if l.PollSuccessThreshold > 0 && l.PollInterval == 0 {
		c.pairf("poll-success-threshold", "poll-interval", "poll-success-threshold %d needs poll-interval > 0 (polling is off)", l.PollSuccessThreshold)
	}
	positive(&c, "redial-backoff-min", l.RedialBackoffMin)
	if l.RedialBackoffMin > 0 && l.RedialBackoffMin > l.RedialBackoffMax {
		c.pairf("redial-backoff-min", "redial-backoff-max", "redial-backoff-min %s must be <= redial-backoff-max %s", l.RedialBackoffMin, l.RedialBackoffMax)
	}
	atLeast(&c, "stall-threshold", l.StallThreshold, 0)
	if l.StallThreshold > 0 {
		positive(&c, "stall-cordon", l.StallCordon)
	} else {
		notNegative(&c, "stall-cordon", l.StallCordon)
	}
	return c.join()
}

// Validate reports the rating settings that are out of bounds.
func (r *RatingConfig) Validate() error {
	var c checks
	positive(&c, "rating-window", r.Window)
	atLeast(&c, "rating-min-samples", r.MinSamples, 0)
	atLeast(&c, "rating-spread", r.Spread, 1)
	notNegative(&c, "rating-latency-floor", r.LatencyFloor)
	for _, w := range []struct {
		key string
		v   float64
	}{
		{"rating-latency-weight", r.LatencyWeight},
		{"rating-error-weight", r.ErrorWeight},
		{"rating-busy-weight", r.BusyWeight},
		{"rating-head-lag-weight", r.HeadLagWeight},
		{"rating-load-weight", r.LoadWeight},
	} {
		if !(w.v >= 0) || math.IsInf(w.v, 0) {
			c.failf(w.key, "%s %v must be a finite number >= 0", w.key, w.v)
		}
	}
	return c.join()
}

// Validate reports the hedge settings that are out of bounds.
func (h *HedgeConfig) Validate() error {
	var c checks
	notNegative(&c, "hedge-delay", h.Delay)
	atLeast(&c, "hedge-max-count", h.MaxCount, 0)
	if h.Quantile < 0 || h.Quantile >= 1 || math.IsNaN(h.Quantile) {
		c.failf("hedge-quantile", "hedge-quantile %v must be at least 0 and below 1 (0.95 is p95; 0 turns measuring off)", h.Quantile)
	}
	if h.Factor < 1 || math.IsNaN(h.Factor) || math.IsInf(h.Factor, 0) {
		c.failf("hedge-delay-factor", "hedge-delay-factor %v must be at least 1 (the measured hedge delay is it times the hedge-quantile)", h.Factor)
	}
	notNegative(&c, "hedge-delay-min", h.DelayMin)
	positive(&c, "hedge-delay-max", h.DelayMax)
	if h.DelayMax > 0 && h.DelayMin > h.DelayMax {
		c.pairf("hedge-delay-min", "hedge-delay-max", "hedge-delay-min %s must be <= hedge-delay-max %s", h.DelayMin, h.DelayMax)
	}
	positive(&c, "hedge-window", h.Window)
	atLeast(&c, "hedge-min-samples", h.MinSamples, 1)
	return c.join()
}

// Validate reports a missing order and empty or repeated order entries.
// Entries are numbered from 1, as a reader counts them. A nil block (label
// balancing off) is valid.
func (lb *LabelBalancingConfig) Validate() error {
	return lb.validate("label-balancing", "label-balancing.")
}

// validate checks lb with every message prefixed by where, so that an
// override names its work type; prefix is the key of the block with a
// trailing dot.
func (lb *LabelBalancingConfig) validate(where, prefix string) error {
	if lb == nil {
		return nil
	}
	var c checks
	if len(lb.Order) == 0 {
		c.failf(prefix+"order", "%s: order is required when label-balancing is set", where)
	}
	seen := map[string]bool{}
	for i, label := range lb.Order {
		switch {
		case label == "":
			c.entryf(prefix+"order", i+1, "%s: order entry %d is empty", where, i+1)
		case seen[label]:
			c.entryf(prefix+"order", i+1, "%s: order entry %d duplicates %q", where, i+1, label)
		}
		seen[label] = true
	}
	return c.join()
}

// validate reports the problems of the override for work type name; its
// messages name the work type.
func (w WorkTypeConfig) validate(name string) error {
	prefix := "work-type-defaults." + name + ".label-balancing."
	if name == "" {
		var c checks
		c.failf("work-type-defaults", "work-type-defaults: a work type name is empty")
		return errors.Join(c.join(), w.LabelBalancing.validate("label-balancing for the empty work type", prefix))
	}
	return w.LabelBalancing.validate("label-balancing for work type "+name, prefix)
}

// validateWorkTypes reports every work type in work-types and every key of
// work-type-defaults that is not in known, the work types the program
// has, naming them all.
func (c *Config) validateWorkTypes(known []string) error {
	sorted := append([]string(nil), known...)
	sort.Strings(sorted)
	isKnown := map[string]bool{}
	for _, k := range sorted {
		isKnown[k] = true
	}
	var ch checks
	// A custom type may not take a built-in's name; once declared it is
	// a work type like the others.
	for _, name := range sortedCustomNames(c.CustomTypes) {
		if isKnown[name] {
			ch.failf("custom-types."+name, "custom-types %q clashes with the built-in work type of that name: choose another name", name)
			continue
		}
		isKnown[name] = true
		sorted = append(sorted, name)
	}
	sort.Strings(sorted)
	for i, w := range c.Node.WorkTypes {
		if w != "" && !isKnown[w] {
			ch.entryf("work-types", i+1, "work-types entry %d %q is not a work type of this binary: want one of %s",
				i+1, w, strings.Join(sorted, ", "))
		}
	}
	names := make([]string, 0, len(c.WorkTypeDefaults))
	for name := range c.WorkTypeDefaults {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if name != "" && !isKnown[name] {
			ch.failf("work-type-defaults."+name, "work-type-defaults %q is not a work type of this binary: want one of %s",
				name, strings.Join(sorted, ", "))
		}
	}
	return ch.join()
}

func positive(c *checks, key string, d time.Duration) {
	if d <= 0 {
		c.failf(key, "%s %s must be > 0", key, d)
	}
}

func notNegative(c *checks, key string, d time.Duration) {
	if d < 0 {
		c.failf(key, "%s %s must be >= 0", key, d)
	}
}

func atLeast(c *checks, key string, n, min int) {
	if n < min {
		c.failf(key, "%s %d must be >= %d", key, n, min)
	}
}

// Validate reports a membership certificate set without the authority
// that gives it meaning, and text that cannot be an authority's key line.
// What needs the keys (the line parses, the certificate verifies) is
// checked by LoadOptions.Membership.
func (m *MembershipConfig) Validate() error {
	var c checks
	if strings.ContainsAny(m.NetworkAuthority, " \t\r\n") {
		c.failf("network-authority", "network-authority %q holds white space: want the one line `workmesh network init` printed", m.NetworkAuthority)
	}
	if m.MembershipCert != "" && m.NetworkAuthority == "" {
		c.pairf("membership-cert", "network-authority", "membership-cert %q is set but network-authority is not: a certificate means nothing without the authority that checks it", m.MembershipCert)
	}
	return c.join()
}

// Validate reports a payload or result limit out of its bounds.
func (l *LimitsConfig) Validate() error {
	var c checks
	for key, n := range map[string]int{"max-payload": l.MaxPayload, "max-result": l.MaxResult} {
		if n < 1 || n > MaxMaxPayload {
			c.failf(key, "%s %d must be between 1 and %d (64 MiB)", key, n, MaxMaxPayload)
		}
	}
	sort.Slice(c, func(i, j int) bool { return c[i].Error() < c[j].Error() })
	return c.join()
}
