package dispatch

import (
	"context"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/sirupsen/logrus"
	logrustest "github.com/sirupsen/logrus/hooks/test"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/builtin"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/workertest"
)

// TestDispatchMetricsCountsARequest feeds finished requests to the
// counters: attempts by outcome and peer, a hedge that won and one that
// lost, a local fallback, a beyond-head short-circuit, and a local busy
// refusal, which is no fallback.
func TestDispatchMetricsCountsARequest(t *testing.T) {
	m := newDispatchMetrics()
	m.request("sha256", WorkResult{
		Status: apiv1.StatusOK, Worker: "peerB", Duration: 3 * time.Millisecond,
		Attempts: []apiv1.Attempt{
			{Peer: "peerA", Outcome: workers.Cancelled},
			{Peer: "peerB", Outcome: workers.Success, Hedge: true},
		},
	}, false)
	m.request("sha256", WorkResult{
		Status: apiv1.StatusOK, Worker: LocalWorker,
		Attempts: []apiv1.Attempt{
			{Peer: "peerA", Outcome: workers.RetryableError},
			{Peer: "peerC", Outcome: workers.Cancelled, Hedge: true},
			{Peer: LocalWorker, Outcome: workers.Success},
		},
	}, false)
	m.request("chain", WorkResult{Status: apiv1.StatusEmpty, Worker: "peerA",
		Attempts: []apiv1.Attempt{{Peer: "peerA", Outcome: workers.Empty}}}, true)
	// The local worker refused as busy: it ran nothing, so no fallback.
	m.request("sleep", WorkResult{Status: apiv1.StatusUnavailable,
		Attempts: []apiv1.Attempt{{Peer: "peerA", Outcome: workers.Busy}, {Peer: LocalWorker, Outcome: workers.Busy}}}, false)

	mfs := gather(t, m.requests, m.duration, m.attempts, m.hedgesFired, m.hedgesWon, m.fallbacks, m.beyondHead)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"workmesh_requests_total", map[string]string{"work_type": "sha256", "status": "ok"}, 2},
		{"workmesh_requests_total", map[string]string{"work_type": "chain", "status": "empty"}, 1},
		{"workmesh_attempts_total", map[string]string{"outcome": "success", "peer": "peerB"}, 1},
		{"workmesh_attempts_total", map[string]string{"outcome": "cancelled", "peer": "peerA"}, 1},
		{"workmesh_attempts_total", map[string]string{"outcome": "retryable-error", "peer": "peerA"}, 1},
		{"workmesh_attempts_total", map[string]string{"outcome": "success", "peer": LocalWorker}, 1},
		{"workmesh_hedges_fired_total", nil, 2},
		{"workmesh_hedges_won_total", nil, 1},
		{"workmesh_fallbacks_total", map[string]string{"work_type": "sha256"}, 1},
		{"workmesh_beyond_head_total", map[string]string{"work_type": "chain"}, 1},
		{"workmesh_request_duration_seconds", map[string]string{"work_type": "sha256"}, 2},
	} {
		if got, ok := testkit.MetricValue(mfs, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (found %t), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if _, ok := testkit.MetricValue(mfs, "workmesh_beyond_head_total", map[string]string{"work_type": "sha256"}); ok {
		t.Error("a beyond-head count for a request that was not beyond the head")
	}
	if _, ok := testkit.MetricValue(mfs, "workmesh_fallbacks_total", map[string]string{"work_type": "chain"}); ok {
		t.Error("a fallback count for a request no local worker ran")
	}
	if _, ok := testkit.MetricValue(mfs, "workmesh_fallbacks_total", map[string]string{"work_type": "sleep"}); ok {
		t.Error("a fallback count for a request the local worker refused as busy")
	}
	if got, _ := testkit.MetricValue(mfs, "workmesh_attempts_total", map[string]string{"outcome": "busy", "peer": LocalWorker}); got != 1 {
		t.Errorf("local busy refusals counted %v, want 1", got)
	}
}

// TestAttemptSeriesFollowTheirLabels: the attempt series a request path
// keeps (dispatchMetrics.attempt) are the ones /metrics shows as peers come
// and go. A peer beyond the labelled ones counts under "other" until one
// leaves; then it takes the freed label, and a peer that left and came
// back, with no label free, counts under "other", not in a series the
// scrape no longer shows.
func TestAttemptSeriesFollowTheirLabels(t *testing.T) {
	m := newDispatchMetrics()
	ids := make([]string, maxPeerLabels+1)
	keep := map[string]bool{}
	for i := range ids {
		key, _, err := crypto.GenerateEd25519Key(nil)
		workertest.Must(t, err)
		id, err := peer.IDFromPrivateKey(key)
		workertest.Must(t, err)
		ids[i], keep[string(id)] = id.String(), true
	}
	attempt := func(id string) {
		m.request("echo", WorkResult{Status: apiv1.StatusOK, Worker: id,
			Attempts: []apiv1.Attempt{{Peer: id, Outcome: workers.Success}}}, false)
	}
	count := func(label string) float64 {
		v, _ := testkit.MetricValue(gather(t, m.attempts), "workmesh_attempts_total", map[string]string{"outcome": "success", "peer": label})
		return v
	}
	for _, id := range ids {
		attempt(id)
		attempt(id)
	}
	first, last := ids[0], ids[maxPeerLabels]
	if got := count(first); got != 2 {
		t.Fatalf("labelled peer counted %v, want 2", got)
	}
	if got := count(otherPeers); got != 2 {
		t.Fatalf("the peer beyond %d labels counted %v under %q, want 2", maxPeerLabels, got, otherPeers)
	}
	// The first peer leaves: its series goes, and its label is free.
	pid, err := peer.Decode(first)
	workertest.Must(t, err)
	delete(keep, string(pid))
	m.retain(keep)
	attempt(last)
	if got := count(last); got != 1 {
		t.Errorf("after a label was freed, the unlabelled peer's attempt counted %v under its own label, want 1", got)
	}
	// The first peer is back; no label is free.
	attempt(first)
	if got := count(otherPeers); got != 3 {
		t.Errorf("a returning peer with no label free: %q counted %v, want 3", otherPeers, got)
	}
	if got := count(first); got != 0 {
		t.Errorf("a returning peer with no label free counted %v under its old label, want none", got)
	}
}

// fakePeer is a peer entered in a dispatcher's peer table by a signed
// record; it does not exist on the network.
type fakePeer struct {
	id     peer.ID
	labels []string
	types  []string
	// key signs its record when set (a real host's), a fresh key otherwise.
	key crypto.PrivKey
}

// testDispatcher starts one node with no peers and a dispatcher whose local
// worker serves echo, then enters the fake peers' records in its table.
func testDispatcher(t testing.TB, cfg config.Config, peers ...*fakePeer) *Dispatcher {
	t.Helper()
	return testDispatcherWith(t, cfg, nil, peers...)
}

// testDispatcherWith is testDispatcher with options for the node.
func testDispatcherWith(t testing.TB, cfg config.Config, nodeOpts []node.Option, peers ...*fakePeer) *Dispatcher {
	t.Helper()
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.Node.API = ""
	cfg.Node.DataDir = t.TempDir()
	cfg.Node.Network = "metrics-test"
	cfg.SetDefaults()
	workertest.Must(t, cfg.Validate())
	reg, err := builtin.NewRegistry("echo")
	workertest.Must(t, err)
	pool, err := pool.New(reg, cfg.Worker, workertest.QuietLogger())
	workertest.Must(t, err)
	t.Cleanup(func() { _ = pool.Close() })
	n, err := node.New(context.Background(), cfg.Node, append([]node.Option{node.WithLogger(workertest.QuietLogger())}, nodeOpts...)...)
	workertest.Must(t, err)
	t.Cleanup(func() { _ = n.Close() })
	d, err := New(cfg, n, pool, WithLogger(workertest.QuietLogger()), WithSelectionOptions(selection.WithSeed(1)))
	workertest.Must(t, err)
	for _, p := range peers {
		key := p.key
		if key == nil {
			var err error
			key, _, err = crypto.GenerateEd25519Key(nil)
			workertest.Must(t, err)
		}
		var err error
		p.id, err = peer.IDFromPrivateKey(key)
		workertest.Must(t, err)
		nd := node.NodeData{PeerID: p.id, Network: cfg.Node.Network, Labels: p.labels, Sequence: 1,
			Capacity: node.Capacity{MaxConcurrent: 4, QueueSize: 10}}
		for _, wt := range p.types {
			nd.WorkTypes = append(nd.WorkTypes, node.WorkType{Name: wt})
		}
		rec, err := node.SignNodeData(nd, key)
		workertest.Must(t, err)
		if _, err := n.Peers().Submit(rec, "", node.SourceGossip); err != nil {
			t.Fatalf("enter the record of %s: %v", p.id, err)
		}
	}
	d.syncPeers()
	return d
}

// makeUnreachable reports failed polls until liveness gives up on p.
func makeUnreachable(d *Dispatcher, p *fakePeer) {
	for range d.cfg.Liveness.PollFailureThreshold {
		d.metrics.poll(string(p.id), 0, io.ErrUnexpectedEOF, time.Now())
		d.report(string(p.id), false, io.ErrUnexpectedEOF)
	}
	d.sel.Refresh()
}

// gather scrapes the collectors through a registry of their own, as
// /metrics does, and checks that every family has the workmesh_ prefix.
func gather(t *testing.T, cs ...prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	mfs := testkit.Gather(t, cs...)
	for name := range mfs {
		if !strings.HasPrefix(name, "workmesh_") {
			t.Errorf("metric %s lacks the workmesh_ prefix", name)
		}
	}
	return mfs
}

// TestDispatcherCollector scrapes a dispatcher after real dispatches and
// liveness changes: the counters of requests that ran locally or found no
// worker, and the state read at scrape time (liveness per peer, scores,
// poll round-trip times).
func TestDispatcherCollector(t *testing.T) {
	cfg := config.Defaults()
	cfg.Liveness.PollFailureThreshold = 2
	alive := &fakePeer{labels: []string{"full"}, types: []string{"sha256"}}
	dead := &fakePeer{types: []string{"sha256", "sleep"}}
	d := testDispatcher(t, cfg, alive, dead)

	// Nobody remote serves echo: the local worker runs it.
	if res := d.Dispatch(context.Background(), WorkRequest{Type: "echo", Payload: []byte("hi")}); res.Status != apiv1.StatusOK || res.Worker != LocalWorker {
		t.Fatalf("echo: %+v", res)
	}
	// A type nobody serves is counted under "unknown", not its own name,
	// however the request ended: a deadline already past ends it as
	// timed out before anything is tried.
	if res := d.Dispatch(context.Background(), WorkRequest{Type: "made-up-type"}); res.Status != apiv1.StatusUnavailable {
		t.Fatalf("made-up-type: %+v", res)
	}
	if res := d.Dispatch(context.Background(), WorkRequest{Type: "made-up-type-2", Timeout: time.Nanosecond}); res.Status != apiv1.StatusTimeout || len(res.Attempts) != 0 {
		t.Fatalf("made-up-type-2 with a deadline of 1ns: %+v, want timeout with no attempt", res)
	}
	d.metrics.poll(string(alive.id), 1500*time.Microsecond, nil, time.Now())
	makeUnreachable(d, dead)

	mfs := gather(t, d.Collector())
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"workmesh_requests_total", map[string]string{"work_type": "echo", "status": "ok"}, 1},
		{"workmesh_requests_total", map[string]string{"work_type": unknownWorkType, "status": "unavailable"}, 1},
		{"workmesh_requests_total", map[string]string{"work_type": unknownWorkType, "status": "timeout"}, 1},
		{"workmesh_fallbacks_total", map[string]string{"work_type": "echo"}, 1},
		{"workmesh_attempts_total", map[string]string{"outcome": "success", "peer": LocalWorker}, 1},
		{"workmesh_request_duration_seconds", map[string]string{"work_type": "echo"}, 1},
		{"workmesh_liveness_transitions_total", map[string]string{"from": "alive", "to": "unreachable"}, 1},
		{"workmesh_polls_total", map[string]string{"result": "ok"}, 1},
		{"workmesh_polls_total", map[string]string{"result": "failed"}, 2},
		{"workmesh_peer_liveness_state", map[string]string{"peer": dead.id.String(), "state": "unreachable"}, 1},
		{"workmesh_peer_liveness_state", map[string]string{"peer": dead.id.String(), "state": "alive"}, 0},
		{"workmesh_peer_liveness_state", map[string]string{"peer": alive.id.String(), "state": "alive"}, 1},
		{"workmesh_peers_by_liveness", map[string]string{"state": "unreachable"}, 1},
		{"workmesh_peers_by_liveness", map[string]string{"state": "alive"}, 1},
		{"workmesh_peer_poll_rtt_seconds", map[string]string{"peer": alive.id.String()}, 0.0015},
		{"workmesh_peer_rated", map[string]string{"peer": dead.id.String(), "work_type": "sleep"}, 0},
		{"workmesh_dispatch_in_flight", nil, 0},
	} {
		got, ok := testkit.MetricValue(mfs, c.name, c.labels)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (found %t), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if _, ok := testkit.MetricValue(mfs, "workmesh_requests_total", map[string]string{"work_type": "made-up-type-2"}); ok {
		t.Error("a made-up work type with a past deadline got a series of its own")
	}
	if _, ok := testkit.MetricValue(mfs, "workmesh_requests_total", map[string]string{"work_type": "made-up-type"}); ok {
		t.Error("a made-up work type got a series of its own")
	}
	for _, p := range []*fakePeer{alive, dead} {
		for _, wt := range p.types {
			if _, ok := testkit.MetricValue(mfs, "workmesh_peer_score", map[string]string{"peer": p.id.String(), "work_type": wt}); !ok {
				t.Errorf("no workmesh_peer_score for %s %s", p.id, wt)
			}
		}
	}
	if _, ok := testkit.MetricValue(mfs, "workmesh_peer_poll_rtt_seconds", map[string]string{"peer": dead.id.String()}); ok {
		t.Error("a round-trip time for a peer that never answered a poll")
	}

	// Per-node registries: a second dispatcher's collector registers
	// beside the first without clashing, and nothing reaches the global
	// default registry.
	other := testDispatcher(t, config.Defaults())
	gather(t, other.Collector())
	gather(t, d.Collector(), other.node.Collector())
	def, err := prometheus.DefaultGatherer.Gather()
	workertest.Must(t, err)
	for _, mf := range def {
		if strings.HasPrefix(mf.GetName(), "workmesh_") {
			t.Errorf("%s registered in the global default registry", mf.GetName())
		}
	}
}

