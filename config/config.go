package config

import (
	"slices"
	"time"
)

// Config is the whole configuration of a workmesh node.
type Config struct {
	Node      NodeConfig      `koanf:",squash"`
	Worker    WorkerConfig    `koanf:",squash"`
	Selection SelectionConfig `koanf:",squash"`
	Liveness  LivenessConfig  `koanf:",squash"`
	Rating    RatingConfig    `koanf:",squash"`
	Hedge     HedgeConfig     `koanf:",squash"`
	Access    AccessConfig    `koanf:",squash"`
	Fault     FaultConfig     `koanf:",squash"`
	HTTP      HTTPConfig      `koanf:",squash"`
	JSONRPC   JSONRPCConfig   `koanf:",squash"`
	// Membership names the network's authority and this node's
	// certificate from it (README, "Membership").
	Membership MembershipConfig `koanf:",squash"`

	// LabelBalancing is the global priority-group setting; nil means
	// label balancing is off and candidates are ordered by rating alone.
	LabelBalancing *LabelBalancingConfig `koanf:"label-balancing"`

	// WorkTypeDefaults holds per-work-type overrides, keyed by work type.
	WorkTypeDefaults map[string]WorkTypeConfig `koanf:"work-type-defaults"`

	// Limits bounds what one request carries: its payload and its result.
	Limits LimitsConfig `koanf:",squash"`

	// CustomTypes declares the operator's own work types, keyed by work
	// type: each is backed by a command or by a local HTTP service.
	CustomTypes map[string]CustomTypeConfig `koanf:"custom-types"`

	// Trust drives checked results and the exploration budget (README,
	// "Checked results").
	Trust TrustConfig `koanf:",squash"`
}

// Bounds of the payload and result limits.
const (
	// DefaultMaxPayload is the default of max-payload and max-result: 1 MiB.
	DefaultMaxPayload = 1 << 20
	// MaxMaxPayload is the largest max-payload or max-result: 64 MiB.
	MaxMaxPayload = 64 << 20
)

// LimitsConfig bounds what one request carries. Both limits are of the raw
// bytes: a binary result is not refused because an encoding of it (the
// http type's base64, say) is larger.
type LimitsConfig struct {
	// MaxPayload bounds a request's payload, in bytes.
	MaxPayload int `koanf:"max-payload"`
	// MaxResult bounds a result (a work type's output, an http body), in
	// bytes.
	MaxResult int `koanf:"max-result"`
}

// CustomTypeConfig declares one work type of the operator's own: a
// command (payload on stdin, result from stdout) or a local service (the
// payload POSTed to url, the response body the result). Exactly one of
// Command and URL is set.
type CustomTypeConfig struct {
	// Command is the program and its arguments, as a list; it runs
	// without a shell, so the payload never becomes part of a command line.
	Command []string `koanf:"command"`
	// Env is the command's environment: it starts empty, and holds only
	// what is listed here.
	Env map[string]string `koanf:"env"`
	// Dir is the command's working directory; empty means the node's.
	Dir string `koanf:"dir"`
	// RetryableExitCode is the exit code that means "try again, maybe on
	// another worker"; 0 means the default, 75 (EX_TEMPFAIL).
	RetryableExitCode int `koanf:"retryable-exit-code"`
	// URL is the local service's endpoint, http or https; the payload is
	// POSTed to it. It is the operator's own, not subject to http-allow.
	URL string `koanf:"url"`
	// Headers are sent with every POST to URL.
	Headers map[string]string `koanf:"headers"`
	// HealthURL, when set, is polled with GET every HealthInterval; while
	// it does not answer 2xx the node withdraws this work type.
	HealthURL string `koanf:"health-url"`
	// HealthInterval is the time between two polls of HealthURL; 0 means
	// the default, 2s.
	HealthInterval time.Duration `koanf:"health-interval"`
	// Timeout bounds one run; the request's deadline cuts it shorter. 0
	// means the default, 30s.
	Timeout time.Duration `koanf:"timeout"`
	// MaxOutput bounds the result, in bytes: a run whose output is longer
	// fails (it is not cut short). 0 means the payload limit.
	MaxOutput int `koanf:"max-output"`
	// Concurrency bounds the runs of this type at once; over it the worker
	// answers busy. 0 means no bound of its own (local-concurrency holds).
	Concurrency int `koanf:"concurrency"`
	// Idempotent means a run may be repeated, on several workers at once,
	// without harm: only then is the work hedged.
	Idempotent bool `koanf:"idempotent"`
	// Deterministic means the same payload always gives the same result.
	Deterministic bool `koanf:"deterministic"`
	// Verify is the default check of this type's results, "agree/replicas"
	// such as "2/3" (README, "Checked results"); needs Deterministic.
	Verify string `koanf:"verify"`
}

