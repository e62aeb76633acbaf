package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"
)

// envPrefix starts the name of every environment variable workmesh reads.
const envPrefix = "WORKMESH_"

// help is the one-line flag help of every setting that flags and the
// environment can set, keyed by its koanf key. It is the only hand-written
// per-setting table: YAML keys, flag names and environment names are all
// derived from the koanf struct tags in config.go, so they cannot drift. A
// test fails when a setting has no help here or an entry names no setting.
var help = map[string]string{
	"network":                "network name scoping protocols, DHT records and gossip; nodes on other networks are never seen",
	"listen":                 "multiaddrs the libp2p host listens on",
	"bootstrap":              "full multiaddrs (with /p2p/<id>) of peers to join the network through",
	"data-dir":               "directory that keeps the node identity (empty: $HOME/.workmesh)",
	"api":                    "host:port the local HTTP API of node start listens on (env WORKMESH_NODE_API; WORKMESH_API is the client commands' target, not this)",
	"labels":                 "group labels this node advertises for label balancing; a request requiring labels runs on the local worker only when they are all here",
	"work-types":             "work types the local worker serves",
	"announce-interval":      "time between two publications of this node's unchanged NodeData (a change is published at once)",
	"record-ttl":             "how long a peer's NodeData stays fresh without a newer one or a health answer naming it; must exceed announce-interval",
	"log-level":              "log level (a logrus level): trace, debug, info, warn or error",
	"log-format":             "log format: text or json",
	"drain-timeout":          "on SIGINT or SIGTERM, how long node start waits for work in progress after withdrawing its work types; 0 stops at once",
	"peer-table-cap":         "most peers the peer table holds; when full, a new peer's record is refused unless the node is connected to it (it then replaces the longest-unheard unconnected peer)",
	"newcomer-dials":         "dials this node may make to addresses their peer was never observed at (a record's word only), at once; a dial that connects gives its unit back, so this bounds failed ones; 0 never dials them",
	"newcomer-dial-interval": "how often the newcomer-dials budget grows by one dial",

	"worker-timeout":              "upper bound on the wait for a remote worker whose round trip is not measured yet to accept a request (say it took it on); it bounds a silent worker only: work that runs is bounded by the request's own timeout",
	"worker-response-timeout":     "least wait for a remote worker to accept a request before it is given up and the next one tried; a far worker gets rtt-factor times its round trip plus rtt-margin, up to peer-wait-max; at most worker-timeout",
	"rtt-factor":                  "how many of a peer's measured round trips the wait for its answer (accept frame, health ping) allows, before rtt-margin is added",
	"rtt-margin":                  "time added to rtt-factor times a peer's round trip in the wait for its answer",
	"peer-wait-max":               "upper bound on every wait for a peer's answer derived from its round trip; at least worker-timeout",
	"max-retries":                 "maximum attempts after the first one, per request (a hard cap behind the retry budget)",
	"max-spawn-attempts":          "how many times a request is offered to this node's own worker while it answers busy (all its slots and queue taken), retry-delay apart; each offer is a spawn attempt",
	"worker-buffer-size":          "maximum requests waiting in the local worker's queue",
	"max-remote-workers":          "maximum distinct remote peers tried per request (a hard cap behind the retry budget)",
	"connect-timeout":             "upper bound on dialing one candidate that is not connected",
	"retry-delay":                 "pause before a retry",
	"local-concurrency":           "maximum requests the local worker runs at once",
	"retry-budget-window":         "sliding window of the retry budget, which bounds the retries of all requests together; 0 turns it off",
	"retry-budget-ratio":          "share of the requests in the retry-budget-window that may be retried (0 to 1)",
	"retry-budget-min-per-second": "retries per second allowed whatever retry-budget-ratio says, so that a quiet node still retries",
	"admission-queue-size":        "maximum requests waiting at this node while every worker is busy; each leaves (503) when its deadline can no longer be met",
	"max-payload":                 "largest payload a request may carry, in bytes (1 to 64 MiB)",
	"max-result":                  "largest result a worker returns, in raw bytes (1 to 64 MiB; an encoding such as base64 is not counted)",

	"selection-mode": "how candidates are ordered: rating, round-robin or random",

	"poll-interval":          "time between two health pings to a peer; 0 turns polling off",
	"poll-failure-threshold": "failure count at which a peer becomes unreachable",
	"poll-success-threshold": "good pings in a row an unreachable peer needs to be alive again; needs poll-interval > 0",
	"poll-budget":            "alive peers polled per poll-interval: with more, each is polled every poll-interval x alive/poll-budget; 0 polls all every poll-interval",
	"redial-backoff-min":     "first wait before redialing an unreachable peer",
	"redial-backoff-max":     "upper bound on the doubling wait between redials",
	"stall-threshold":        "work requests a peer accepted and left unanswered past their deadline (an answer takes one away) at which it is cordoned, whatever its pings say; 0 turns it off",
	"stall-cordon":           "how long a stalling peer is kept out before it is redialed; doubles each time it stalls again without answering work, up to 16 times",
	"local-reserve":          "share (0 to 1) of the local worker's running slots and queue kept for this node's own API and CLI clients; peers' work never takes them (peers keep at least one running slot)",

	"rating-window":          "half-life of a rating sample's weight",
	"rating-min-samples":     "weighted outcomes needed before a peer is rated rather than explored (tried first, to learn how it does); a peer rated once stays rated as they fade",
	"rating-spread":          "number of best-rated peers a request picks among at random; 1 is strictly the best",
	"rating-latency-weight":  "weight of latency in the rating score",
	"rating-error-weight":    "weight of the error rate in the rating score",
	"rating-busy-weight":     "weight of the busy/throttled rate in the rating score",
	"rating-head-lag-weight": "weight of head lag (how far a worker's newest block trails the best one in the network) in the rating score",
	"rating-load-weight":     "weight of current load in the rating score",
	"rating-latency-floor":   "least latency a latency difference is measured against: a worker is compared with the fastest one's latency or this, whichever is larger (twice as slow as the fastest costs 1 above it; below it 0.2ms slower costs 0.2 at 1ms), so that sub-millisecond jitter does not outweigh errors; 0 compares with the fastest alone, and a floor far above the workers' latencies all but turns latency off",

	"hedge-delay":        "how long an attempt may run before a hedge is sent: a second copy of the request to another worker, while the first still runs, for work types that are safe to run twice; the first answer wins. With hedge-quantile above 0 it is used only until a work type's delay is measured (hedge-min-samples)",
	"hedge-max-count":    "maximum hedges (extra copies of one request, see hedge-delay) per request; 0 turns hedging off",
	"hedge-quantile":     "quantile (0.95 is p95) of a work type's recent successful attempts at this node that is its hedge delay, measured per work type; 0 turns measuring off (hedge-delay always)",
	"hedge-delay-factor": "the measured hedge delay is this many times the hedge-quantile of a work type's recent successes (2: twice its p95), so that a hedge waits past the type's normal tail and fires for answers that are slow, not for the slowest of the normal ones",
	"hedge-delay-min":    "lower bound of the measured hedge delay (hedge-quantile)",
	"hedge-delay-max":    "upper bound of the measured hedge delay (hedge-quantile)",
	"hedge-window":       "how long a successful attempt counts in its work type's measured hedge delay (at most its last 256 count)",
	"hedge-min-samples":  "successful attempts within hedge-window a work type needs before its measured hedge delay replaces hedge-delay",

	"accept-work-from": "who may send this node work: any, or allowlist (only the peers in allow-peer)",
	"allow-peer":       "peer ID allowed to send work when accept-work-from is allowlist (repeatable)",
	"peer-max-streams": "maximum work streams one peer may have open at once; over it the peer is answered busy",
	"peer-rate":        "sustained work requests per second one peer may send; 0 means no limit",
	"peer-burst":       "requests one peer may send at once above peer-rate",
	"api-token":        "bearer token the local API requires; required when the API is not on loopback",

	"fault-error-rate": "share of work requests this node answers with a retryable error on purpose (drills)",
	"fault-delay":      "delay this node adds before every work request on purpose (drills)",
	"fault-drop-rate":  "share of work requests this node drops without an answer on purpose (drills)",

	"http-allow":    "host, address or CIDR, with :port for one port only, that the http work type may fetch from although loopback, link-local or private: every service it covers is open to the peers accept-work-from admits; this node's own API and listen ports never are (repeatable)",
	"http-max-body": "maximum bytes of a response body the http work type returns",

	"jsonrpc-upstream":      "JSON-RPC 2.0 endpoint the jsonrpc work type relays to (empty: not served)",
	"jsonrpc-chain-id":      "chain ID the upstream must report at start (empty: not checked)",
	"jsonrpc-head-interval": "time between two polls of the upstream's head: the newest block it has, which this node advertises so that a request naming a block goes to a worker that has it",
	"jsonrpc-methods":       "methods relayed to the upstream: a name (eth_call), a namespace (debug_*) or * for all; a request calling another is answered method not found without reaching the upstream (repeatable)",

	"network-authority": "public key line of the network authority (from workmesh network init); empty: an open network that any peer may join; set: records, work and protocol streams only from members",
	"membership-cert":   "file with this node's membership certificate (from workmesh network admit); needs network-authority",

	"label-balancing.order":           "group labels tried in order, highest priority first; setting it turns label balancing on",
	"label-balancing.pass-on-error":   "after a retryable error, move to the next label group instead of retrying in the current one",
	"label-balancing.include-default": "route to peers carrying none of the order labels as a final group",

	"reachability":           "whether this node is publicly dialable: auto (AutoNAT asks public peers to dial it back), public or private",
	"announce":               "multiaddrs advertised instead of the listen and observed addresses (relay addresses are still added; repeatable)",
	"no-announce":            "multiaddrs or prefixes (/ip4/<addr>, /ip4/<net>/ipcidr/<bits>) left out of the advertised addresses (repeatable)",
	"mdns":                   "find peers of this network on the local network by multicast DNS, without a bootstrap address (off by default: it multicasts on every interface)",
	"relay":                  "full multiaddr (with /p2p/<id>) of a relay this node reserves a slot on while private, before public peers from its peer table (repeatable)",
	"relay-service":          "offer circuit relay v2 to private peers while this node is public",
	"relay-max-reservations": "relay slots this node hands out at most while it offers the relay service",
	"relay-max-circuits":     "relayed connections open at once per peer through this node at most",
	"relay-limit-bytes":      "bytes relayed per relayed connection and direction at most; work larger than this is refused on a relayed connection",
	"relay-limit-duration":   "how long one relayed connection through this node lasts at most",
	"hole-punching":          "upgrade a relayed connection to a direct one by hole punching (DCUtR)",
	"public-ranges":          "IPv4 documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24) treated as public internet: for test labs built on them only (repeatable)",
	"explore-share":          "most share (0 to 1) of any 200 requests in a row whose first attempt goes to a peer that has not yet had rating-min-samples outcomes while a proven peer could take it; 1 means no bound",
	"audit-rate":             "share (0 to 1) of a deterministic type's successful results run again on one other worker after answering, to catch a worker that lies; 0 turns audits off",
	"dispute-threshold":      "disputes (results outvoted by other workers, or contradicted by an audit) within dispute-window at which a peer is cordoned; 0 only counts them",
	"dispute-window":         "how far back disputes count toward dispute-threshold",
	"dispute-cordon":         "how long a peer cordoned for disputes gets no work before it is redialed and probed",
}