// TestDispatcherPlan checks the plan a request would get: groups in label
// order, rated order inside, every excluded peer with its reason, counts
// that agree with the selection core, and no pick left in flight.
func TestDispatcherPlan(t *testing.T) {
	cfg := config.Defaults()
	cfg.Worker.MaxRemoteWorkers, cfg.Worker.MaxRetries = 3, 2
	cfg.Liveness.PollFailureThreshold = 1
	cfg.LabelBalancing = &config.LabelBalancingConfig{Order: []string{"full", "archive"}}
	full := &fakePeer{labels: []string{"full"}, types: []string{"sha256"}}
	archive := &fakePeer{labels: []string{"archive"}, types: []string{"sha256"}}
	down := &fakePeer{labels: []string{"archive"}, types: []string{"sha256"}}
	plain := &fakePeer{types: []string{"sha256", "echo"}}
	d := testDispatcher(t, cfg, full, archive, down, plain)
	makeUnreachable(d, down)

	v := d.Plan(apiv1.PlanRequest{Type: "sha256"})
	labels := func(gs []apiv1.PlanGroup) []string {
		var out []string
		for _, g := range gs {
			out = append(out, g.Label)
		}
		return out
	}
	if got := labels(v.Groups); !slices.Equal(got, []string{"full", "archive", ""}) || !v.Groups[2].Default {
		t.Fatalf("groups %q, want full, archive, then the default group", got)
	}
	if len(v.Groups[1].Peers) != 2 {
		t.Fatalf("archive group: %+v", v.Groups[1].Peers)
	}
	order := make([]string, len(v.Order))
	for i, p := range v.Order {
		order[i] = p.Peer
	}
	if want := []string{full.id.String(), archive.id.String(), plain.id.String()}; !slices.Equal(order, want) {
		t.Errorf("order %v, want %v (full, archive, then the unlabelled; the unreachable one left out)", order, want)
	}
	if len(v.Excluded) != 1 || v.Excluded[0].Peer != down.id.String() || v.Excluded[0].Reason != "unreachable" {
		t.Errorf("excluded %+v, want only %s as unreachable", v.Excluded, down.id)
	}
	if v.Explanation != "4 candidates for work type sha256: 1 unreachable, 3 selectable" {
		t.Errorf("explanation %q", v.Explanation)
	}
	if v.Fallback || !strings.Contains(v.FallbackNote, "does not serve sha256") {
		t.Errorf("fallback %t (%s): the local worker serves echo only", v.Fallback, v.FallbackNote)
	}

	if again := d.Plan(apiv1.PlanRequest{Type: "sha256"}); !slices.EqualFunc(again.Order, v.Order, func(a, b apiv1.PlanPick) bool { return a.Peer == b.Peer }) {
		t.Errorf("second plan %+v differs from the first %+v", again.Order, v.Order)
	}

	// Label constraints: every peer without the label is excluded, with
	// the label named, and the counts agree with the core's.
	v = d.Plan(apiv1.PlanRequest{Type: "sha256", Labels: []string{"archive"}})
	reasons := map[string]int{}
	for _, x := range v.Excluded {
		reasons[x.Reason+" "+x.Detail]++
	}
	if reasons["lacks label archive"] != 2 || reasons["unreachable "] != 1 || len(v.Order) != 1 || v.Order[0].Peer != archive.id.String() {
		t.Errorf("with --labels archive: excluded %+v, order %+v", v.Excluded, v.Order)
	}
	for _, c := range v.Counts {
		if c.Reason == "selectable" {
			continue
		}
		if reasons[c.Reason+" "+c.Detail] != c.N {
			t.Errorf("core counts %d %s %s, the plan lists %d", c.N, c.Reason, c.Detail, reasons[c.Reason+" "+c.Detail])
		}
	}

	// Nothing serves it anywhere: the counts still say why.
	v = d.Plan(apiv1.PlanRequest{Type: "nosuch"})
	if len(v.Order) != 0 || v.Fallback || v.Explanation != "no peer advertises work type nosuch" {
		t.Errorf("nosuch: %+v", v)
	}

	// Without include-default, unlabelled peers are not in any group.
	no := false
	cfg.LabelBalancing = &config.LabelBalancingConfig{Order: []string{"full"}, IncludeDefault: &no}
	d2 := testDispatcher(t, cfg, &fakePeer{labels: []string{"full"}, types: []string{"sha256"}}, &fakePeer{types: []string{"sha256"}})
	v = d2.Plan(apiv1.PlanRequest{Type: "sha256"})
	if len(v.Excluded) != 1 || v.Excluded[0].Reason != selection.ReasonNotInGroup.String() {
		t.Errorf("without include-default: excluded %+v", v.Excluded)
	}
}