// NodeConfig says how a node joins its network and what it offers.
type NodeConfig struct {
	// Network scopes protocols, DHT records and gossip so two networks never mix.
	Network string `koanf:"network"`
	// Listen holds the multiaddrs the libp2p host listens on.
	Listen []string `koanf:"listen"`
	// Bootstrap holds full multiaddrs (with /p2p/<id>) of peers to join through.
	Bootstrap []string `koanf:"bootstrap"`
	// DataDir keeps the node identity; empty means $HOME/.workmesh.
	DataDir string `koanf:"data-dir"`
	// API is the address of the local HTTP API.
	API string `koanf:"api"`
	// Labels are this node's group labels, used by label balancing elsewhere
	// and matched against a request's required labels before its local
	// worker runs it.
	Labels []string `koanf:"labels"`
	// WorkTypes are the work types this node's local worker serves.
	WorkTypes []string `koanf:"work-types"`
	// AnnounceInterval is how often NodeData is re-published (gossip and DHT)
	// when nothing in it changed; a change is published at once.
	AnnounceInterval time.Duration `koanf:"announce-interval"`
	// RecordTTL is how long a peer's NodeData stays fresh without a newer one
	// or a health answer naming it.
	RecordTTL time.Duration `koanf:"record-ttl"`
	// LogLevel is a logrus level: trace, debug, info, warn, error, fatal or panic.
	LogLevel string `koanf:"log-level"`
	// LogFormat is text or json.
	LogFormat string `koanf:"log-format"`
	// DrainTimeout bounds how long a stopping node (SIGINT or SIGTERM to
	// `node start`) waits for its work in progress after withdrawing its
	// work types; 0 stops at once, cancelling that work.
	DrainTimeout time.Duration `koanf:"drain-timeout"`
	// PeerTableCap bounds the peers the peer table holds; when it is full
	// a record of a new peer is refused, unless the node is connected to
	// that peer, which then takes the place of the longest-unheard peer
	// the node is not connected to.
	PeerTableCap int `koanf:"peer-table-cap"`
	// NewcomerDials is the node's budget of dials to addresses at which the
	// peer they belong to was never observed (a record's word only): at
	// most this many at once, one more every NewcomerDialInterval. 0 never
	// dials such an address.
	NewcomerDials int `koanf:"newcomer-dials"`
	// NewcomerDialInterval is how often the newcomer dial budget grows by
	// one, up to NewcomerDials.
	NewcomerDialInterval time.Duration `koanf:"newcomer-dial-interval"`

	// Reachability is auto (AutoNAT finds out whether the node is
	// publicly dialable), public or private (the operator says so).
	Reachability string `koanf:"reachability"`
	// Announce, when set, is advertised instead of the addresses the node
	// listens on and observes (relay addresses are still added).
	Announce []string `koanf:"announce"`
	// NoAnnounce are multiaddrs, or their prefixes (an /ip4/<addr> alone,
	// or /ip4/<net>/ipcidr/<bits>), left out of what is advertised.
	NoAnnounce []string `koanf:"no-announce"`
	// MDNS finds peers on the local network by multicast DNS.
	MDNS bool `koanf:"mdns"`
	// Relays are full multiaddrs of relays a private node reserves a slot
	// on first; it also uses public peers from its peer table.
	Relays []string `koanf:"relay"`
	// RelayService offers circuit relay v2 to others while the node is
	// public, with the bounds below.
	RelayService bool `koanf:"relay-service"`
	// RelayMaxReservations bounds the relay slots a public node hands out.
	RelayMaxReservations int `koanf:"relay-max-reservations"`
	// RelayMaxCircuits bounds the relayed connections open at once per peer.
	RelayMaxCircuits int `koanf:"relay-max-circuits"`
	// RelayLimitBytes bounds the bytes relayed per circuit and direction.
	RelayLimitBytes int `koanf:"relay-limit-bytes"`
	// RelayLimitDuration bounds how long one relayed connection lasts.
	RelayLimitDuration time.Duration `koanf:"relay-limit-duration"`
	// HolePunching upgrades a relayed connection to a direct one (DCUtR).
	HolePunching bool `koanf:"hole-punching"`
	// PublicRanges are IPv4 ranges libp2p counts as unroutable (the
	// documentation ranges) that this node treats as public internet: for
	// test labs built on those ranges only.
	PublicRanges []string `koanf:"public-ranges"`
}

