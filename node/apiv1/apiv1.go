package apiv1

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/workmesh/workmesh/selection"
)

// InfoView is the body of GET /v1/info: who this node is and how to reach it.
type InfoView struct {
	PeerID    string   `json:"peer_id"`    // the node's peer ID
	Addrs     []string `json:"addrs"`      // listen addresses with /p2p/<peer id>, ready to bootstrap from
	Network   string   `json:"network"`    // the network it joined
	Version   string   `json:"version"`    // the workmesh version it runs
	WorkTypes []string `json:"work_types"` // the work types it advertises
	Labels    []string `json:"labels"`     // its group labels
	// Extra holds the fields added with WithInfo, in the order they were
	// added. Each is written after the fields above under its key; one
	// whose value is nil is left out.
	Extra []InfoField `json:"-"`
}

// InfoField is one field of GET /v1/info added with WithInfo.
type InfoField struct {
	Key   string // the JSON key
	Value any    // what the WithInfo function returned for this request
}

// MarshalJSON writes the fields of v and then its Extra fields, as if each
// were one more field of the struct.
func (v InfoView) MarshalJSON() ([]byte, error) {
	type fields InfoView // the struct's fields, without this method
	b, err := json.Marshal(fields(v))
	if err != nil || len(v.Extra) == 0 {
		return b, err
	}
	b = b[:len(b)-1] // reopen the object
	for _, f := range v.Extra {
		if f.Value == nil {
			continue
		}
		val, err := json.Marshal(f.Value)
		if err != nil {
			return nil, fmt.Errorf("info %s: %w", f.Key, err)
		}
		key, _ := json.Marshal(f.Key)
		b = append(append(append(append(b, ','), key...), ':'), val...)
	}
	return append(b, '}'), nil
}

// PeerView is one element of GET /v1/peers: one fresh peer of the table.
type PeerView struct {
	ID        string            `json:"id"`         // peer ID
	Addrs     []string          `json:"addrs"`      // listen addresses the peer signed, without /p2p
	WorkTypes []string          `json:"work_types"` // work types it serves
	Labels    []string          `json:"labels"`     // its group labels
	Heads     map[string]uint64 `json:"heads"`      // head per work type, for types that have one
	Capacity  Capacity          `json:"capacity"`   // how much work it takes at most
	Load      Load              `json:"load"`       // its load when it signed the record
	Version   string            `json:"version"`    // the workmesh version it runs
	Sequence  uint64            `json:"sequence"`   // sequence of its newest record
	LastSeen  time.Time         `json:"last_seen"`  // when a newer record last arrived
	Connected bool              `json:"connected"`  // whether this node has a connection to it
	Source    string            `json:"source"`     // how the newest record arrived: gossip, dht or sync
	// AttestedLabels are the labels the peer's membership certificate
	// attests, in a network with an authority (absent in an open one):
	// the only labels that count there.
	AttestedLabels []string `json:"attested_labels,omitempty"`
	// DeclaredLabels are the labels the peer declares that its
	// certificate does not attest, in a network with an authority: shown,
	// but no group counts them.
	DeclaredLabels []string `json:"declared_labels,omitempty"`
}

// Capacity is how much work a node accepts at most.
type Capacity struct {
	// MaxConcurrent is the number of requests it runs at once.
	MaxConcurrent int `json:"max_concurrent"`
	// QueueSize is the number of requests it lets wait.
	QueueSize int `json:"queue_size"`
}

// Load is how much work a node has at one moment.
type Load struct {
	// InFlight is the number of requests running.
	InFlight int `json:"in_flight"`
	// Queued is the number of requests waiting.
	Queued int `json:"queued"`
}

// Paths of the work API on a node's local HTTP API.
const (
	// WorkPath takes work: POST a JSON WorkRequest, get an WorkResponse.
	WorkPath = "/v1/work"
	// WorkStatsPath reports the API's counters: GET returns WorkStats.
	WorkStatsPath = "/v1/work/stats"
)

