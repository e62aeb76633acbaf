package dispatch

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/node/scrape"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/workers"
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
	// labelled holds the peers (as their IDs print) that workmesh_attempts_total
	// names, at most maxPeerLabels; attempts of others count as "other".
	labelled map[string]bool
	// rtts is the round trip of each peer's last good poll (a
	// time.Duration, by raw peer ID), apart from lastP so that the request
	// path reads it without taking mu.
	rtts sync.Map
	// The series a request counts in, kept so that a request costs no
	// label hashing and no lock: requests by seriesKey{work type,
	// status}, durations by work type, attempts by seriesKey{outcome,
	// peer} for the peers labelled (and the local worker). An attempt
	// series is kept under mu, and retain drops it with its label.
	reqSeries, durSeries, attSeries sync.Map
}

// seriesKey is the two label values of a kept series.
type seriesKey struct{ a, b string }

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
			Help: "Attempts of dispatched requests, by outcome and peer (\"local\" for the local worker; at most 16 peers named, the attempts of others under \"other\").",
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
		lastP:    make(map[string]pollSample),
		labelled: make(map[string]bool),
	}
}

// maxPeerLabels bounds the peers that metrics name in a label: the per-peer
// series (liveness state, score, poll round trip) are those of the
// maxPeerLabels best-scored peers, and workmesh_attempts_total names the
// first maxPeerLabels peers attempted that are still in the peer table,
// counting the attempts of any other under peer="other". However many
// peers records bring, /metrics stays about the same size.
const maxPeerLabels = 16

// otherPeers is the peer label of the attempts of peers not named.
const otherPeers = "other"