// WorkerConfig bounds how a request is sent to workers. The names of the
// first six settings come from the remote-worker-selection design workmesh
// learns from, and so do four of their defaults: max-retries and
// max-remote-workers are larger, hard caps behind the retry budget (README,
// "Retries"). connect-timeout and the retry budget are workmesh's own.
type WorkerConfig struct {
	// WorkerTimeout bounds the wait for a remote worker to accept a request
	// (its first response frame) while the worker's round trip is not
	// measured yet: it bounds a worker that has gone silent, never work that
	// runs, which only the request's deadline bounds.
	WorkerTimeout time.Duration `koanf:"worker-timeout"`
	// WorkerResponseTimeout is the least wait for a remote worker to accept
	// a request after it was sent; a worker whose measured round trip asks
	// for more (RTTFactor times it plus RTTMargin) is given that, up to
	// PeerWaitMax.
	WorkerResponseTimeout time.Duration `koanf:"worker-response-timeout"`
	// RTTFactor scales a peer's measured round trip into the wait for its
	// answer (the accept frame, the health ping).
	RTTFactor float64 `koanf:"rtt-factor"`
	// RTTMargin is added to RTTFactor times a peer's round trip.
	RTTMargin time.Duration `koanf:"rtt-margin"`
	// PeerWaitMax bounds every wait derived from a peer's round trip.
	PeerWaitMax time.Duration `koanf:"peer-wait-max"`
	// MaxRetries bounds the attempts after the first one, per request.
	MaxRetries int `koanf:"max-retries"`
	// MaxSpawnAttempts bounds how often the local worker is asked to take a
	// request while it answers busy before the request fails as busy.
	MaxSpawnAttempts int `koanf:"max-spawn-attempts"`
	// WorkerBufferSize bounds the local worker's queue of waiting requests.
	WorkerBufferSize int `koanf:"worker-buffer-size"`
	// MaxRemoteWorkers bounds the distinct remote peers tried per request.
	MaxRemoteWorkers int `koanf:"max-remote-workers"`
	// ConnectTimeout bounds the dial of one candidate that is not connected.
	ConnectTimeout time.Duration `koanf:"connect-timeout"`
	// RetryDelay is the pause before a retry, so that a burst of failures
	// does not turn into an equal burst of retries.
	RetryDelay time.Duration `koanf:"retry-delay"`
	// LocalConcurrency is the number of requests the local worker runs at once.
	LocalConcurrency int `koanf:"local-concurrency"`
	// RetryBudgetWindow is the sliding window of the retry budget, which
	// bounds the retries of all requests together: within it, retries may
	// be at most RetryBudgetRatio of the requests plus
	// RetryBudgetMinPerSecond for every second of it. Zero turns the budget
	// off (only max-retries and max-remote-workers bound retries).
	RetryBudgetWindow time.Duration `koanf:"retry-budget-window"`
	// RetryBudgetRatio is the share of recent requests that may be retried.
	RetryBudgetRatio float64 `koanf:"retry-budget-ratio"`
	// RetryBudgetMinPerSecond is the retries per second allowed whatever
	// the ratio, so that a node with few requests still retries them.
	RetryBudgetMinPerSecond float64 `koanf:"retry-budget-min-per-second"`
	// AdmissionQueueSize bounds the requests that wait at this node while
	// every worker that could run them is busy (remote ones and the local
	// one); each leaves when its deadline can no longer be met. Zero: a
	// request that finds every worker busy is answered unavailable at once.
	AdmissionQueueSize int `koanf:"admission-queue-size"`
	// LocalReserve is the share (0 to 1) of the local worker's running
	// slots and queue places kept for this node's own clients (its API and
	// CLI): work from peers never takes them. At least one running slot is
	// left to peers.
	LocalReserve float64 `koanf:"local-reserve"`
}

