package workers

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/selection"
)

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

// unknownWorkType is the work_type label of requests for a type that no
// peer advertises and the local worker does not serve: clients choose type
// names, and metrics must not grow a series for each one they make up.
const unknownWorkType = "unknown"

// dispatchMetrics are the counters only the dispatcher can keep, because
// they are about requests and polls as they happen. Everything that is
// state (liveness, scores, peers) is read at scrape time instead.
type dispatchMetrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	attempts    *prometheus.CounterVec
	hedgesFired prometheus.Counter
	hedgesWon   prometheus.Counter
	fallbacks   *prometheus.CounterVec
	beyondHead  *prometheus.CounterVec
	transitions *prometheus.CounterVec
	polls       *prometheus.CounterVec
	pollRTT     prometheus.Histogram
	inFlight    atomic.Int64

	mu    sync.Mutex
	lastP map[string]pollSample // by raw peer ID
}

// pollSample is the last health poll of one peer.
type pollSample struct {
	at  time.Time
	rtt time.Duration // of the last good poll
	ok  time.Time     // when the last good poll was
	err string        // of the last poll, when it failed
}

func newDispatchMetrics() *dispatchMetrics {
	return &dispatchMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workmesh_requests_total",
			Help: "Requests dispatched, by work type and how they ended (ok, empty, failed, timeout, unavailable).",
		}, []string{"work_type", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "workmesh_request_duration_seconds",
			Help:    "Time from submission to result of dispatched requests, by work type.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"work_type"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workmesh_attempts_total",
			Help: "Attempts of dispatched requests, by outcome and peer (\"local\" for the local worker).",
		}, []string{"outcome", "peer"}),
		hedgesFired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "workmesh_hedges_fired_total",
			Help: "Hedged attempts started: concurrent extra attempts for idempotent work.",
		}),
		hedgesWon: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "workmesh_hedges_won_total",
			Help: "Hedged attempts whose answer became the request's result.",
		}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workmesh_fallbacks_total",
			Help: "Requests the local worker ran because no remote attempt decided them, by work type.",
		}, []string{"work_type"}),
		beyondHead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workmesh_beyond_head_total",
			Help: "Requests naming a position above every candidate's head: one attempt, no retry, no fallback.",
		}, []string{"work_type"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workmesh_liveness_transitions_total",
			Help: "Liveness state changes of peers, by from and to state.",
		}, []string{"from", "to"}),
		polls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workmesh_polls_total",
			Help: "Health polls of peers (and redials of unreachable ones), by result: ok or failed.",
		}, []string{"result"}),
		pollRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "workmesh_poll_rtt_seconds",
			Help:    "Round-trip time of good health polls.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		lastP: make(map[string]pollSample),
	}
}

// transition counts one liveness state change. Liveness calls it with its
// lock held: it only counts.
func (m *dispatchMetrics) transition(t selection.Transition) {
	m.transitions.WithLabelValues(t.From.String(), t.To.String()).Inc()
}

// poll records one health poll of the peer with raw ID id.
func (m *dispatchMetrics) poll(id string, rtt time.Duration, err error, now time.Time) {
	m.mu.Lock()
	s := m.lastP[id]
	s.at = now
	if err == nil {
		s.rtt, s.ok, s.err = rtt, now, ""
	} else {
		s.err = err.Error()
	}
	m.lastP[id] = s
	m.mu.Unlock()
	if err != nil {
		m.polls.WithLabelValues("failed").Inc()
		return
	}
	m.polls.WithLabelValues("ok").Inc()
	m.pollRTT.Observe(rtt.Seconds())
}

// lastPoll returns the last poll of the peer with raw ID id.
func (m *dispatchMetrics) lastPoll(id string) (pollSample, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.lastP[id]
	return s, ok
}

// retain forgets the polls of peers that are no longer in keep.
func (m *dispatchMetrics) retain(keep map[string]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.lastP {
		if !keep[id] {
			delete(m.lastP, id)
		}
	}
}