// FlagGroups are the groups of settings, in the order `node start --help`
// shows them, each with a title that says what its settings are about.
var FlagGroups = []FlagGroup{
	{"node", "Node: identity, logs and stopping"},
	{"network", "Network: joining and being known"},
	{"api", "API: the local HTTP API"},
	{"work", "Work: what this node serves, and how it sends requests to others"},
	{"selection", "Selection: which worker a request goes to first"},
	{"liveness", "Liveness: health polls of peers"},
	{"access", "Access: who may use this node, and how much"},
	{"faults", "Faults: failures injected on purpose, for drills"},
	{"http", "Work type http"},
	{"jsonrpc", "Work type jsonrpc"},
	{"nat", "NAT: reachability, relays, hole punching and advertised addresses"},
}

// FlagGroup is one group of settings in the help.
type FlagGroup struct {
	// Name is the group's short name, as group holds it.
	Name string
	// Title heads the group in the help.
	Title string
}

// group is the FlagGroups name of every setting in help, keyed the same.
// A test fails when a setting has no group or names one FlagGroups lacks.
var group = map[string]string{
	"data-dir": "node", "log-level": "node", "log-format": "node", "drain-timeout": "node",
	"peer-table-cap": "network", "newcomer-dials": "network", "newcomer-dial-interval": "network",

	"network": "network", "listen": "network", "bootstrap": "network",
	"announce-interval": "network", "record-ttl": "network",

	"api": "api",

	"labels": "work", "work-types": "work", "worker-timeout": "work", "worker-response-timeout": "work",
	"rtt-factor": "work", "rtt-margin": "work", "peer-wait-max": "work",
	"max-retries": "work", "max-spawn-attempts": "work", "worker-buffer-size": "work",
	"max-remote-workers": "work", "connect-timeout": "work", "retry-delay": "work",
	"local-concurrency": "work", "hedge-delay": "work", "hedge-max-count": "work",
	"hedge-quantile": "work", "hedge-delay-factor": "work", "hedge-delay-min": "work", "hedge-delay-max": "work", "hedge-window": "work", "hedge-min-samples": "work",
	"retry-budget-window": "work", "retry-budget-ratio": "work", "retry-budget-min-per-second": "work",
	"admission-queue-size": "work",
	"max-payload":          "work", "max-result": "work",

	"selection-mode": "selection", "rating-window": "selection", "rating-min-samples": "selection",
	"rating-spread": "selection", "rating-latency-weight": "selection", "rating-latency-floor": "selection", "rating-error-weight": "selection",
	"rating-busy-weight": "selection", "rating-head-lag-weight": "selection", "rating-load-weight": "selection",
	"label-balancing.order": "selection", "label-balancing.pass-on-error": "selection",
	"label-balancing.include-default": "selection",

	"poll-interval": "liveness", "poll-failure-threshold": "liveness", "poll-success-threshold": "liveness", "poll-budget": "liveness",
	"redial-backoff-min": "liveness", "redial-backoff-max": "liveness",
	"stall-threshold": "liveness", "stall-cordon": "liveness", "local-reserve": "work",

	"accept-work-from": "access", "allow-peer": "access", "peer-max-streams": "access",
	"peer-rate": "access", "peer-burst": "access", "api-token": "access",

	"fault-error-rate": "faults", "fault-delay": "faults", "fault-drop-rate": "faults",

	"http-allow": "http", "http-max-body": "http",

	"jsonrpc-upstream": "jsonrpc", "jsonrpc-chain-id": "jsonrpc", "jsonrpc-head-interval": "jsonrpc", "jsonrpc-methods": "jsonrpc",

	"network-authority": "network", "membership-cert": "network",
	"reachability": "nat", "announce": "nat", "no-announce": "nat", "mdns": "nat", "relay": "nat",
	"relay-service": "nat", "relay-max-reservations": "nat", "relay-max-circuits": "nat",
	"relay-limit-bytes": "nat", "relay-limit-duration": "nat", "hole-punching": "nat", "public-ranges": "nat",

	"explore-share": "selection", "audit-rate": "work",
	"dispute-threshold": "liveness", "dispute-window": "liveness", "dispute-cordon": "liveness",
}