// Selection modes.
const (
	// ModeRating orders candidates by their rating score (the default).
	ModeRating = "rating"
	// ModeRoundRobin rotates through candidates; the benchmarks' baseline.
	ModeRoundRobin = "round-robin"
	// ModeRandom picks candidates in a random order.
	ModeRandom = "random"
)

// SelectionConfig chooses how candidates are ordered.
type SelectionConfig struct {
	// Mode is rating, round-robin or random.
	Mode string `koanf:"selection-mode"`
}

// LabelBalancingConfig configures priority groups by label. When set,
// candidates are split into groups by their group labels and the groups are
// tried in Order; rating orders each group.
type LabelBalancingConfig struct {
	// Order lists group labels, highest priority first. Required; entries
	// must be non-empty and unique.
	Order []string `koanf:"order"`
	// PassOnError, when true, moves to the next group after a retryable
	// error instead of retrying inside the current group.
	PassOnError bool `koanf:"pass-on-error"`
	// IncludeDefault, when true (nil means true), puts peers that carry none
	// of the Order labels into a final default group; when false they are
	// not routed to while label balancing is on.
	IncludeDefault *bool `koanf:"include-default"`
}

// IncludesDefault reports whether unlabeled peers form a final group.
func (lb *LabelBalancingConfig) IncludesDefault() bool {
	return lb == nil || lb.IncludeDefault == nil || *lb.IncludeDefault
}

// WorkTypeConfig overrides global settings for one work type.
type WorkTypeConfig struct {
	// LabelBalancing replaces the global label-balancing block whole for
	// this work type.
	LabelBalancing *LabelBalancingConfig `koanf:"label-balancing"`
	// Verify is the default check of this type's results, "agree/replicas"
	// such as "2/3", for a deterministic type (README, "Checked results").
	Verify string `koanf:"verify"`
}