// attemptLabel is the peer label an attempt of peer is counted under.
func (m *dispatchMetrics) attemptLabel(peer string) string {
	if peer == LocalWorker {
		return peer
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.attemptLabelLocked(peer)
}

// attempt is the series an attempt of peer with outcome o counts in.
func (m *dispatchMetrics) attempt(o selection.Outcome, peer string) prometheus.Counter {
	k := seriesKey{o.String(), peer}
	if c, ok := m.attSeries.Load(k); ok {
		return c.(prometheus.Counter)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	label := peer
	if peer != LocalWorker {
		label = m.attemptLabelLocked(peer)
	}
	c := m.attempts.WithLabelValues(k.a, label)
	if label == peer {
		// Not "other": the peers it holds come and go unbounded.
		m.attSeries.Store(k, c)
	}
	return c
}

func (m *dispatchMetrics) attemptLabelLocked(peer string) string {
	if m.labelled[peer] {
		return peer
	}
	if len(m.labelled) < maxPeerLabels {
		m.labelled[peer] = true
		return peer
	}
	return otherPeers
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
		s.err = attemptCause(err)
	}
	m.lastP[id] = s
	m.mu.Unlock()
	if err != nil {
		m.polls.WithLabelValues("failed").Inc()
		return
	}
	if rtt > 0 {
		m.rtts.Store(id, rtt)
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

// lastRTT returns the round trip of the last good poll of the peer with
// raw ID id, if it had one. It takes no lock and allocates nothing.
func (m *dispatchMetrics) lastRTT(id string) (time.Duration, bool) {
	v, ok := m.rtts.Load(id)
	if !ok {
		return 0, false
	}
	rtt, ok := v.(time.Duration)
	return rtt, ok
}

// retain forgets the polls of peers that are no longer in keep (by raw
// ID), and the attempt series of the peers named in labels that left,
// which frees their label for another peer.
func (m *dispatchMetrics) retain(keep map[string]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.lastP {
		if !keep[id] {
			delete(m.lastP, id)
			m.rtts.Delete(id)
		}
	}
	for id := range m.labelled {
		if pid, err := peer.Decode(id); err != nil || !keep[string(pid)] {
			delete(m.labelled, id)
			m.attempts.DeletePartialMatch(prometheus.Labels{"peer": id})
			m.attSeries.Range(func(k, _ any) bool {
				if k.(seriesKey).b == id {
					m.attSeries.Delete(k)
				}
				return true
			})
		}
	}
}

// request counts one finished request: its status, every attempt, the
// hedges, a fallback, a beyond-head short-circuit. workType is the label
// to count it under.
func (m *dispatchMetrics) request(workType string, res WorkResult, beyondHead bool) {
	k := seriesKey{workType, string(res.Status)}
	c, ok := m.reqSeries.Load(k)
	if !ok {
		c, _ = m.reqSeries.LoadOrStore(k, m.requests.WithLabelValues(k.a, k.b))
	}
	c.(prometheus.Counter).Inc()
	o, ok := m.durSeries.Load(workType)
	if !ok {
		o, _ = m.durSeries.LoadOrStore(workType, m.duration.WithLabelValues(workType))
	}
	o.(prometheus.Observer).Observe(res.Duration.Seconds())
	local := false
	for _, a := range res.Attempts {
		m.attempt(a.Outcome, a.Peer).Inc()
		if a.Peer == LocalWorker && a.Outcome != workers.Busy {
			local = true // the local worker ran it (a busy refusal ran nothing)
		}
		if a.Hedge {
			m.hedgesFired.Inc()
			if a.Peer == res.Worker && (res.Status == apiv1.StatusOK || res.Status == apiv1.StatusEmpty) {
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
	if len(res.Attempts) == 0 && !d.knownType(wt) {
		// However it ended (unavailable, or timed out before it was
		// tried, as a deadline of 1ns makes it): a type no worker serves
		// gets no series of its own.
		wt = unknownWorkType
	}
	d.metrics.request(wt, res, plan != nil && plan.BeyondHead())
	ok := res.Status == apiv1.StatusOK || res.Status == apiv1.StatusEmpty
	if ok && !d.debug {
		return
	}
	worker := res.Worker
	if worker == "" {
		worker = "none"
	}
	f := d.log.WithFields(logrus.Fields{
		"request_id": req.ID, "work_type": req.Type, "peer": worker, "status": string(res.Status),
		"attempts": len(res.Attempts), "duration_ms": apiv1.Millis(res.Duration),
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
	descAdmission = prometheus.NewDesc("workmesh_dispatch_admission_waiting",
		"Requests waiting in the admission queue while every worker that could run them is busy.", nil, nil)
	descLiveness = prometheus.NewDesc("workmesh_peer_liveness_state",
		"Liveness state of each of the best-scored peers (at most 16): 1 for its current state, 0 for the others.", []string{"peer", "state"}, nil)
	descLivenessCount = prometheus.NewDesc("workmesh_peers_by_liveness",
		"Peers the dispatcher tracks, by liveness state.", []string{"state"}, nil)
	descScore = prometheus.NewDesc("workmesh_peer_score",
		"Rating score of each of the best-scored peers (at most 16) for each work type it serves (higher is better).", []string{"peer", "work_type"}, nil)
	descRated = prometheus.NewDesc("workmesh_peer_rated",
		"1 when the peer has enough samples to be judged for the work type, 0 while it is explored.", []string{"peer", "work_type"}, nil)
	descPeerRTT = prometheus.NewDesc("workmesh_peer_poll_rtt_seconds",
		"Round-trip time of the last good health poll of each of the best-scored peers (at most 16).", []string{"peer"}, nil)
)

// Collector returns a Prometheus collector of the dispatcher: its request,
// attempt, hedge, fallback, beyond-head, poll and liveness-transition
// counters, and, read at scrape time, the liveness state, score and poll
// round-trip time of every peer. Register it in the node's own registry.
//
// Transitions are counted through the selector's Liveness.OnTransition,
// which the dispatcher sets when it is made; replacing it stops the count.
func (d *Dispatcher) Collector() prometheus.Collector {
	m := d.metrics
	return scrape.Collector(d.collect,
		[]*prometheus.Desc{descInFlight, descAdmission, descLiveness, descLivenessCount, descScore, descRated, descPeerRTT},
		m.requests, m.duration, m.attempts, m.hedgesFired, m.hedgesWon,
		m.fallbacks, m.beyondHead, m.transitions, m.polls, m.pollRTT,
		d.trust.verified, d.trust.disputes, d.trust.audits)
}

// collect sends what the dispatcher knows of its peers now: the liveness
// state, score and poll round-trip time of each.
func (d *Dispatcher) collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(d.metrics.inFlight.Load()))
	ch <- prometheus.MustNewConstMetric(descAdmission, prometheus.GaugeValue, float64(d.admission.Waiting()))
	live := d.sel.Liveness()
	counts := live.Counts()
	for _, s := range selection.States() {
		ch <- prometheus.MustNewConstMetric(descLivenessCount, prometheus.GaugeValue, float64(counts[s]), s.String())
	}
	infos := d.node.Peers().Peers()
	types := map[string]bool{}
	keep := make(map[string]bool, len(infos))
	for _, pi := range infos {
		keep[string(pi.Data.PeerID)] = true
		for _, wt := range pi.Data.WorkTypes {
			types[wt.Name] = true
		}
	}
	d.metrics.retain(keep) // the last polls of peers that left
	// The per-peer series are those of the maxPeerLabels best-scored
	// peers (by their best score over the types they serve).
	best := map[string]float64{}
	rankings := make(map[string][]selection.Ranked, len(types))
	for wt := range types {
		r := d.sel.Ranking(wt)
		rankings[wt] = r
		for _, x := range r {
			if s, ok := best[x.Peer]; !ok || x.Score > s {
				best[x.Peer] = x.Score
			}
		}
	}
	named := make([]string, 0, len(best))
	for id := range best {
		named = append(named, id)
	}
	sort.Slice(named, func(i, j int) bool {
		if best[named[i]] != best[named[j]] {
			return best[named[i]] > best[named[j]]
		}
		return named[i] < named[j]
	})
	if len(named) > maxPeerLabels {
		named = named[:maxPeerLabels]
	}
	shown := make(map[string]bool, len(named))
	for _, raw := range named {
		shown[raw] = true
		id := peer.ID(raw).String()
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
	}
	for wt, r := range rankings {
		seen := map[string]bool{} // a peer in several groups is scored once
		for _, x := range r {
			if seen[x.Peer] || !shown[x.Peer] {
				continue
			}
			seen[x.Peer] = true
			id := peer.ID(x.Peer).String()
			ch <- prometheus.MustNewConstMetric(descScore, prometheus.GaugeValue, x.Score, id, wt)
			ch <- prometheus.MustNewConstMetric(descRated, prometheus.GaugeValue, boolValue(x.Rated), id, wt)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