// DefaultMaxBody bounds a request body of POST /v1/work. It leaves room
// for a payload of 1 MiB (the work protocol's default) in base64 (a third
// larger) and JSON escapes.
const DefaultMaxBody = 2 << 20

// WorkRequest is the body of POST /v1/work. Payload and PayloadB64 are
// mutually exclusive; neither means an empty payload.
type WorkRequest struct {
	// Type is the work type; required.
	Type string `json:"type"`
	// Payload is the work's input as text.
	Payload *string `json:"payload,omitempty"`
	// PayloadB64 is the work's input as standard base64, for bytes that are
	// not text.
	PayloadB64 *string `json:"payload_b64,omitempty"`
	// Timeout bounds the whole request, as a Go duration ("2s"); empty
	// means the dispatcher's default.
	Timeout string `json:"timeout,omitempty"`
	// Labels a remote worker must carry.
	Labels []string `json:"labels,omitempty"`
	// MinHead is the position the request names, if any.
	MinHead *uint64 `json:"min_head,omitempty"`
	// Verify asks for the result from several distinct workers, compared
	// byte for byte (README, "Checked results").
	Verify *VerifyRequest `json:"verify,omitempty"`
}

// WorkResponse is the answer to POST /v1/work for a request that was
// dispatched: its one terminal result.
type WorkResponse struct {
	// RequestID names the request in logs.
	RequestID string `json:"request_id"`
	// Status is ok, empty, failed, timeout or unavailable.
	Status Status `json:"status"`
	// Result is the output when it is valid UTF-8 (status ok).
	Result *string `json:"result,omitempty"`
	// ResultB64 is the output, base64 in JSON, when it is not valid UTF-8.
	ResultB64 []byte `json:"result_b64,omitempty"`
	// Worker is "local" or the peer ID that produced the result.
	Worker string `json:"worker,omitempty"`
	// Attempts lists every attempt in the order they ended.
	Attempts []Attempt `json:"attempts"`
	// DurationMS is the time from submission to result, in milliseconds.
	DurationMS float64 `json:"duration_ms"`
	// Error says why the request did not succeed.
	Error string `json:"error,omitempty"`
	// Explanation says why no (further) remote worker was tried, counted by
	// reason.
	Explanation string `json:"explanation,omitempty"`
	// QueuedMS is the time the request waited at the node that took it, in
	// its admission queue, while every worker was busy.
	QueuedMS float64 `json:"queued_ms,omitempty"`
	// BusyRefusals counts the busy answers of the rounds before the last
	// one, which Attempts leaves out (it lists every other attempt).
	BusyRefusals int `json:"busy_refusals,omitempty"`
	// The detail of a failed run of a custom work type, next to Error.
	FailureDetail
	// Verify is how a verified request's votes went.
	Verify *VerifyView `json:"verify,omitempty"`
}

// FailureDetail is what a failed run of a custom work type adds to its
// error: the exit code and the end of stderr of a command, or the HTTP
// status and the start of the body of a local service (each text at most
// 2048 bytes).
type FailureDetail struct {
	// ExitCode is the command's exit code.
	ExitCode *int `json:"exit_code,omitempty"`
	// Stderr is the last lines of the command's standard error.
	Stderr string `json:"stderr,omitempty"`
	// HTTPStatus is the local service's HTTP status.
	HTTPStatus int `json:"http_status,omitempty"`
	// HTTPBody is the start of the local service's response body.
	HTTPBody string `json:"http_body,omitempty"`
	// RetryAfterMS is the wait a busy service asked for, in milliseconds.
	RetryAfterMS float64 `json:"retry_after_ms,omitempty"`
}

// Output returns the result's bytes, whichever field carries them.
func (r WorkResponse) Output() []byte {
	if r.Result != nil {
		return []byte(*r.Result)
	}
	return r.ResultB64
}

// Error is the answer when a request was not dispatched: a bad body, a
// wrong method, a body that is too large.
type Error struct {
	// Error says what is wrong.
	Error string `json:"error"`
	// Field names the body field at fault, when there is one.
	Field string `json:"field,omitempty"`
}