// LivenessConfig drives the health polling of peers.
type LivenessConfig struct {
	// PollInterval is the time between two health pings to a peer; 0 turns
	// polling off.
	PollInterval time.Duration `koanf:"poll-interval"`
	// PollFailureThreshold is the failure count at which a peer becomes
	// unreachable. A failed poll adds one, a good one takes one away.
	PollFailureThreshold int `koanf:"poll-failure-threshold"`
	// PollSuccessThreshold is the number of good polls in a row an
	// unreachable peer must answer before it is alive again; 0 means alive
	// as soon as it is connected again.
	PollSuccessThreshold int `koanf:"poll-success-threshold"`
	// RedialBackoffMin is the first wait before redialing an unreachable peer.
	RedialBackoffMin time.Duration `koanf:"redial-backoff-min"`
	// RedialBackoffMax caps the doubling wait between redials.
	RedialBackoffMax time.Duration `koanf:"redial-backoff-max"`
	// StallThreshold is the number of work requests a peer accepted and
	// left unanswered past their deadline (each answer takes one away) at
	// which it is cordoned: unreachable for StallCordon, whatever its
	// health pings say; 0 turns the check off.
	StallThreshold int `koanf:"stall-threshold"`
	// StallCordon is how long a stalling peer is kept out before it is
	// redialed and probed; it doubles each time the peer stalls again
	// without having answered work in between, up to 16 times it.
	StallCordon time.Duration `koanf:"stall-cordon"`
	// PollBudget is how many alive peers a dispatcher polls per
	// PollInterval: with more alive peers than that, each is polled every
	// PollInterval times alive/PollBudget instead. Peers probing, awaiting
	// their first poll or unreachable keep their own pace. 0 polls every
	// alive peer every PollInterval.
	PollBudget int `koanf:"poll-budget"`
}

// RatingConfig drives the scoring of peers from their recent outcomes.
type RatingConfig struct {
	// Window is the half-life of a sample's weight: older outcomes count
	// less, so a peer that recovers is trusted again.
	Window time.Duration `koanf:"rating-window"`
	// MinSamples is the weighted number of outcomes before a peer is judged;
	// until then it is explored as unrated.
	MinSamples int `koanf:"rating-min-samples"`
	// Spread is the number of best peers a request picks among at random, to
	// spread load; 1 is strictly the best.
	Spread int `koanf:"rating-spread"`
	// LatencyWeight, ErrorWeight, BusyWeight, HeadLagWeight and LoadWeight
	// scale each term of the score.
	LatencyWeight float64 `koanf:"rating-latency-weight"`
	ErrorWeight   float64 `koanf:"rating-error-weight"`
	BusyWeight    float64 `koanf:"rating-busy-weight"`
	HeadLagWeight float64 `koanf:"rating-head-lag-weight"`
	LoadWeight    float64 `koanf:"rating-load-weight"`
	// LatencyFloor is the least latency a difference in latency is
	// measured against: a worker is compared with the best one's latency
	// or this, whichever is larger. 0 compares with the best one's alone.
	LatencyFloor time.Duration `koanf:"rating-latency-floor"`
}

// HedgeConfig drives concurrent extra attempts for idempotent work types.
type HedgeConfig struct {
	// Delay is the wait after an attempt starts before a hedge is sent
	// while the work type has fewer than MinSamples measured attempts, and
	// always when Quantile is 0.
	Delay time.Duration `koanf:"hedge-delay"`
	// MaxCount is the number of hedges per request; 0 turns hedging off.
	MaxCount int `koanf:"hedge-max-count"`
	// Quantile of the recent successful attempts of a work type that is
	// its measured hedge delay (0.95: p95); 0 turns measuring off.
	Quantile float64 `koanf:"hedge-quantile"`
	// Factor multiplies the quantile: the measured hedge delay is Factor
	// times it, so that a hedge waits past a type's normal tail.
	Factor float64 `koanf:"hedge-delay-factor"`
	// DelayMin and DelayMax bound the measured hedge delay.
	DelayMin time.Duration `koanf:"hedge-delay-min"`
	DelayMax time.Duration `koanf:"hedge-delay-max"`
	// Window is how long a measured attempt counts.
	Window time.Duration `koanf:"hedge-window"`
	// MinSamples is how many measured attempts within Window a work type
	// needs before its measured delay replaces Delay.
	MinSamples int `koanf:"hedge-min-samples"`
}

// Who may send a node work.
const (
	// AcceptAny takes work from every peer of the network.
	AcceptAny = "any"
	// AcceptAllowlist takes work only from the peers in allow-peer.
	AcceptAllowlist = "allowlist"
)