// request counts one finished request: its status, every attempt, the
// hedges, a fallback, a beyond-head short-circuit. workType is the label
// to count it under.
func (m *dispatchMetrics) request(workType string, res WorkResult, beyondHead bool) {
	m.requests.WithLabelValues(workType, string(res.Status)).Inc()
	m.duration.WithLabelValues(workType).Observe(res.Duration.Seconds())
	local := false
	for _, a := range res.Attempts {
		m.attempts.WithLabelValues(a.Outcome, a.Peer).Inc()
		if a.Peer == LocalWorker {
			local = true
		}
		if a.Hedge {
			m.hedgesFired.Inc()
			if a.Peer == res.Worker && (res.Status == StatusOK || res.Status == StatusEmpty) {
				m.hedgesWon.Inc()
			}
		}
	}
	if local {
		m.fallbacks.WithLabelValues(workType).Inc()
	}
	if beyondHead {
		m.beyondHead.WithLabelValues(workType).Inc()
	}
}

// observe is the dispatcher's one hook at the end of a request: it counts
// the request and logs it with request_id, work_type and peer fields. plan
// is nil for a request refused before it was planned.
func (d *Dispatcher) observe(req WorkRequest, res WorkResult, plan *selection.Plan) {
	wt := req.Type
	if res.Status == StatusUnavailable && len(res.Attempts) == 0 && !d.knownType(wt) {
		wt = unknownWorkType
	}
	d.metrics.request(wt, res, plan != nil && plan.BeyondHead())
	ok := res.Status == StatusOK || res.Status == StatusEmpty
	if ok && !d.debug {
		return
	}
	worker := res.Worker
	if worker == "" {
		worker = "none"
	}
	f := d.log.WithFields(logrus.Fields{
		"request_id": req.ID, "work_type": req.Type, "peer": worker, "status": string(res.Status),
		"attempts": len(res.Attempts), "duration": res.Duration,
	})
	if d.debug {
		for _, a := range res.Attempts {
			af := d.log.WithFields(logrus.Fields{
				"request_id": req.ID, "work_type": req.Type, "peer": a.Peer, "outcome": a.Outcome,
				"duration_ms": a.DurationMS, "group": a.Group, "hedge": a.Hedge,
			})
			if a.Error != "" {
				af = af.WithField("error", a.Error)
			}
			af.Debug("attempt done")
		}
	}
	if ok {
		f.Debug("request done")
		return
	}
	f.WithField("error", res.Error).Info("request did not succeed")
}

// knownType reports whether some peer advertises the work type or the
// local worker serves it.
func (d *Dispatcher) knownType(wt string) bool {
	if d.pool != nil {
		if _, ok := d.pool.Registry().Get(wt); ok {
			return true
		}
	}
	return len(d.sel.Ranking(wt)) > 0
}

// Metric descriptions of the dispatcher's state, read at scrape time.
var (
	descInFlight = prometheus.NewDesc("workmesh_dispatch_in_flight",
		"Requests being dispatched now.", nil, nil)
	descLiveness = prometheus.NewDesc("workmesh_peer_liveness_state",
		"Liveness state of each fresh peer: 1 for its current state, 0 for the others.", []string{"peer", "state"}, nil)
	descLivenessCount = prometheus.NewDesc("workmesh_peers_by_liveness",
		"Peers the dispatcher tracks, by liveness state.", []string{"state"}, nil)
	descScore = prometheus.NewDesc("workmesh_peer_score",
		"Rating score of each peer for each work type it serves (higher is better).", []string{"peer", "work_type"}, nil)
	descRated = prometheus.NewDesc("workmesh_peer_rated",
		"1 when the peer has enough samples to be judged for the work type, 0 while it is explored.", []string{"peer", "work_type"}, nil)
	descPeerRTT = prometheus.NewDesc("workmesh_peer_poll_rtt_seconds",
		"Round-trip time of the last good health poll of each peer.", []string{"peer"}, nil)
)

// Collector returns a Prometheus collector of the dispatcher: its request,
// attempt, hedge, fallback, beyond-head, poll and liveness-transition
// counters, and, read at scrape time, the liveness state, score and poll
// round-trip time of every peer. Register it in the node's own registry.
//
// Transitions are counted through the selector's Liveness.OnTransition,
// which the dispatcher sets when it is made; replacing it stops the count.
func (d *Dispatcher) Collector() prometheus.Collector { return dispatchCollector{d} }

type dispatchCollector struct{ d *Dispatcher }

func (c dispatchCollector) counters() []prometheus.Collector {
	m := c.d.metrics
	return []prometheus.Collector{m.requests, m.duration, m.attempts, m.hedgesFired, m.hedgesWon,
		m.fallbacks, m.beyondHead, m.transitions, m.polls, m.pollRTT}
}

