package dispatch

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/builtin"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/protocol"
	"github.com/workmesh/workmesh/workers/reqctx"
)

// DefaultRequestTimeout bounds a request that sets no timeout of its own.
const DefaultRequestTimeout = 10 * time.Second

// LocalWorker is the name a result gives the local worker.
const LocalWorker = "local"

// WorkRequest is one submitted request.
type WorkRequest struct {
	// ID names the request in results and logs; empty means one is made.
	ID string
	// Type is the work type.
	Type string
	// Payload is the work's input.
	Payload []byte
	// Timeout bounds the whole request, each of its remote attempts
	// included; zero means DefaultRequestTimeout.
	Timeout time.Duration
	// Labels the worker must carry: a remote one, or this node (its
	// configured labels) for the local worker to run it.
	Labels []string
	// MinHead is the position the request names, if any.
	MinHead *uint64
	// Verify asks for the result from several distinct workers, compared
	// byte for byte (see verified); zero means its type's verify default.
	Verify config.Verify

	// claims is shared by the replicas of a verified request: the local
	// worker casts at most one vote.
	claims *selection.Claims
}

// WorkResult is the one terminal result of a request.
type WorkResult struct {
	RequestID string
	Status    apiv1.Status
	// Output is the work's output, for StatusOK.
	Output []byte
	// Worker is "local" or the peer ID that produced the result.
	Worker string
	// Attempts lists every attempt, in the order they ended.
	Attempts []apiv1.Attempt
	// Duration is the time from submission to result.
	Duration time.Duration
	// Error says why the request did not succeed.
	Error string
	// Explanation says why no (further) remote worker was tried, counted by
	// reason; set when the request fell back or could not be placed.
	Explanation string
	// Busy marks a request answered unavailable because every worker that
	// could run it stayed busy until its deadline could no longer be met
	// (or the admission queue was full).
	Busy bool
	// Queued is the time the request waited in the admission queue.
	Queued time.Duration
	// BusyRefusals counts the busy answers of the rounds before the last,
	// left out of Attempts so that a long wait does not grow the result.
	BusyRefusals int

	// blocked: no worker decided the request and the ones that could run
	// it answered busy; the request may wait in the admission queue.
	blocked bool

	// Detail is the deciding failure's exit code, stderr, HTTP status or
	// body (custom work types); nil when it has none.
	Detail *workers.Detail

	// Verify is how a verified request's votes went; nil when it was not
	// verified.
	Verify *apiv1.VerifyView
	// Invalid marks a request refused as asked (Error says why): an API
	// answers it as a bad request.
	Invalid bool
}

// Dispatcher sends submitted requests to the best remote worker, chosen by
// the selection core, and falls back to the local worker. Run keeps the
// core in step with the network (peer table, liveness polls, ranking).
type Dispatcher struct {
	cfg  config.Config
	node *node.Node
	sel  *selection.Selector
	// selClock is the selection core's clock when it is not the system
	// clock (tests may set one); nil otherwise.
	selClock selection.Clock
	client   *protocol.Client
	pool     *pool.Pool
	// catalog says which work types may be hedged (see WithCatalog).
	catalog workers.Catalog
	log     logrus.FieldLogger
	seq     atomic.Uint64
	prefix  string
	debug   bool // whether the logger takes debug lines (fields cost allocations)
	// names maps the raw IDs of the peers last synced to their base58 form:
	// every result names its worker and its attempts' peers, and encoding
	// an ID each time was a measured 11% of Dispatch's CPU under load.
	names atomic.Pointer[map[string]string]
	// synced is what the last syncPeers saw, by peer; only syncPeers (on
	// Run's goroutine, or before Run) uses it.
	synced map[peer.ID]syncedPeer
	// syncedAdds is the peer table's Additions as the last syncPeers began:
	// a different count means a peer arrived since (same owner as synced).
	syncedAdds uint64
	// relayed holds the peers connected through a relay only, from the
	// connection events Run reads (same owner as synced): their
	// candidates carry Relayed.
	relayed map[peer.ID]bool
	// unconnected holds the peers last synced that the host holds no
	// connection to, kept by syncPeers and the connection events Run
	// reads (same owner as synced); nUnconnected is its size, for the
	// request path (attemptLoop.launch).
	unconnected  map[peer.ID]struct{}
	nUnconnected atomic.Int64
	// protected holds the workers whose connections this dispatcher has
	// the connection manager keep (protectLeading; owned by Run).
	protected map[peer.ID]bool
	// syncDelay spaces out syncs during a burst of table changes; see Run.
	syncDelay time.Duration
	// metrics counts requests, attempts and polls (see Collector).
	metrics *dispatchMetrics
	// requests admits Dispatch calls until Drain shuts it.
	requests workers.Gate
	// admission is where requests wait while every worker is busy.
	admission *selection.Admission
	// needs holds, by work type, the least time its work is seen to take
	// (see need).
	needs sync.Map
	// trust counts verified requests, disputes and audits.
	trust *trustMetrics
	// verifyDefaults holds the work types with a verify default.
	verifyDefaults map[string]config.Verify
	// audits runs the audits of answered results (see audit.go).
	audits *auditor
}