// AccessConfig says who may use this node's worker and API, and how much.
type AccessConfig struct {
	// AcceptWorkFrom is any or allowlist.
	AcceptWorkFrom string `koanf:"accept-work-from"`
	// AllowPeers are the peer IDs allowed to send work under allowlist.
	AllowPeers []string `koanf:"allow-peer"`
	// PeerMaxStreams bounds the work streams one peer may have open at once;
	// over it the peer is answered busy at once.
	PeerMaxStreams int `koanf:"peer-max-streams"`
	// PeerRate is the sustained requests per second one peer may send (a
	// token bucket); 0 means no rate limit.
	PeerRate float64 `koanf:"peer-rate"`
	// PeerBurst is the token bucket's size.
	PeerBurst int `koanf:"peer-burst"`
	// APIToken is the bearer token the local API requires; it must be set
	// when the API listens on anything but loopback.
	APIToken string `koanf:"api-token"`
}

// FaultConfig makes this node's worker fail, stall or drop work on purpose,
// for resilience drills. Everything is off by default.
type FaultConfig struct {
	// ErrorRate is the share of requests answered with a retryable error.
	ErrorRate float64 `koanf:"fault-error-rate"`
	// Delay is added before every request is worked on.
	Delay time.Duration `koanf:"fault-delay"`
	// DropRate is the share of requests dropped without an answer.
	DropRate float64 `koanf:"fault-drop-rate"`
}

// HTTPConfig bounds the http work type.
type HTTPConfig struct {
	// Allow lists the hosts, addresses and CIDRs (each with an optional
	// ":port", for that port only) the http work type may fetch from
	// besides public addresses; loopback, link-local and private ranges are
	// refused unless listed here. The node's own API and listen ports are
	// refused whatever it lists.
	Allow []string `koanf:"http-allow"`
	// MaxBody bounds the response body returned, in bytes.
	MaxBody int `koanf:"http-max-body"`
}

// JSONRPCConfig configures the jsonrpc work type's upstream.
type JSONRPCConfig struct {
	// Upstream is the JSON-RPC 2.0 endpoint this node relays to; empty means
	// the node does not serve jsonrpc.
	Upstream string `koanf:"jsonrpc-upstream"`
	// ChainID, when set, must match the upstream's eth_chainId at start.
	ChainID string `koanf:"jsonrpc-chain-id"`
	// HeadInterval is the time between two polls of the upstream's head.
	HeadInterval time.Duration `koanf:"jsonrpc-head-interval"`
	// Methods are the methods relayed to the upstream: a name
	// ("eth_call"), a namespace ("debug_*"), or "*" for every one. A
	// request calling another is answered method not found without
	// reaching the upstream: a node's administrative namespaces (admin_,
	// personal_, debug_, miner_) are not for every peer that may send it
	// work. Empty (as Go code may leave it) relays every method.
	Methods []string `koanf:"jsonrpc-methods"`
}

// DefaultJSONRPCMethods are the methods relayed by default: the chain's
// public ones.
var DefaultJSONRPCMethods = []string{"eth_*", "net_*", "web3_*"}

// MembershipConfig names who vouches for the members of a closed network.
// Load checks the two settings (see LoadOptions.Membership); with an
// authority the node takes records, work and protocol streams only from
// members (node.WithMembership).
type MembershipConfig struct {
	// NetworkAuthority is the authority's public key, the one line
	// `workmesh network init` printed; empty means an open network.
	NetworkAuthority string `koanf:"network-authority"`
	// MembershipCert is the path of this node's membership certificate,
	// from `workmesh network admit`; it needs NetworkAuthority.
	MembershipCert string `koanf:"membership-cert"`
}