// WorkStats is the body of GET /v1/work/stats: how the API's requests ended
// since the node started.
type WorkStats struct {
	// Requests counts every request to WorkPath, dispatched or not.
	Requests uint64 `json:"requests"`
	// ByStatus counts dispatched requests by their result's status.
	ByStatus map[Status]uint64 `json:"by_status"`
	// ByReason counts requests that did not succeed by why:
	// bad_request, body_too_large, method_not_allowed (not dispatched);
	// no_worker (unavailable), shutting_down (unavailable: the node is
	// stopping), work_failed (a worker said the work cannot succeed),
	// all_attempts_failed, timeout.
	ByReason map[string]uint64 `json:"by_reason"`
}

// Status is how a dispatched request ended.
type Status string

// Statuses of a WorkResult.
const (
	// StatusOK: a worker did the work.
	StatusOK Status = "ok"
	// StatusEmpty: a worker answered with nothing, and that is the answer.
	StatusEmpty Status = "empty"
	// StatusFailed: the work failed (a permanent error, or every attempt failed).
	StatusFailed Status = "failed"
	// StatusTimeout: the request's deadline passed before any result.
	StatusTimeout Status = "timeout"
	// StatusUnavailable: no worker, remote or local, could take the work.
	StatusUnavailable Status = "unavailable"
	// StatusDisputed: a verified request's workers gave different results
	// and too few of them agreed (HTTP 409).
	StatusDisputed Status = "disputed"
)

// VerifyRequest asks for a request's result from Replicas distinct
// workers, Agree of which must give the same bytes.
type VerifyRequest struct {
	Replicas int `json:"replicas"`
	Agree    int `json:"agree"`
}

// VerifyView is how a verified request's votes went: who agreed on the
// result, and every worker's vote.
type VerifyView struct {
	Replicas int `json:"replicas"`
	Agree    int `json:"agree"`
	// Agreed names the workers whose results were the answer.
	Agreed []string `json:"agreed"`
	// Votes is every replica's vote, in the order they ended.
	Votes []Vote `json:"votes"`
}

// Vote is one worker's result in a verified request.
type Vote struct {
	// Worker is the peer ID, or "local"; empty when the replica found no
	// worker.
	Worker string `json:"worker,omitempty"`
	// Status is how its replica ended.
	Status Status `json:"status"`
	// Digest is the SHA-256 of its output, hex, for status ok.
	Digest string `json:"digest,omitempty"`
	// Error says why the replica gave no result.
	Error string `json:"error,omitempty"`
}

// Attempt is one try of a request on one worker.
type Attempt struct {
	// Peer is the worker's peer ID, or "local".
	Peer string `json:"peer"`
	// Outcome is how the attempt ended, by name in JSON ("busy").
	Outcome Outcome `json:"outcome"`
	// DurationMS is the attempt's time, in milliseconds.
	DurationMS float64 `json:"duration_ms"`
	// Error says why the attempt did not succeed, when it did not.
	Error string `json:"error,omitempty"`
	// Group is the priority group the worker was picked from.
	Group string `json:"group,omitempty"`
	// Hedge marks an attempt sent while an earlier one still ran.
	Hedge bool `json:"hedge,omitempty"`
}

// Outcome is how one attempt ended, by name in JSON: the selection
// core's type, which the work protocol, the dispatcher and the workers
// vocabulary use too (workers.Busy and the rest name its values).
type Outcome = selection.Outcome

// What an operator asks a node, and where the local HTTP API answers it.
const (
	// MetricsPath serves Prometheus metrics, all prefixed workmesh_.
	MetricsPath = "/metrics"
	// PeerStatusPath is the dispatcher's view of every fresh peer: the peer
	// table's record plus liveness state, rating score per work type and
	// the round-trip time of the last health poll (GET, []PeerStatus).
	PeerStatusPath = "/v1/peers/selection"
	// PlanPath says where a request would go without sending it: GET with
	// ?type=T&labels=a,b&min_head=N returns a PlanView.
	PlanPath = "/v1/plan"
	// StatusPath is this node at a glance (GET, StatusView).
	StatusPath = "/v1/status"
)