// Describe implements prometheus.Collector.
func (c dispatchCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, col := range c.counters() {
		col.Describe(ch)
	}
	for _, d := range []*prometheus.Desc{descInFlight, descLiveness, descLivenessCount, descScore, descRated, descPeerRTT} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c dispatchCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	for _, col := range c.counters() {
		col.Collect(ch)
	}
	ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(d.metrics.inFlight.Load()))
	live := d.sel.Liveness()
	counts := live.Counts()
	for _, s := range selection.States() {
		ch <- prometheus.MustNewConstMetric(descLivenessCount, prometheus.GaugeValue, float64(counts[s]), s.String())
	}
	infos := d.node.Peers().Peers()
	types := map[string]bool{}
	keep := make(map[string]bool, len(infos))
	for _, pi := range infos {
		raw := string(pi.Data.PeerID)
		keep[raw] = true
		id := pi.Data.PeerID.String()
		state := live.State(raw)
		for _, s := range selection.States() {
			v := 0.0
			if s == state {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descLiveness, prometheus.GaugeValue, v, id, s.String())
		}
		if p, ok := d.metrics.lastPoll(raw); ok && !p.ok.IsZero() {
			ch <- prometheus.MustNewConstMetric(descPeerRTT, prometheus.GaugeValue, p.rtt.Seconds(), id)
		}
		for _, wt := range pi.Data.WorkTypes {
			types[wt.Name] = true
		}
	}
	d.metrics.retain(keep) // the last polls of peers that left
	for wt := range types {
		seen := map[string]bool{} // a peer in several groups is scored once
		for _, r := range d.sel.Ranking(wt) {
			if seen[r.Peer] {
				continue
			}
			seen[r.Peer] = true
			id := peer.ID(r.Peer).String()
			ch <- prometheus.MustNewConstMetric(descScore, prometheus.GaugeValue, r.Score, id, wt)
			ch <- prometheus.MustNewConstMetric(descRated, prometheus.GaugeValue, boolValue(r.Rated), id, wt)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Metric descriptions of the local worker and the work server.
var (
	descLocalInFlight = prometheus.NewDesc("workmesh_local_in_flight", "Requests the local worker runs now.", nil, nil)
	descLocalQueued   = prometheus.NewDesc("workmesh_local_queued", "Requests waiting for the local worker.", nil, nil)
	descLocalCapacity = prometheus.NewDesc("workmesh_local_capacity",
		"What the local worker takes at most: kind=concurrent runs at once, kind=queue may wait.", []string{"kind"}, nil)
	descServed = prometheus.NewDesc("workmesh_served_total",
		"Work requests from peers answered by this node's work server, by outcome.", []string{"outcome"}, nil)
	descServedMalformed = prometheus.NewDesc("workmesh_served_malformed_total",
		"Work streams from peers whose request could not be read or decoded.", nil, nil)
	descServedDropped = prometheus.NewDesc("workmesh_served_dropped_total",
		"Work streams from peers that ended without a response for another reason.", nil, nil)
	descAPIRefused = prometheus.NewDesc("workmesh_api_refused_total",
		"Requests to POST /v1/work refused before dispatch, by reason.", []string{"reason"}, nil)
)

// NewPoolCollector returns a Prometheus collector of the local worker's
// load and capacity, read at scrape time.
func NewPoolCollector(p *Pool) prometheus.Collector { return poolCollector{p} }

type poolCollector struct{ p *Pool }

// Describe implements prometheus.Collector.
func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLocalInFlight
	ch <- descLocalQueued
	ch <- descLocalCapacity
}

// Collect implements prometheus.Collector.
func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.p.Stats()
	ch <- prometheus.MustNewConstMetric(descLocalInFlight, prometheus.GaugeValue, float64(st.InFlight))
	ch <- prometheus.MustNewConstMetric(descLocalQueued, prometheus.GaugeValue, float64(st.Queued))
	ch <- prometheus.MustNewConstMetric(descLocalCapacity, prometheus.GaugeValue, float64(st.MaxConcurrent), "concurrent")
	ch <- prometheus.MustNewConstMetric(descLocalCapacity, prometheus.GaugeValue, float64(st.QueueSize), "queue")
}

// NewServerCollector returns a Prometheus collector of the work server's
// counters (what this node did for its peers), read at scrape time.
func NewServerCollector(s *Server) prometheus.Collector { return serverCollector{s} }