// Option adjusts a Dispatcher.
type Option func(*dispatcherOptions) error

type dispatcherOptions struct {
	log     logrus.FieldLogger
	selOpts []selection.Option
	catalog workers.Catalog
}

// WithLogger sets the dispatcher's logger.
func WithLogger(log logrus.FieldLogger) Option {
	return func(o *dispatcherOptions) error {
		if log == nil {
			return errors.New("dispatcher: nil logger")
		}
		o.log = log
		return nil
	}
}

// WithCatalog gives the traits of the work types the dispatcher may be
// asked for, served locally or not: whether a request may be hedged is
// what its type declares (workers.Traits). By default it knows the
// built-in types and those its local worker serves; types in c are added
// to those.
func WithCatalog(c workers.Catalog) Option {
	return func(o *dispatcherOptions) error {
		o.catalog = c
		return nil
	}
}

// WithSelectionOptions passes options to the selection core (a clock, a seed).
func WithSelectionOptions(opts ...selection.Option) Option {
	return func(o *dispatcherOptions) error { o.selOpts = append(o.selOpts, opts...); return nil }
}

// New returns a dispatcher for node n with its local worker pool
// (nil: no local fallback). Call Run to start its background work.
func New(cfg config.Config, n *node.Node, local *pool.Pool, opts ...Option) (*Dispatcher, error) {
	if n == nil {
		return nil, errors.New("dispatcher: nil node")
	}
	o := dispatcherOptions{log: logrus.StandardLogger()}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	// Each node draws its own random choices (rating-spread, random mode,
	// when it first polls a new peer): seeded from its peer ID, so that
	// nodes do not all choose alike. WithSelectionOptions may override it.
	seed := fnv.New64a()
	seed.Write([]byte(n.ID()))
	sel, err := selection.New(cfg, append([]selection.Option{selection.WithSeed(seed.Sum64())}, o.selOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	client, err := protocol.NewClient(n.Host(), n.Network(), protocol.WithMaxPayload(workers.WireLimit(cfg.Limits.MaxPayload, cfg.Limits.MaxResult)))
	if err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	id := n.ID().String()
	debug := true
	if l, ok := o.log.(interface{ IsLevelEnabled(logrus.Level) bool }); ok {
		debug = l.IsLevelEnabled(logrus.DebugLevel)
	}
	d := &Dispatcher{
		cfg: cfg, node: n, sel: sel, client: client, pool: local, log: o.log, catalog: catalogOf(local, o.catalog),
		prefix: id[max(0, len(id)-6):] + "-", debug: debug, metrics: newDispatchMetrics(),
		syncDelay: defaultSyncDelay, trust: newTrustMetrics(),
		// Requests wait on the real clock of their deadlines.
		admission: selection.NewAdmission(cfg.Worker.AdmissionQueueSize, nil),
	}
	if _, system := sel.Clock().(selection.SystemClock); !system {
		d.selClock = sel.Clock()
	}
	sel.Liveness().OnTransition(d.metrics.transition)
	d.audits = newAuditor(d)
	d.verifyDefaults = verifyDefaults(cfg)
	return d, nil
}

// catalogOf is the traits the dispatcher knows: the built-in types, the
// types local serves, and extra.
func catalogOf(local *pool.Pool, extra workers.Catalog) workers.Catalog {
	c := builtin.Catalog()
	if local != nil {
		c.Add(local.Registry())
	}
	maps.Copy(c, extra)
	return c
}

// Selector returns the selection core the dispatcher drives.
func (d *Dispatcher) Selector() *selection.Selector { return d.sel }

// Dispatch runs one request to its one terminal result. It returns only
// when every attempt it started has ended.
func (d *Dispatcher) Dispatch(ctx context.Context, req WorkRequest) WorkResult {
	start := time.Now()
	if req.ID == "" {
		var b [64]byte
		req.ID = string(strconv.AppendUint(append(b[:0], d.prefix...), d.seq.Add(1), 10))
	}
	if !d.requests.Enter() {
		res := WorkResult{RequestID: req.ID, Status: apiv1.StatusUnavailable, Error: workers.ErrShuttingDown, Duration: time.Since(start)}
		d.observe(req, res, nil)
		return res
	}
	defer d.requests.Leave()
	d.metrics.inFlight.Add(1)
	defer d.metrics.inFlight.Add(-1)
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	// The request's context (context.WithTimeout's behaviour, at less
	// cost a request; see reqctx): its attempts' calls watch it.
	rctx := reqctx.WithDeadline(ctx, start.Add(timeout))
	defer rctx.Stop()
	ctx = rctx
	// Only hedging asks whether the request is idempotent (for jsonrpc
	// that reads the payload).
	sreq := selection.Request{WorkType: req.Type, Labels: req.Labels, Idempotent: d.cfg.Hedge.MaxCount > 0 && d.catalog.Idempotent(req.Type, req.Payload)}
	if req.MinHead != nil {
		sreq.MinHead, sreq.HasMinHead = *req.MinHead, true
	}
	plan := d.sel.Plan(sreq)
	// Every use of the plan, the attempts' and observe's, has ended
	// when Dispatch returns: the plan made last goes back for reuse.
	defer func() { plan.Release() }()
	if why := d.headRefusal(req.Type, req.MinHead, plan); why != "" {
		res := WorkResult{RequestID: req.ID, Status: apiv1.StatusUnavailable, Error: why, Duration: time.Since(start)}
		d.observe(req, res, plan)
		return res
	}
	if req.Verify = d.verifyFor(req); req.Verify.On() || req.Verify.Agree != 0 {
		res := d.verified(ctx, req)
		res.RequestID = req.ID
		res.Duration = time.Since(start)
		if !res.Invalid { // a request refused as invalid is the API's to count
			d.observe(req, res, nil)
		}
		return res
	}
	res := d.place(ctx, req, sreq, plan)
	for d.awaitFirstPolls(ctx, req, plan, res) {
		plan.Release()
		plan = d.sel.Plan(sreq) // no pick was counted: a request still
		res = d.place(ctx, req, sreq, plan)
	}
	res.RequestID = req.ID
	res.Duration = time.Since(start)
	d.observe(req, res, plan)
	d.audits.maybe(req, res)
	return res
}

// Drain stops the dispatcher taking requests, for a node that is stopping:
// from now on every Dispatch is answered unavailable at once, with
// ErrShuttingDown. It returns nil when the requests already taken have
// all ended, or ctx's error if ctx ends first.
func (d *Dispatcher) Drain(ctx context.Context) error {
	d.requests.Close()
	return d.requests.Wait(ctx)
}

// InFlight returns the number of Dispatch calls running now.
func (d *Dispatcher) InFlight() int { return int(d.requests.Active()) }

// fallback runs the request on the local worker when no remote attempt
// decided it and the plan allows it.
func (d *Dispatcher) fallback(ctx context.Context, req WorkRequest, plan *selection.Plan, res WorkResult) WorkResult {
	localWhy := d.localRefusal(req.Type, req.Labels)
	if localWhy == "" && req.claims != nil && !req.claims.Claim(LocalWorker) {
		localWhy = "the local worker has cast its vote for this verified request already"
	}
	local := localWhy == ""
	if ctx.Err() != nil {
		res.cutShort(ctx, req)
		return res
	}
	if !plan.FallbackAllowed() || !local {
		if plan.FallbackAllowed() && busyAmong(res.Attempts) {
			// No local worker for it, and a remote one that could run it
			// is busy: the request may wait for room (place).
			res.blocked = true
			return res
		}
		why := res.Explanation
		if !local {
			why += "; " + localWhy
		}
		if len(res.Attempts) > 0 {
			res.Status = apiv1.StatusFailed
			res.Error = "every attempt failed (last: " + lastError(res.Attempts) + "); " + why
		} else {
			res.Status = apiv1.StatusUnavailable
			res.Error = "no worker could take the work: " + why
			if offer := d.onOffer(); !local && !d.serves(req.Type) && !slices.Contains(offer, req.Type) {
				res.Error += "; on offer: " + dash(strings.Join(offer, ", "))
			}
		}
		return res
	}
	for spawn := 1; ; spawn++ {
		start := time.Now()
		r := d.pool.Submit(ctx, req.Type, req.Payload)
		end := time.Now()
		took := end.Sub(start)
		res.Attempts = append(res.Attempts, apiv1.Attempt{
			Peer: LocalWorker, Outcome: r.Outcome, Error: r.Error,
			DurationMS: apiv1.Millis(took),
		})
		d.attemptEnded(req.Type, r.Outcome, took, end)
		if r.Outcome == workers.Busy && spawn < d.cfg.Worker.MaxSpawnAttempts && ctx.Err() == nil && d.fits(ctx, req.Type) {
			t := time.NewTimer(d.cfg.Worker.RetryDelay)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
			}
		}
		if r.Outcome == workers.Busy && ctx.Err() == nil {
			// Every worker that could run it is busy, this one too: the
			// request may wait for room (place).
			res.blocked = true
			return res
		}
		res.Worker = LocalWorker
		switch {
		case r.Outcome == workers.Success:
			res.Status, res.Output = apiv1.StatusOK, r.Output
		case r.Outcome == workers.Empty:
			res.Status = apiv1.StatusEmpty
		case ctx.Err() != nil:
			res.cutShort(ctx, req)
		default:
			res.Status, res.Error, res.Detail = apiv1.StatusFailed, r.Error, workers.DetailOf(r)
		}
		return res
	}
}

// fits reports whether work of workType placed now can still end within
// ctx's deadline, by the least time such work is seen to take.
func (d *Dispatcher) fits(ctx context.Context, workType string) bool {
	dl, ok := ctx.Deadline()
	return !ok || selection.Spare(time.Until(dl), d.need(workType)) > 0
}

// serves reports whether the local worker serves workType.
func (d *Dispatcher) serves(workType string) bool {
	if d.pool == nil {
		return false
	}
	_, ok := d.pool.Registry().Get(workType)
	return ok
}

// localRefusal says why the local worker may not run a request of
// workType that requires labels, or "" when it may. A request's required
// labels hold for the local worker as for any remote one: it runs the
// request only when this node carries every one of them (node labels).
func (d *Dispatcher) localRefusal(workType string, labels []string) string {
	if !d.serves(workType) {
		return "the local worker does not serve " + workType
	}
	var missing []string
	for _, l := range labels {
		if !slices.Contains(d.cfg.Node.Labels, l) && !slices.Contains(missing, l) {
			missing = append(missing, l)
		}
	}
	if len(missing) > 0 {
		return "the local node lacks label " + strings.Join(missing, ", ") + " (its labels: " + dash(strings.Join(d.cfg.Node.Labels, ", ")) + ")"
	}
	return ""
}

// headRefusal says why a request naming minHead cannot be served at all,
// or "": its work type has no heads anywhere (no peer advertises a head for
// it and the local worker's handler has no positions), so no worker could
// tell whether it holds that position. A type nobody serves is left to the
// usual "no worker" answer, and a type with heads whose heads are not known
// yet fails open.
func (d *Dispatcher) headRefusal(workType string, minHead *uint64, plan *selection.Plan) string {
	if minHead == nil || plan.AnyHead() {
		return ""
	}
	served := d.serves(workType)
	if served {
		h, _ := d.pool.Registry().Get(workType)
		if _, ok := h.(workers.HeadReporter); ok {
			return ""
		}
	}
	if !served && !plan.HasCandidates() {
		return ""
	}
	return fmt.Sprintf("min_head %d: work type %s has no heads (no peer advertises a head for it and the local worker has none), so no worker can serve a position; send it without min_head", *minHead, workType)
}

// onOffer returns, sorted, the work types on offer in the network now: those
// the fresh peers advertise and those the local worker serves. It is asked
// only when a request's type is served nowhere, to name what is.
func (d *Dispatcher) onOffer() []string {
	set := map[string]bool{}
	for _, pi := range d.node.Peers().Peers() {
		for _, wt := range pi.Data.WorkTypes {
			set[wt.Name] = true
		}
	}
	if d.pool != nil {
		for _, n := range d.pool.Registry().Names() {
			set[n] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// dash is s, or "none" when s is empty.
func dash(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// cutShort makes res the result of a request that ctx ended before it
// had one.
func (res *WorkResult) cutShort(ctx context.Context, req WorkRequest) {
	res.Status, res.Error = apiv1.StatusTimeout, endedEarly(ctx, req)
}

// endedEarly says why ctx ended a request before its result: the
// request's own deadline passed, or its caller cancelled it (with the
// cause, when the caller gave one).
func endedEarly(ctx context.Context, req WorkRequest) string {
	if errors.Is(ctx.Err(), context.Canceled) {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return "cancelled before a result: " + cause.Error()
		}
		return "cancelled before a result"
	}
	return fmt.Sprintf("no result within %s", requestTimeout(req))
}

func requestTimeout(req WorkRequest) time.Duration {
	if req.Timeout > 0 {
		return req.Timeout
	}
	return DefaultRequestTimeout
}