// TypeScore is a peer's place in the ranking of one work type.
type TypeScore struct {
	// WorkType is the work type.
	WorkType string `json:"work_type"`
	// Score is the rating score, higher is better.
	Score float64 `json:"score"`
	// Rated is false while the peer has too few samples to be judged; such
	// peers are explored first, one attempt at a time.
	Rated bool `json:"rated"`
	// Group is the first priority group the peer is in ("" for the default
	// group or without label balancing).
	Group string `json:"group"`
	// Rank is the peer's 1-based position in the type's order, groups
	// first, then rating.
	Rank int `json:"rank"`
}

// StateLeft is the State of a peer that left the network gracefully: its
// last record withdrew every work type (a draining node re-signs its
// record with none before it stops) and it is no longer connected. It is
// how the peer is shown, not a liveness state: liveness goes on judging
// it as any other peer until its record expires.
const StateLeft = "left"

// PeerStatus is one element of GET /v1/peers/selection: what the peer
// table holds of a peer and what the dispatcher makes of it.
type PeerStatus struct {
	PeerView
	// State is the liveness state, alive, unreachable or probing, or
	// StateLeft for a peer that stopped gracefully.
	State string `json:"state"`
	// Failures is the decaying failure count while alive.
	Failures int `json:"failures"`
	// Scores has the peer's rating for each work type it serves.
	Scores []TypeScore `json:"scores"`
	// RTTMS is the round-trip time of the last good health poll, in
	// milliseconds; absent before the first good poll.
	RTTMS *float64 `json:"rtt_ms,omitempty"`
	// LastPoll is when the peer was last polled; absent before the first
	// poll (polling off, or just joined).
	LastPoll *time.Time `json:"last_poll,omitempty"`
	// PollError is why the last poll failed, when it did.
	PollError string `json:"poll_error,omitempty"`
	// Reason is why the peer is not alive: polls that failed, a stall
	// (work accepted and left unanswered), no poll answered yet. Absent
	// while it is alive.
	Reason string `json:"reason,omitempty"`
	// Connection is direct, relayed (only through a relay, until a hole
	// punch makes it direct) or none.
	Connection string `json:"connection,omitempty"`
	// Disputes counts the peer's results outvoted by other workers, or
	// contradicted by an audit, since it was first seen.
	Disputes int `json:"disputes"`
}

// PlanRequest is what GET /v1/plan asks: a request's work type and the
// constraints that shape its plan.
type PlanRequest struct {
	// Type is the work type; required.
	Type string
	// Labels a remote worker must carry.
	Labels []string
	// MinHead is the position the request names, if any.
	MinHead *uint64
}

// PlanPeer is one member of a priority group in a plan.
type PlanPeer struct {
	// Peer is the peer ID.
	Peer string `json:"peer"`
	// Score and Rated are its rating for the work type.
	Score float64 `json:"score"`
	Rated bool    `json:"rated"`
	// State is its liveness state.
	State string `json:"state"`
	// Excluded is why this request may not try it ("" when it may).
	Excluded string `json:"excluded,omitempty"`
	// Detail completes Excluded: the missing label, the head asked for.
	Detail string `json:"detail,omitempty"`
}

// PlanGroup is one priority group, members in rated order.
type PlanGroup struct {
	// Label is the group's label; "" for the default group (peers with
	// none of the order's labels) or when label balancing is off.
	Label string `json:"label"`
	// Default marks the default group.
	Default bool `json:"default,omitempty"`
	// Peers are the members in the order the group is walked.
	Peers []PlanPeer `json:"peers"`
}