// GroupOfFlag returns the FlagGroups name of the setting that BindFlags
// binds to the flag named name, or "" when no setting has that flag.
func GroupOfFlag(name string) string {
	st := mustSchema().byFlag[name]
	if st == nil {
		return ""
	}
	return group[st.key]
}

// envOverride names the environment variable of a setting whose derived
// name is taken: WORKMESH_API is the client commands' target (the API they
// talk to), so the node's own API address is WORKMESH_NODE_API and a shell
// that exports WORKMESH_API for `workmesh submit` does not move the API of
// a node started from it.
var envOverride = map[string]string{
	"api": envPrefix + "NODE_API",
}

// envName returns the environment variable a setting's key derives:
// WORKMESH_ and the key upper-cased, dots and dashes as underscores.
func envName(key string) string {
	return envPrefix + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

// kind is the shape of a setting's value, which decides how it is parsed
// from YAML, the environment and flags.
type kind int

const (
	kindString kind = iota + 1
	kindBool        // bool, or *bool where nil means "use the default"
	kindInt
	kindFloat
	kindDuration
	kindStrings   // []string; comma-separated in the environment
	kindBlock     // pointer to a struct: a nested block such as label-balancing
	kindBlockMap  // map from a name to a struct: file-only, such as work-type-defaults
	kindStringMap // map from a name to a string: file-only, inside a block map (custom-types headers, env)
)

var durationType = reflect.TypeFor[time.Duration]()

func kindOf(t reflect.Type) (kind, bool) {
	switch {
	case t == durationType:
		return kindDuration, true
	case t.Kind() == reflect.String:
		return kindString, true
	case t.Kind() == reflect.Bool, t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Bool:
		return kindBool, true
	case t.Kind() == reflect.Int:
		return kindInt, true
	case t.Kind() == reflect.Float64:
		return kindFloat, true
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return kindStrings, true
	case t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct:
		return kindBlock, true
	case t.Kind() == reflect.Map && t.Key().Kind() == reflect.String && t.Elem().Kind() == reflect.Struct:
		return kindBlockMap, true
	case t.Kind() == reflect.Map && t.Key().Kind() == reflect.String && t.Elem().Kind() == reflect.String:
		return kindStringMap, true
	}
	return 0, false
}

// field is one koanf-tagged field of a struct, with squash groups flattened in.
type field struct {
	name  string // koanf key of the field inside its struct
	index []int  // for reflect.Value.FieldByIndex, through squash groups
	typ   reflect.Type
	kind  kind
}

// block returns the struct type a kindBlock or kindBlockMap field holds.
func (f field) block() reflect.Type { return f.typ.Elem() }

// setting is one leaf that the file, flags and the environment can set.
type setting struct {
	key  string // koanf and YAML key: "worker-timeout", "label-balancing.order"
	flag string // flag name without dashes: "label-balancing-order"
	env  string // "WORKMESH_LABEL_BALANCING_ORDER"
	// path holds the field index of each struct level from Config down;
	// between two levels a block pointer is followed.
	path [][]int
	typ  reflect.Type
	kind kind
}

// schema is everything derived from the struct tags: the fields of each
// struct type and the flag- and env-settable settings.
type schema struct {
	fields   map[reflect.Type][]field
	settings []*setting
	byKey    map[string]*setting
	byFlag   map[string]*setting
	byEnv    map[string]*setting
}

// loadSchema derives the schema once; the types cannot change at run time.
var loadSchema = sync.OnceValues(func() (*schema, error) {
	return buildSchema(reflect.TypeFor[Config]())
})

// mustSchema is for callers that cannot return an error; a schema error is
// a programming error that the package tests catch.
func mustSchema() *schema {
	s, err := loadSchema()
	if err != nil {
		panic(err)
	}
	return s
}

func buildSchema(root reflect.Type) (*schema, error) {
	s := &schema{
		fields: map[reflect.Type][]field{},
		byKey:  map[string]*setting{},
		byFlag: map[string]*setting{},
		byEnv:  map[string]*setting{},
	}
	if err := s.addType(root); err != nil {
		return nil, err
	}
	if err := s.addSettings(root, "", nil); err != nil {
		return nil, err
	}
	return s, nil
}

// addType records the fields of struct type t and of every block type it holds.
func (s *schema) addType(t reflect.Type) error {
	if _, ok := s.fields[t]; ok {
		return nil
	}
	fs, err := collectFields(t, nil)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, f := range fs {
		if seen[f.name] {
			return fmt.Errorf("config schema: %s: key %q is used twice", t, f.name)
		}
		seen[f.name] = true
	}
	s.fields[t] = fs
	for _, f := range fs {
		if f.kind == kindBlock || f.kind == kindBlockMap {
			if err := s.addType(f.block()); err != nil {
				return err
			}
		}
	}
	return nil
}

func collectFields(t reflect.Type, prefix []int) ([]field, error) {
	var out []field
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		index := append(append([]int(nil), prefix...), i)
		name, opts, _ := strings.Cut(sf.Tag.Get("koanf"), ",")
		if opts == "squash" {
			if sf.Type.Kind() != reflect.Struct {
				return nil, fmt.Errorf("config schema: %s.%s: squash needs a struct", t, sf.Name)
			}
			inner, err := collectFields(sf.Type, index)
			if err != nil {
				return nil, err
			}
			out = append(out, inner...)
			continue
		}
		if name == "" || name == "-" {
			return nil, fmt.Errorf("config schema: %s.%s has no koanf tag", t, sf.Name)
		}
		k, ok := kindOf(sf.Type)
		if !ok {
			return nil, fmt.Errorf("config schema: %s.%s: type %s is not supported", t, sf.Name, sf.Type)
		}
		out = append(out, field{name: name, index: index, typ: sf.Type, kind: k})
	}
	return out, nil
}