type serverCollector struct{ s *Server }

// Describe implements prometheus.Collector.
func (c serverCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descServed
	ch <- descServedMalformed
	ch <- descServedDropped
}

// Collect implements prometheus.Collector.
func (c serverCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	for o, n := range st.ByOutcome {
		ch <- prometheus.MustNewConstMetric(descServed, prometheus.CounterValue, float64(n), o.String())
	}
	ch <- prometheus.MustNewConstMetric(descServedMalformed, prometheus.CounterValue, float64(st.Malformed))
	ch <- prometheus.MustNewConstMetric(descServedDropped, prometheus.CounterValue, float64(st.Dropped))
}

// Collector returns a Prometheus collector of the requests the work API
// refused before dispatching them (bad_request, body_too_large,
// method_not_allowed). Dispatched requests are the dispatcher's
// workmesh_requests_total.
func (a *API) Collector() prometheus.Collector { return apiCollector{a} }

type apiCollector struct{ a *API }

// Describe implements prometheus.Collector.
func (c apiCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descAPIRefused }

// Collect implements prometheus.Collector.
func (c apiCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.a.Stats()
	for _, r := range []string{reasonBadRequest, reasonTooLarge, reasonMethod} {
		ch <- prometheus.MustNewConstMetric(descAPIRefused, prometheus.CounterValue, float64(st.ByReason[r]), r)
	}
}

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

// PeerStatus is one element of GET /v1/peers/selection: what the peer
// table holds of a peer and what the dispatcher makes of it.
type PeerStatus struct {
	node.PeerView
	// State is the liveness state: alive, unreachable or probing.
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
}