// PlanPick is one peer a request would try, in order.
type PlanPick struct {
	// Peer is the peer ID.
	Peer string `json:"peer"`
	// Group is the group it is picked from ("" for the default group).
	Group string `json:"group"`
	// Score and Rated are its rating for the work type.
	Score float64 `json:"score"`
	Rated bool    `json:"rated"`
}

// PlanExcluded is a candidate the request may not try, and why.
type PlanExcluded struct {
	Peer   string `json:"peer"`
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
}

// PlanCount is the number of candidates in one state of the plan, as the
// selection core counts them; "selectable" are the candidates the request
// may try.
type PlanCount struct {
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
	N      int    `json:"n"`
	// Text is the count as a phrase, e.g. "1 lacks label archive".
	Text string `json:"text"`
}

// PlanLimits are the bounds a request's remote attempts run under.
type PlanLimits struct {
	MaxRemoteWorkers int `json:"max_remote_workers"`
	MaxRetries       int `json:"max_retries"`
	HedgeMaxCount    int `json:"hedge_max_count"`
	// HedgeDelayMS is the work type's hedge delay now; HedgeDelayMeasured
	// says it is measured (hedge-quantile), not the fixed hedge-delay.
	HedgeDelayMS       float64 `json:"hedge_delay_ms"`
	HedgeDelayMeasured bool    `json:"hedge_delay_measured"`
}

// PlanView is the answer of GET /v1/plan: where a request would go now,
// worked out by the selection core without sending anything.
type PlanView struct {
	WorkType string   `json:"work_type"`
	Labels   []string `json:"labels"`
	MinHead  *uint64  `json:"min_head,omitempty"`
	// Mode is the selection mode (rating, round-robin, random).
	Mode string `json:"selection_mode"`
	// LabelOrder is the label-balancing order, nil when it is off.
	LabelOrder     []string `json:"label_order,omitempty"`
	PassOnError    bool     `json:"pass_on_error,omitempty"`
	IncludeDefault bool     `json:"include_default,omitempty"`
	// BeyondHead: the position is above every candidate's head, so one
	// attempt on the best candidate decides, with no retry or fallback.
	BeyondHead bool `json:"beyond_head"`
	// Groups are the priority groups in order, members in rated order.
	Groups []PlanGroup `json:"groups"`
	// Order is the peers a request would try, in order, if every attempt
	// failed, within the limits (with rating-spread above 1 it is one
	// draw of several possible).
	Order []PlanPick `json:"order"`
	// Excluded lists every candidate the request may not try, and why.
	Excluded []PlanExcluded `json:"excluded"`
	// Candidates is the number of peers that advertise the work type.
	Candidates int `json:"candidates"`
	// Counts are the candidates by reason, as the selection core counts
	// them.
	Counts []PlanCount `json:"counts"`
	// Explanation is the counts in one line.
	Explanation string `json:"explanation"`
	// Fallback says whether the local worker would run the request when no
	// remote attempt succeeded; FallbackNote says why not.
	Fallback     bool       `json:"fallback"`
	FallbackNote string     `json:"fallback_note,omitempty"`
	Limits       PlanLimits `json:"limits"`
}

// LivenessCounts are peers by liveness state.
type LivenessCounts struct {
	Alive       int `json:"alive"`
	Unreachable int `json:"unreachable"`
	Probing     int `json:"probing"`
}