// addSettings adds the leaves of struct type t under key prefix. Blocks
// behind a pointer are followed; name-keyed maps are file-only.
func (s *schema) addSettings(t reflect.Type, prefix string, path [][]int) error {
	for _, f := range s.fields[t] {
		key := prefix + f.name
		switch f.kind {
		case kindBlockMap:
			continue
		case kindBlock:
			if err := s.addSettings(f.block(), key+".", append(clonePath(path), f.index)); err != nil {
				return err
			}
			continue
		}
		st := &setting{
			key:  key,
			flag: strings.ReplaceAll(key, ".", "-"),
			env:  envName(key),
			path: append(clonePath(path), f.index),
			typ:  f.typ,
			kind: f.kind,
		}
		if s.byKey[st.key] != nil || s.byFlag[st.flag] != nil || s.byEnv[st.env] != nil {
			return fmt.Errorf("config schema: setting %q collides with another on its key, flag or env name", key)
		}
		if name, ok := envOverride[key]; ok {
			st.env = name
		}
		s.settings = append(s.settings, st)
		s.byKey[st.key], s.byFlag[st.flag], s.byEnv[st.env] = st, st, st
	}
	return nil
}

func clonePath(p [][]int) [][]int { return append([][]int(nil), p...) }

// value returns the field of st in the struct c points to. ok is false when
// a block on the way is nil. With alloc, nil blocks are allocated and given
// their defaults instead.
func (st *setting) value(c reflect.Value, alloc bool) (v reflect.Value, ok bool) {
	v = c.Elem()
	for i, idx := range st.path {
		if i > 0 {
			if v.IsNil() {
				if !alloc {
					return reflect.Value{}, false
				}
				v.Set(reflect.New(v.Type().Elem()))
				if d, ok := v.Interface().(interface{ SetDefaults() }); ok {
					d.SetDefaults()
				}
			}
			v = v.Elem()
		}
		v = v.FieldByIndex(idx)
	}
	return v, true
}