// TestPlanLeavesNothingInFlight checks that the preview hands its picks
// back: an unrated peer with an attempt in flight is passed over for
// another unrated one, so a leaked pick would move the next request.
func TestPlanLeavesNothingInFlight(t *testing.T) {
	cfg := config.Defaults()
	cfg.Worker.MaxRemoteWorkers, cfg.Worker.MaxRetries = 1, 0
	d := testDispatcher(t, cfg, &fakePeer{types: []string{"sha256"}}, &fakePeer{types: []string{"sha256"}})
	v := d.Plan(apiv1.PlanRequest{Type: "sha256"})
	if len(v.Order) != 1 {
		t.Fatalf("order %+v, want one pick", v.Order)
	}
	plan := d.sel.Plan(selection.Request{WorkType: "sha256"})
	pk, ok := plan.Next()
	if !ok {
		t.Fatal("no pick after the preview")
	}
	plan.Report(pk, selection.Cancelled, 0)
	if got := peer.ID(pk.Peer).String(); got != v.Order[0].Peer {
		t.Errorf("a request after the preview picks %s, the preview picked %s: its pick was left in flight", got, v.Order[0].Peer)
	}
}

// A peer that attempts could not reach turns unreachable as one whose
// polls failed does, and the change is logged at info as a poll's is.
func TestDispatch_UnreachableByAttemptsIsLogged(t *testing.T) {
	cfg := config.Defaults()
	cfg.Worker.ConnectTimeout = 200 * time.Millisecond
	cfg.Worker.RetryDelay = 0
	p := &fakePeer{types: []string{"sha256"}}
	d := testDispatcher(t, cfg, p)
	log, hook := logrustest.NewNullLogger()
	d.log = log
	// Requests at once, so that several attempts that could not reach the
	// peer report together: the one whose report made it unreachable logs.
	for i := 0; i < 3*cfg.Liveness.PollFailureThreshold && d.sel.Liveness().State(string(p.id)) != selection.StateUnreachable; i++ {
		var wg sync.WaitGroup
		for range 2 * cfg.Liveness.PollFailureThreshold {
			wg.Go(func() {
				d.Dispatch(context.Background(), WorkRequest{Type: "sha256", Payload: []byte("x"), Timeout: 5 * time.Second})
			})
		}
		wg.Wait()
	}
	if got := d.sel.Liveness().State(string(p.id)); got != selection.StateUnreachable {
		t.Fatalf("after attempts that could not reach it: %s, want unreachable", got)
	}
	lines := 0
	for _, e := range hook.AllEntries() {
		if e.Message == "peer liveness changed" && e.Data["to"] == "unreachable" && e.Data["peer"] == p.id.String() && e.Level == logrus.InfoLevel {
			lines++
		}
	}
	if lines != 1 {
		t.Fatalf("%d info lines say the peer turned unreachable, want 1; logged: %d entries", lines, len(hook.AllEntries()))
	}
}

// TestDispatchDoesNotCountAVerifyRefusedAsInvalid: a verified request the
// dispatcher refuses as asked wrongly (verify of a type that is not
// deterministic) is the API's to count, as a bad request; counted here
// too, it was counted twice.
func TestDispatchDoesNotCountAVerifyRefusedAsInvalid(t *testing.T) {
	d := testDispatcher(t, config.Defaults())
	res := d.Dispatch(context.Background(), WorkRequest{Type: "write", Payload: []byte("x"), Timeout: time.Second,
		Verify: config.Verify{Replicas: 3, Agree: 2}})
	if !res.Invalid {
		t.Fatalf("verify of a type that is not deterministic: %+v, want it refused as invalid", res)
	}
	mfs := testkit.Gather(t, d.Collector())
	if got, ok := testkit.MetricValue(mfs, "workmesh_requests_total", map[string]string{"work_type": "write"}); ok {
		t.Errorf("the dispatcher counted the invalid request (%v); the API counts it", got)
	}
}