// StatusView is the answer of GET /v1/status: this node at a glance.
type StatusView struct {
	PeerID    string    `json:"peer_id"`
	Network   string    `json:"network"`
	Version   string    `json:"version"`
	StartTime time.Time `json:"start_time"`
	// UptimeS is the time since the node started, in seconds.
	UptimeS   float64  `json:"uptime_s"`
	WorkTypes []string `json:"work_types"`
	Labels    []string `json:"labels"`
	// Addrs are the addresses another host can dial the node at, with
	// /p2p/<id> (loopback ones only when it has no other).
	Addrs []string `json:"addrs"`
	// Join is the command another host runs to join the network through
	// this node ("" when it has no address).
	Join  string `json:"join"`
	Peers struct {
		// Known counts the peer table, fresh or not yet expired.
		Known int `json:"known"`
		// Fresh counts peers within their record TTL.
		Fresh int `json:"fresh"`
		// Connected counts fresh peers with a connection.
		Connected int `json:"connected"`
	} `json:"peers"`
	// Liveness is the dispatcher's peers by liveness state.
	Liveness LivenessCounts `json:"liveness"`
	// InFlight is the requests being dispatched now.
	InFlight int64 `json:"in_flight"`
	// Local is the local worker's load and capacity.
	Local struct {
		InFlight      int `json:"in_flight"`
		Queued        int `json:"queued"`
		MaxConcurrent int `json:"max_concurrent"`
		QueueSize     int `json:"queue_size"`
	} `json:"local"`
	// Requests counts the work API's requests, when the status knows the
	// API (see WithStatusAPI).
	Requests *WorkStats `json:"requests,omitempty"`
	// Served counts what the work server answered peers, by outcome.
	Served map[string]uint64 `json:"served,omitempty"`
	// Rejections counts NodeData records refused, by reason.
	Rejections map[string]uint64 `json:"rejections"`
	// NetworkAuthority is the public key line of the authority whose
	// certificates make a peer a member; "" is an open network.
	NetworkAuthority string `json:"network_authority,omitempty"`
	// OpenNetwork is true when no network authority is set: any peer may
	// join. The JSON always derives it from NetworkAuthority.
	OpenNetwork bool `json:"open_network"`
	// Reachability is public, private or unknown: whether hosts anywhere
	// can dial this node directly (AutoNAT's verdict, or the reachability
	// setting).
	Reachability string `json:"reachability,omitempty"`
	// AdvertisedAddrs are the addresses in the node's signed record.
	AdvertisedAddrs []string `json:"advertised_addrs,omitempty"`
	// RelayAddrs are those of AdvertisedAddrs that go through a relay.
	RelayAddrs []string `json:"relay_addrs,omitempty"`
	// NAT counts hole punches and relay slots.
	NAT *NATStats `json:"nat,omitempty"`
}

// MarshalJSON writes v with OpenNetwork derived from NetworkAuthority, so
// that a status never claims a closed network it does not have, nor the
// reverse, whoever filled it in.
func (v StatusView) MarshalJSON() ([]byte, error) {
	type plain StatusView
	v.OpenNetwork = v.NetworkAuthority == ""
	return json.Marshal(plain(v))
}

// Millis is d in milliseconds, to the microsecond: the unit of the
// bodies' duration_ms fields.
func Millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// NATStats counts what a node did to be reached from behind NAT.
type NATStats struct {
	// HolePunchesTried, HolePunchesSucceeded and HolePunchesFailed count
	// hole punch attempts (DCUtR): tried when one starts, succeeded or
	// failed when it ends.
	HolePunchesTried     uint64 `json:"hole_punches_tried"`
	HolePunchesSucceeded uint64 `json:"hole_punches_succeeded"`
	HolePunchesFailed    uint64 `json:"hole_punches_failed"`
	// HolePunchRetries counts punches this node asked for again, to peers
	// it stayed connected to only through a relay.
	HolePunchRetries uint64 `json:"hole_punch_retries"`
	// RelayReservations is the relays this node holds a slot on now.
	RelayReservations int `json:"relay_reservations"`
	// DialsSkipped counts dials to addresses this node cannot reach (a
	// private address of another site) that were not made.
	DialsSkipped uint64 `json:"dials_skipped"`
	// DialsGated counts addresses the dial guard refused to dial: named
	// by another peer's word (a DHT answer, say) at an IP their peer was
	// never seen at, with the newcomer budget spent or the IP closed.
	DialsGated uint64 `json:"dials_gated"`
	// RelayedWork counts work requests sent over relayed connections.
	RelayedWork uint64 `json:"relayed_work"`
	// LastHolePunchError says why the last failed hole punch failed.
	LastHolePunchError string `json:"last_hole_punch_error,omitempty"`
}