// walkLeaves calls fn for every leaf of struct value v in declaration
// order, with its full key. Nil blocks are skipped; map blocks are visited
// in name order.
func (s *schema) walkLeaves(prefix string, v reflect.Value, fn func(key string, f field, v reflect.Value)) {
	for _, f := range s.fields[v.Type()] {
		fv := v.FieldByIndex(f.index)
		key := prefix + f.name
		switch f.kind {
		case kindBlock:
			if !fv.IsNil() {
				s.walkLeaves(key+".", fv.Elem(), fn)
			}
		case kindBlockMap:
			for _, name := range sortedKeys(fv) {
				s.walkLeaves(key+"."+name.String()+".", fv.MapIndex(name), fn)
			}
		default:
			fn(key, f, fv)
		}
	}
}

// toMap turns struct value v into the nested map koanf holds, leaving out
// nil blocks, nil slices and nil pointers so that they stay unset.
func (s *schema) toMap(v reflect.Value) map[string]any {
	out := map[string]any{}
	for _, f := range s.fields[v.Type()] {
		fv := v.FieldByIndex(f.index)
		switch f.kind {
		case kindBlock:
			if !fv.IsNil() {
				out[f.name] = s.toMap(fv.Elem())
			}
		case kindBlockMap:
			if !fv.IsNil() {
				m := map[string]any{}
				for _, name := range sortedKeys(fv) {
					m[name.String()] = s.toMap(fv.MapIndex(name))
				}
				out[f.name] = m
			}
		default:
			if val, ok := canonical(f.kind, fv); ok {
				out[f.name] = val
			}
		}
	}
	return out
}

// sortedKeys returns the keys of a string-keyed map in order, so that
// output and error lists are deterministic.
func sortedKeys(m reflect.Value) []reflect.Value {
	keys := m.MapKeys()
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	return keys
}