// Defaults returns a Config with every default filled in.
func Defaults() Config {
	return Config{
		Node: NodeConfig{
			Network:          "workmesh",
			Listen:           []string{"/ip4/0.0.0.0/udp/4001/quic-v1", "/ip4/0.0.0.0/tcp/4001"},
			API:              "127.0.0.1:7400",
			WorkTypes:        []string{"echo", "sha256", "sleep"},
			AnnounceInterval: 5 * time.Minute,
			RecordTTL:        15 * time.Minute,
			LogLevel:         "info",
			LogFormat:        "text",
			DrainTimeout:     10 * time.Second,
			// Hostile peers (README): bounds on what records from the
			// network can make the node hold and dial.
			PeerTableCap:         10000,
			NewcomerDials:        8,
			NewcomerDialInterval: 2 * time.Second,
			Reachability:         ReachabilityAuto,
			RelayService:         true,
			// libp2p's relay v2 defaults: 128 slots, 16 circuits per
			// peer, 128 KiB and 2 minutes per circuit.
			RelayMaxReservations: 128,
			RelayMaxCircuits:     16,
			RelayLimitBytes:      1 << 17,
			RelayLimitDuration:   2 * time.Minute,
			HolePunching:         true,
		},
		Worker: WorkerConfig{
			WorkerTimeout:         500 * time.Millisecond,
			WorkerResponseTimeout: 250 * time.Millisecond,
			RTTFactor:             3,
			RTTMargin:             100 * time.Millisecond,
			PeerWaitMax:           5 * time.Second,
			// The seed design's single retry on a single remote worker
			// made one dead peer fail requests; these are hard caps
			// behind the retry budget (see README, "Retries").
			MaxRetries:              15,
			MaxSpawnAttempts:        3,
			WorkerBufferSize:        100,
			MaxRemoteWorkers:        16,
			ConnectTimeout:          time.Second,
			RetryDelay:              10 * time.Millisecond,
			LocalConcurrency:        4,
			RetryBudgetWindow:       10 * time.Second,
			RetryBudgetRatio:        0.2,
			RetryBudgetMinPerSecond: 10,
			AdmissionQueueSize:      1024,
			LocalReserve:            0.25,
		},
		Selection: SelectionConfig{Mode: ModeRating},
		Liveness: LivenessConfig{
			PollInterval:         2 * time.Second,
			PollFailureThreshold: 5,
			PollSuccessThreshold: 2,
			RedialBackoffMin:     500 * time.Millisecond,
			RedialBackoffMax:     30 * time.Second,
			StallThreshold:       2,
			StallCordon:          30 * time.Second,
			PollBudget:           512,
		},
		Rating: RatingConfig{
			Window:        30 * time.Second,
			MinSamples:    3,
			Spread:        1,
			LatencyWeight: 1,
			ErrorWeight:   4,
			BusyWeight:    2,
			HeadLagWeight: 1,
			LoadWeight:    1,
			LatencyFloor:  time.Millisecond,
		},
		Hedge: HedgeConfig{Delay: 100 * time.Millisecond, MaxCount: 0,
			Quantile: 0.95, Factor: 2, DelayMin: 2 * time.Millisecond, DelayMax: time.Second, Window: 30 * time.Second, MinSamples: 20},
		Access: AccessConfig{
			AcceptWorkFrom: AcceptAny,
			PeerMaxStreams: 64,
			PeerRate:       0,
			PeerBurst:      100,
		},
		HTTP:    HTTPConfig{MaxBody: 1 << 20},
		Limits:  LimitsConfig{MaxPayload: DefaultMaxPayload, MaxResult: DefaultMaxPayload},
		JSONRPC: JSONRPCConfig{HeadInterval: 2 * time.Second, Methods: slices.Clone(DefaultJSONRPCMethods)},
		Trust:   TrustConfig{ExploreShare: 0.1, DisputeThreshold: 3, DisputeWindow: time.Minute, DisputeCordon: 5 * time.Minute},
	}
}

// Reachability settings.
const (
	ReachabilityAuto    = "auto"
	ReachabilityPublic  = "public"
	ReachabilityPrivate = "private"
)