// PeerStatuses returns the dispatcher's view of every fresh peer, ordered
// by peer ID.
func (d *Dispatcher) PeerStatuses() []PeerStatus {
	infos := d.node.Peers().Peers()
	out := make([]PeerStatus, 0, len(infos))
	idx := make(map[string]int, len(infos))
	keep := make(map[string]bool, len(infos))
	types := map[string]bool{}
	live := d.sel.Liveness()
	for _, pi := range infos {
		raw := string(pi.Data.PeerID)
		keep[raw] = true
		ps := PeerStatus{
			PeerView: node.NewPeerView(pi), State: live.State(raw).String(),
			Failures: live.Failures(raw), Scores: []TypeScore{},
		}
		if p, ok := d.metrics.lastPoll(raw); ok {
			at := p.at.UTC()
			ps.LastPoll, ps.PollError = &at, p.err
			if !p.ok.IsZero() {
				v := ms(p.rtt)
				ps.RTTMS = &v
			}
		}
		idx[raw] = len(out)
		out = append(out, ps)
		for _, wt := range pi.Data.WorkTypes {
			types[wt.Name] = true
		}
	}
	d.metrics.retain(keep) // the last polls of peers that left
	names := make([]string, 0, len(types))
	for wt := range types {
		names = append(names, wt)
	}
	sort.Strings(names)
	for _, wt := range names {
		rank := 0
		seen := map[string]bool{}
		for _, r := range d.sel.Ranking(wt) {
			if seen[r.Peer] {
				continue
			}
			seen[r.Peer] = true
			rank++
			if i, ok := idx[r.Peer]; ok {
				out[i].Scores = append(out[i].Scores, TypeScore{WorkType: wt, Score: r.Score, Rated: r.Rated, Group: r.Group, Rank: rank})
			}
		}
	}
	return out
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

// Plan works out where a request would go now, without sending it: the
// groups in order with their members in rated order, the peers it would
// try, every excluded candidate with its reason, and the counts by reason.
// The picks it takes from the selection core are reported back as
// cancelled, so nothing stays counted in flight.
func (d *Dispatcher) Plan(req PlanRequest) PlanView {
	// The view has no payload: a jsonrpc request shows as not hedged.
	sreq := selection.Request{WorkType: req.Type, Labels: req.Labels, Idempotent: idempotent(&WorkRequest{Type: req.Type})}
	if req.MinHead != nil {
		sreq.MinHead, sreq.HasMinHead = *req.MinHead, true
	}
	plan := d.sel.Plan(sreq)
	v := PlanView{
		WorkType: req.Type, Labels: req.Labels, MinHead: req.MinHead,
		Mode: d.cfg.Selection.Mode, BeyondHead: plan.BeyondHead(),
		Groups: []PlanGroup{}, Order: []PlanPick{}, Excluded: []PlanExcluded{}, Counts: []PlanCount{},
		Limits: PlanLimits{d.cfg.Worker.MaxRemoteWorkers, d.cfg.Worker.MaxRetries, d.cfg.Hedge.MaxCount},
	}
	if v.Labels == nil {
		v.Labels = []string{}
	}
	if v.Mode == "" {
		v.Mode = config.ModeRating
	}
	lb := d.cfg.LabelBalancingFor(req.Type)
	if lb != nil {
		v.LabelOrder, v.PassOnError, v.IncludeDefault = lb.Order, lb.PassOnError, lb.IncludesDefault()
	}

	// The counts come from the core, before anything is picked, so that a
	// selectable peer reads as selectable rather than as already tried.
	x := plan.Explain()
	v.Candidates = x.Candidates
	parts := make([]string, 0, len(x.Counts))
	for _, c := range x.Counts {
		pc := PlanCount{Reason: c.Reason.String(), Detail: c.Detail, N: c.N, Text: c.String()}
		if c.Reason == selection.ReasonLimit {
			pc = PlanCount{Reason: "selectable", N: c.N, Text: fmt.Sprintf("%d selectable", c.N)}
		}
		v.Counts = append(v.Counts, pc)
		parts = append(parts, pc.Text)
	}
	if x.Candidates == 0 && len(x.Counts) == 0 {
		v.Explanation = x.String()
	} else {
		noun := "candidates"
		if x.Candidates == 1 {
			noun = "candidate"
		}
		v.Explanation = fmt.Sprintf("%d %s for work type %s: %s", x.Candidates, noun, req.Type, strings.Join(parts, ", "))
	}

	// The order a request would walk: every pick is handed back at once.
	for range d.cfg.Worker.MaxRemoteWorkers + d.cfg.Worker.MaxRetries + 1 {
		pk, ok := plan.Next()
		if !ok {
			break
		}
		plan.Report(pk, selection.Cancelled, 0)
		v.Order = append(v.Order, PlanPick{Peer: peer.ID(pk.Peer).String(), Group: pk.Group, Score: pk.Score, Rated: pk.Rated})
	}

	v.Groups, v.Excluded = d.planGroups(sreq, lb, plan.BeyondHead())
	local := d.pool != nil
	if local {
		_, local = d.pool.Registry().Get(req.Type)
	}
	switch {
	case !plan.FallbackAllowed():
		v.FallbackNote = "beyond every head the one remote answer is final"
	case !local:
		v.FallbackNote = "the local worker does not serve " + req.Type
	default:
		v.Fallback = true
	}
	return v
}

// planGroups lays out the ranking of the request's work type by group and
// says why each excluded candidate is excluded. The stages are those of the
// selection core's plan, in its order: label constraints, head, liveness;
// candidates outside every group come from the peer table.
func (d *Dispatcher) planGroups(req selection.Request, lb *config.LabelBalancingConfig, beyondHead bool) ([]PlanGroup, []PlanExcluded) {
	ranking := d.sel.Ranking(req.WorkType)
	var groups []PlanGroup
	if lb == nil {
		groups = []PlanGroup{{Peers: []PlanPeer{}}}
	} else {
		for _, l := range lb.Order {
			groups = append(groups, PlanGroup{Label: l, Peers: []PlanPeer{}})
		}
		if lb.IncludesDefault() {
			groups = append(groups, PlanGroup{Default: true, Peers: []PlanPeer{}})
		}
	}
	excluded := []PlanExcluded{}
	seen := map[string]bool{}
	for _, r := range ranking {
		gi := slices.IndexFunc(groups, func(g PlanGroup) bool { return g.Label == r.Group })
		if gi < 0 {
			continue // a group that changed under the snapshot
		}
		id := peer.ID(r.Peer).String()
		pp := PlanPeer{Peer: id, Score: r.Score, Rated: r.Rated, State: r.State.String()}
		pp.Excluded, pp.Detail = d.excludedBy(req, r, beyondHead)
		groups[gi].Peers = append(groups[gi].Peers, pp)
		if !seen[r.Peer] {
			seen[r.Peer] = true
			if pp.Excluded != "" {
				excluded = append(excluded, PlanExcluded{Peer: id, Reason: pp.Excluded, Detail: pp.Detail})
			}
		}
	}
	if lb != nil && !lb.IncludesDefault() {
		for _, pi := range d.node.Peers().Peers() {
			if seen[string(pi.Data.PeerID)] || !pi.Data.Serves(req.WorkType) {
				continue
			}
			if !slices.ContainsFunc(lb.Order, func(l string) bool { return slices.Contains(pi.Data.Labels, l) }) {
				excluded = append(excluded, PlanExcluded{Peer: pi.Data.PeerID.String(), Reason: selection.ReasonNotInGroup.String()})
			}
		}
	}
	return groups, excluded
}

// excludedBy says why the request may not try a ranked peer, or "".
func (d *Dispatcher) excludedBy(req selection.Request, r selection.Ranked, beyondHead bool) (string, string) {
	pi, ok := d.node.Peers().Get(peer.ID(r.Peer))
	if ok {
		for _, l := range req.Labels {
			if !slices.Contains(pi.Data.Labels, l) {
				return selection.ReasonLacksLabel.String(), l
			}
		}
		if h, has := pi.Data.Head(req.WorkType); req.HasMinHead && !beyondHead && has && h < req.MinHead {
			return selection.ReasonHeadBelow.String(), strconv.FormatUint(req.MinHead, 10)
		}
	}
	switch r.State {
	case selection.StateUnreachable:
		return selection.ReasonUnreachable.String(), ""
	case selection.StateProbing:
		return selection.ReasonProbing.String(), ""
	}
	return "", ""
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
	Peers     struct {
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
	Requests *APIStats `json:"requests,omitempty"`
	// Served counts what the work server answered peers, by outcome.
	Served map[string]uint64 `json:"served,omitempty"`
	// Rejections counts NodeData records refused, by reason.
	Rejections map[string]uint64 `json:"rejections"`
}

// Status returns this node at a glance: who it is, its peers, what is in
// flight and queued, and its peers' liveness.
func (d *Dispatcher) Status() StatusView {
	info := d.node.Info()
	nd := d.node.NodeData().Data
	v := StatusView{
		PeerID: info.PeerID, Network: info.Network, Version: info.Version,
		StartTime: nd.StartTime.UTC(), UptimeS: time.Since(nd.StartTime).Seconds(),
		WorkTypes: info.WorkTypes, Labels: info.Labels,
		InFlight:   d.metrics.inFlight.Load(),
		Rejections: map[string]uint64{},
	}
	table := d.node.Peers()
	peers := table.Peers()
	v.Peers.Known, v.Peers.Fresh = table.Known(), len(peers)
	for _, p := range peers {
		if p.Connected {
			v.Peers.Connected++
		}
	}
	c := d.sel.Liveness().Counts()
	v.Liveness = LivenessCounts{c[selection.StateAlive], c[selection.StateUnreachable], c[selection.StateProbing]}
	if d.pool != nil {
		st := d.pool.Stats()
		v.Local.InFlight, v.Local.Queued, v.Local.MaxConcurrent, v.Local.QueueSize = st.InFlight, st.Queued, st.MaxConcurrent, st.QueueSize
	}
	for r, n := range table.Rejections() {
		v.Rejections[r.String()] = n
	}
	return v
}

// Operator serves what an operator asks a node on its local HTTP API:
// Prometheus metrics, the dispatcher's view of its peers, the plan a
// request would get, and the node's status.
type Operator struct {
	d      *Dispatcher
	gather prometheus.Gatherer
	api    *API
	server *Server
	log    logrus.FieldLogger
}

// OperatorOption adjusts an Operator.
type OperatorOption func(*Operator) error

// WithStatusAPI adds the work API's request counters to GET /v1/status.
func WithStatusAPI(a *API) OperatorOption {
	return func(o *Operator) error {
		if a == nil {
			return errors.New("operator API: nil work API")
		}
		o.api = a
		return nil
	}
}

// WithStatusServer adds the work server's counters to GET /v1/status.
func WithStatusServer(s *Server) OperatorOption {
	return func(o *Operator) error {
		if s == nil {
			return errors.New("operator API: nil work server")
		}
		o.server = s
		return nil
	}
}

// WithOperatorLogger sets the logger for failures to write a response.
func WithOperatorLogger(log logrus.FieldLogger) OperatorOption {
	return func(o *Operator) error {
		if log == nil {
			return errors.New("operator API: nil logger")
		}
		o.log = log
		return nil
	}
}

// NewOperator returns the operator endpoints of dispatcher d; /metrics
// serves what gather collects (the node's own registry).
func NewOperator(d *Dispatcher, gather prometheus.Gatherer, opts ...OperatorOption) (*Operator, error) {
	if d == nil || gather == nil {
		return nil, errors.New("operator API: needs a dispatcher and a metrics gatherer")
	}
	o := &Operator{d: d, gather: gather, log: logrus.StandardLogger()}
	for _, opt := range opts {
		if err := opt(o); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// Register mounts the operator endpoints with handle; (*node.Node).HandleAPI
// fits.
func (o *Operator) Register(handle func(pattern string, h http.Handler) error) error {
	routes := []struct {
		pattern string
		h       http.Handler
	}{
		{"GET " + MetricsPath, promhttp.HandlerFor(o.gather, promhttp.HandlerOpts{ErrorLog: promLogger{o.log}})},
		{"GET " + PeerStatusPath, http.HandlerFunc(o.servePeers)},
		{"GET " + PlanPath, http.HandlerFunc(o.servePlan)},
		{"GET " + StatusPath, http.HandlerFunc(o.serveStatus)},
	}
	for _, r := range routes {
		if err := handle(r.pattern, r.h); err != nil {
			return fmt.Errorf("operator API: mount %s: %w", r.pattern, err)
		}
	}
	return nil
}

// promLogger passes promhttp's errors to the logger.
type promLogger struct{ log logrus.FieldLogger }

// Println implements promhttp.Logger.
func (l promLogger) Println(v ...any) { l.log.Warn(append([]any{"metrics: "}, v...)...) }

func (o *Operator) servePeers(w http.ResponseWriter, _ *http.Request) {
	o.write(w, http.StatusOK, o.d.PeerStatuses())
}

// maxPlanQuery bounds the query string of GET /v1/plan.
const maxPlanQuery = 4 << 10

func (o *Operator) servePlan(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.RawQuery) > maxPlanQuery {
		o.write(w, http.StatusRequestURITooLong, APIError{Error: fmt.Sprintf("query: longer than %d bytes", maxPlanQuery)})
		return
	}
	q := r.URL.Query()
	for k := range q {
		if k != "type" && k != "labels" && k != "min_head" {
			o.write(w, http.StatusBadRequest, APIError{Error: k + ": unknown parameter (the parameters are type, labels, min_head)", Field: k})
			return
		}
	}
	req := PlanRequest{Type: q.Get("type")}
	if req.Type == "" {
		o.write(w, http.StatusBadRequest, APIError{Error: "type: required (e.g. ?type=sha256)", Field: "type"})
		return
	}
	if err := ValidateTypeName(req.Type); err != nil {
		o.write(w, http.StatusBadRequest, APIError{Error: "type: " + err.Error(), Field: "type"})
		return
	}
	for _, s := range q["labels"] {
		for l := range strings.SplitSeq(s, ",") {
			if l = strings.TrimSpace(l); l != "" {
				req.Labels = append(req.Labels, l)
			}
		}
	}
	if len(req.Labels) > maxLabels {
		o.write(w, http.StatusBadRequest, APIError{Error: fmt.Sprintf("labels: %d labels, more than %d", len(req.Labels), maxLabels), Field: "labels"})
		return
	}
	for i, l := range req.Labels {
		if len(l) > maxLabelLen {
			o.write(w, http.StatusBadRequest, APIError{Error: fmt.Sprintf("labels: entry %d: longer than %d bytes", i, maxLabelLen), Field: "labels"})
			return
		}
	}
	if s := q.Get("min_head"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			o.write(w, http.StatusBadRequest, APIError{Error: fmt.Sprintf("min_head: %q: want a non-negative integer", s), Field: "min_head"})
			return
		}
		req.MinHead = &n
	}
	o.write(w, http.StatusOK, o.d.Plan(req))
}

func (o *Operator) serveStatus(w http.ResponseWriter, _ *http.Request) {
	v := o.d.Status()
	if o.api != nil {
		st := o.api.Stats()
		v.Requests = &st
	}
	if o.server != nil {
		v.Served = map[string]uint64{}
		for out, n := range o.server.Stats().ByOutcome {
			v.Served[out.String()] = n
		}
	}
	o.write(w, http.StatusOK, v)
}

func (o *Operator) write(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		o.log.Debugf("operator API: write response: %v", err)
	}
}
