package dispatch

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/builtin"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/protocol"
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
	// Timeout bounds the whole request; zero means DefaultRequestTimeout.
	// When larger than worker-timeout it also bounds each remote attempt,
	// so long work is not cut short by the per-attempt default.
	Timeout time.Duration
	// Labels a remote worker must carry.
	Labels []string
	// MinHead is the position the request names, if any.
	MinHead *uint64
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
}

// Dispatcher sends submitted requests to the best remote worker, chosen by
// the selection core, and falls back to the local worker. Run keeps the
// core in step with the network (peer table, liveness polls, ranking).
type Dispatcher struct {
	cfg    config.Config
	node   *node.Node
	sel    *selection.Selector
	client *protocol.Client
	pool   *pool.Pool
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
	// syncDelay spaces out syncs during a burst of table changes; see Run.
	syncDelay time.Duration
	// metrics counts requests, attempts and polls (see Collector).
	metrics *dispatchMetrics
	// requests admits Dispatch calls until Drain shuts it.
	requests workers.Gate
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
	client, err := protocol.NewClient(n.Host(), n.Network())
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
		syncDelay: defaultSyncDelay,
	}
	sel.Liveness().OnTransition(d.metrics.transition)
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

// attemptResult is what one attempt goroutine reports back.
type attemptResult struct {
	pick    selection.Pick
	outcome selection.Outcome
	resp    protocol.Response
	err     error
	dur     time.Duration
}

// Dispatch runs one request to its one terminal result. It returns only
// when every attempt it started has ended.
func (d *Dispatcher) Dispatch(ctx context.Context, req WorkRequest) WorkResult {
	start := time.Now()
	if req.ID == "" {
		req.ID = d.prefix + strconv.FormatUint(d.seq.Add(1), 10)
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
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	// Only hedging asks whether the request is idempotent (for jsonrpc
	// that reads the payload).
	sreq := selection.Request{WorkType: req.Type, Labels: req.Labels, Idempotent: d.cfg.Hedge.MaxCount > 0 && d.catalog.Idempotent(req.Type, req.Payload)}
	if req.MinHead != nil {
		sreq.MinHead, sreq.HasMinHead = *req.MinHead, true
	}
	plan := d.sel.Plan(sreq)
	res := d.remote(ctx, req, plan)
	if res.Status == "" {
		res = d.fallback(ctx, req, plan, res)
	}
	res.RequestID = req.ID
	res.Duration = time.Since(start)
	d.observe(req, res, plan)
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

// remote runs the remote attempts of a request. A result with an empty
// Status means no remote attempt decided it and the fallback may run.
func (d *Dispatcher) remote(ctx context.Context, req WorkRequest, plan *selection.Plan) (res WorkResult) {
	if d.cfg.Hedge.MaxCount == 0 || !plan.Idempotent() || plan.BeyondHead() {
		return d.sequential(ctx, req, plan)
	}
	actx, cancelAttempts := context.WithCancel(ctx)
	// Every attempt is a distinct peer, so max-remote-workers bounds them:
	// an attempt never blocks on sending its result.
	results := make(chan attemptResult, d.cfg.Worker.MaxRemoteWorkers+1)
	var wg sync.WaitGroup
	dials := &dials{d: d, parent: actx, wg: &wg}
	inflight := 0
	launch := func(pk selection.Pick) {
		inflight++
		wg.Go(func() { results <- d.attempt(actx, req, pk, dials) })
		// Dial the next candidates now, so that dead ones cost one connect
		// timeout in parallel, not one after another.
		for _, id := range plan.Upcoming(d.cfg.Worker.MaxRemoteWorkers) {
			dials.start(id)
		}
	}
	defer func() {
		cancelAttempts()
		wg.Wait()
		close(results)
		for r := range results { // attempts cut short by the decision
			plan.Report(r.pick, workers.Cancelled, r.dur)
			res.Attempts = append(res.Attempts, d.attemptOf(r, workers.Cancelled))
		}
	}()

	if pk, ok := plan.Next(); ok {
		launch(pk)
	}
	var hedgeC, retryC <-chan time.Time
	armHedge := func() {
		if d.cfg.Hedge.MaxCount > 0 {
			hedgeC = time.After(plan.HedgeDelay())
		}
	}
	if inflight > 0 {
		armHedge()
	}
	for inflight > 0 || retryC != nil {
		select {
		case r := <-results:
			inflight--
			v := plan.Report(r.pick, r.outcome, r.dur)
			res.Attempts = append(res.Attempts, d.attemptOf(r, r.outcome))
			switch v {
			case selection.Done:
				return d.decided(r, res)
			case selection.Retry:
				retryC = time.After(d.cfg.Worker.RetryDelay)
			}
		case <-retryC:
			retryC = nil
			if pk, ok := plan.Next(); ok {
				launch(pk)
				armHedge()
			}
		case <-hedgeC:
			hedgeC = nil
			if pk, ok := plan.Hedge(); ok {
				launch(pk)
				armHedge()
			}
		case <-ctx.Done():
			res.Status = apiv1.StatusTimeout
			res.Error = endedEarly(ctx, req)
			return res
		}
	}
	if ctx.Err() != nil {
		// The deadline passed while the last attempt was being cut short.
		res.Status = apiv1.StatusTimeout
		res.Error = endedEarly(ctx, req)
		return res
	}
	if plan.BeyondHead() && len(res.Attempts) > 0 {
		// The one attempt beyond every head failed: no sweep, no fallback.
		res.Status = apiv1.StatusFailed
		res.Error = "the only attempt beyond every head failed: " + lastError(res.Attempts)
		return res
	}
	res.Explanation = plan.Explain().String()
	return res
}

// sequential runs the remote attempts of a request one after another, in
// the dispatching goroutine: without hedges nothing runs concurrently but
// the dials ahead, so the common path costs no goroutine hand-offs.
func (d *Dispatcher) sequential(ctx context.Context, req WorkRequest, plan *selection.Plan) (res WorkResult) {
	var wg sync.WaitGroup
	dials := &dials{d: d, parent: ctx, wg: &wg}
	defer func() {
		dials.cancel()
		wg.Wait()
	}()
	for {
		pk, ok := plan.Next()
		if !ok {
			break
		}
		for _, id := range plan.Upcoming(d.cfg.Worker.MaxRemoteWorkers) {
			dials.start(id)
		}
		r := d.attempt(ctx, req, pk, dials)
		v := plan.Report(pk, r.outcome, r.dur)
		res.Attempts = append(res.Attempts, d.attemptOf(r, r.outcome))
		if ctx.Err() != nil && v != selection.Done {
			res.Status = apiv1.StatusTimeout
			res.Error = endedEarly(ctx, req)
			return res
		}
		if v == selection.Done {
			return d.decided(r, res)
		}
		if v != selection.Retry {
			break
		}
		if d.cfg.Worker.RetryDelay > 0 {
			t := time.NewTimer(d.cfg.Worker.RetryDelay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
	}
	if plan.BeyondHead() && len(res.Attempts) > 0 {
		// The one attempt beyond every head failed: no sweep, no fallback.
		res.Status = apiv1.StatusFailed
		res.Error = "the only attempt beyond every head failed: " + lastError(res.Attempts)
		return res
	}
	res.Explanation = plan.Explain().String()
	return res
}

// decided turns the deciding attempt into the request's result.
func (d *Dispatcher) decided(r attemptResult, res WorkResult) WorkResult {
	res.Worker = d.idString(r.pick.Peer)
	switch r.outcome {
	case workers.Success:
		res.Status, res.Output = apiv1.StatusOK, r.resp.Output
	case workers.Empty:
		res.Status = apiv1.StatusEmpty
	default:
		res.Status, res.Error = apiv1.StatusFailed, r.resp.Error
	}
	return res
}

// fallback runs the request on the local worker when no remote attempt
// decided it and the plan allows it.
func (d *Dispatcher) fallback(ctx context.Context, req WorkRequest, plan *selection.Plan, res WorkResult) WorkResult {
	local := d.pool != nil
	if local {
		_, local = d.pool.Registry().Get(req.Type)
	}
	if ctx.Err() != nil {
		res.Status = apiv1.StatusTimeout
		res.Error = endedEarly(ctx, req)
		return res
	}
	if !plan.FallbackAllowed() || !local {
		why := res.Explanation
		if !local {
			why += "; the local worker does not serve " + req.Type
		}
		if len(res.Attempts) > 0 {
			res.Status = apiv1.StatusFailed
			res.Error = "every attempt failed (last: " + lastError(res.Attempts) + "); " + why
		} else {
			res.Status = apiv1.StatusUnavailable
			res.Error = "no worker could take the work: " + why
		}
		return res
	}
	for spawn := 1; ; spawn++ {
		start := time.Now()
		r := d.pool.Submit(ctx, req.Type, req.Payload)
		res.Attempts = append(res.Attempts, apiv1.Attempt{
			Peer: LocalWorker, Outcome: r.Outcome, Error: r.Error,
			DurationMS: apiv1.Millis(time.Since(start)),
		})
		if r.Outcome == workers.Busy && spawn < d.cfg.Worker.MaxSpawnAttempts && ctx.Err() == nil {
			t := time.NewTimer(d.cfg.Worker.RetryDelay)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
			}
		}
		res.Worker = LocalWorker
		switch {
		case r.Outcome == workers.Success:
			res.Status, res.Output = apiv1.StatusOK, r.Output
		case r.Outcome == workers.Empty:
			res.Status = apiv1.StatusEmpty
		case ctx.Err() != nil:
			res.Status, res.Error = apiv1.StatusTimeout, endedEarly(ctx, req)
		default:
			res.Status, res.Error = apiv1.StatusFailed, r.Error
		}
		return res
	}
}

// attempt runs one remote attempt: connect within connect-timeout, then the
// work protocol within the attempt's deadline.
func (d *Dispatcher) attempt(ctx context.Context, req WorkRequest, pk selection.Pick, dials *dials) attemptResult {
	start := time.Now()
	r := attemptResult{pick: pk}
	id := peer.ID(pk.Peer)
	if err := dials.wait(ctx, pk.Peer); err != nil {
		r.outcome, r.err, r.dur = workers.Unreachable, err, time.Since(start)
		if ctx.Err() != nil {
			r.outcome = workers.Cancelled
		}
		return r
	}
	actx := ctx
	per := max(d.cfg.Worker.WorkerTimeout, req.Timeout)
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > per {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, per)
		defer cancel()
	}
	resp, err := d.client.Do(actx, id, protocol.Request{
		ID: req.ID, Type: req.Type, Payload: req.Payload,
		AcceptTimeout: d.cfg.Worker.WorkerResponseTimeout,
	})
	r.dur = time.Since(start)
	r.resp, r.err = resp, err
	switch {
	case err != nil && ctx.Err() != nil:
		r.outcome = workers.Cancelled // the request ended, or was decided elsewhere
	case errors.Is(err, protocol.ErrAcceptTimeout):
		r.outcome = workers.Unreachable
	case err != nil:
		r.outcome = workers.RetryableError
	default:
		r.outcome = resp.Outcome // Unsupported and Denied are final for this worker only: the plan goes on
	}
	return r
}

// dials holds the dials of one request, so that a peer dialed ahead is not
// dialed again by its attempt: the attempt waits for the dial in progress.
type dials struct {
	d      *Dispatcher
	parent context.Context
	wg     *sync.WaitGroup
	mu     sync.Mutex
	ctx    context.Context // made at the first dial; cancelled by cancel
	stop   context.CancelFunc
	calls  map[string]*dialCall
}

// cancel stops the dials still under way.
func (ds *dials) cancel() {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.stop != nil {
		ds.stop()
	}
}

type dialCall struct {
	done chan struct{}
	err  error
}

// start dials id unless a dial of it already started in this request.
func (ds *dials) start(id string) *dialCall {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if c := ds.calls[id]; c != nil {
		return c
	}
	c := &dialCall{done: make(chan struct{})}
	if ds.calls == nil {
		ds.calls = make(map[string]*dialCall)
		ds.ctx, ds.stop = context.WithCancel(ds.parent)
	}
	ds.calls[id] = c
	ds.wg.Go(func() {
		c.err = ds.d.connect(ds.ctx, id)
		close(c.done)
	})
	return c
}

// wait returns the result of the request's dial of id, starting it if needed.
func (ds *dials) wait(ctx context.Context, id string) error {
	if ds.d.node.Host().Network().Connectedness(peer.ID(id)) == network.Connected {
		return nil // the common case: no dial, no goroutine
	}
	c := ds.start(id)
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// connect makes sure there is a connection to the peer, dialing it within
// connect-timeout when there is none.
func (d *Dispatcher) connect(ctx context.Context, id string) error {
	pid := peer.ID(id)
	h := d.node.Host()
	if h.Network().Connectedness(pid) == network.Connected {
		return nil
	}
	info := peer.AddrInfo{ID: pid}
	if pi, ok := d.node.Peers().Get(pid); ok {
		for _, a := range pi.Data.Addrs {
			if m, err := ma.NewMultiaddr(a); err == nil {
				info.Addrs = append(info.Addrs, m)
			}
		}
	}
	cctx, cancel := context.WithTimeout(ctx, d.cfg.Worker.ConnectTimeout)
	defer cancel()
	if err := h.Connect(cctx, info); err != nil {
		return fmt.Errorf("connect %s within %s: %w", pid, d.cfg.Worker.ConnectTimeout, err)
	}
	return nil
}

func (d *Dispatcher) attemptOf(r attemptResult, o selection.Outcome) apiv1.Attempt {
	a := apiv1.Attempt{Peer: d.idString(r.pick.Peer), Outcome: o, DurationMS: apiv1.Millis(r.dur), Group: r.pick.Group, Hedge: r.pick.Hedge}
	switch {
	case r.err != nil:
		a.Error = r.err.Error()
	case r.resp.Error != "":
		a.Error = r.resp.Error
	}
	return a
}

func lastError(as []apiv1.Attempt) string {
	for i := len(as) - 1; i >= 0; i-- {
		if as[i].Error != "" {
			return as[i].Peer + ": " + as[i].Error
		}
	}
	return "no error recorded"
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

// defaultSyncDelay spaces out a dispatcher's peer syncs during a burst of
// peer table changes.
const defaultSyncDelay = 5 * time.Millisecond

// Run keeps the selection core in step with the network until ctx ends: it
// feeds the peer table's changes to the selector, polls peers' health as
// liveness asks (which is also how unreachable peers are redialed), and
// refreshes the ranking. It returns when ctx ends and every poll it started
// has stopped.
func (d *Dispatcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	const tick = 50 * time.Millisecond
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	table := d.node.Peers()
	changed := table.Changed()
	d.syncPeers()
	var syncC <-chan time.Time // running while syncs are spaced out
	var addC <-chan time.Time  // running while syncs for new peers are
	syncPending := false       // a change arrived since the last sync
	var mu sync.Mutex
	polling := map[string]bool{}
	sem := make(chan struct{}, 16) // polls in flight at once
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			// The first change is taken at once; the changes that
			// follow within syncDelay are taken together at its end,
			// which bounds the syncs during a burst. A new peer is
			// taken at once too, so that it is eligible as its record
			// arrives even while other peers' changes (load, connection
			// state) keep the window running; new peers have a window
			// of their own, which bounds the syncs while a network
			// forms.
			changed = table.Changed()
			switch {
			case syncC == nil:
				d.syncPeers()
				syncC = time.After(d.syncDelay)
			case addC == nil && table.Additions() != d.syncedAdds:
				d.syncPeers()
				addC = time.After(d.syncDelay)
			default:
				syncPending = true
			}
		case <-addC:
			addC = nil
		case <-syncC:
			syncC = nil
			if syncPending {
				syncPending = false
				d.syncPeers()
				syncC = time.After(d.syncDelay)
			}
		case <-ticker.C:
			d.sel.MaybeRefresh()
			for _, id := range d.sel.Liveness().Due() {
				if len(sem) == cap(sem) {
					// Every poll slot is taken (dead peers hold theirs for
					// a whole timeout): the rest stay due for a later tick.
					// Waiting here would stall the peer sync and the
					// ranking refresh behind the slowest polls.
					break
				}
				mu.Lock()
				busy := polling[id]
				polling[id] = true
				mu.Unlock()
				if busy {
					continue
				}
				sem <- struct{}{} // never blocks: only this loop sends
				wg.Go(func() {
					defer func() { <-sem }()
					d.poll(ctx, id)
					mu.Lock()
					delete(polling, id)
					mu.Unlock()
				})
			}
		}
	}
}

// poll pings one peer over the health protocol and reports the result to
// liveness.
func (d *Dispatcher) poll(ctx context.Context, id string) {
	pid := peer.ID(id)
	var err error
	var rtt time.Duration
	timeout := d.cfg.Worker.ConnectTimeout
	if pi := d.cfg.Liveness.PollInterval; pi > 0 && pi < timeout {
		timeout = pi
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err = d.connect(pctx, id); err == nil {
		rtt, _, err = d.node.Ping(pctx, pid)
	}
	if ctx.Err() != nil {
		return // shutting down: not the peer's fault
	}
	d.metrics.poll(id, rtt, err, time.Now())
	d.report(id, err == nil, err)
}

func (d *Dispatcher) report(id string, ok bool, err error) {
	t, changed := d.sel.Liveness().Report(id, ok)
	if !changed {
		return
	}
	f := d.log.WithFields(logrus.Fields{"peer": peer.ID(id).String(), "from": t.From.String(), "to": t.To.String()})
	if err != nil {
		f = f.WithError(err)
	}
	f.Info("peer liveness changed")
}

// syncPeers hands the peer table's fresh peers to the selector.
func (d *Dispatcher) syncPeers() {
	// Noted before reading, so that a peer entered meanwhile is synced
	// again rather than missed.
	d.syncedAdds = d.node.Peers().Additions()
	entries := d.node.Peers().Entries()
	if d.synced == nil {
		d.synced = make(map[peer.ID]syncedPeer, len(entries))
	}
	// A peer whose entry is the one of the last sync is unchanged; one with
	// a new entry (a re-announcement, a connection change) is converted
	// again, and counts as a change only when what selection uses differs.
	changed, kept, before := false, 0, len(d.synced)
	for _, e := range entries {
		id := e.Data.PeerID
		old, ok := d.synced[id]
		if ok {
			kept++
			if old.entry == e {
				continue
			}
		}
		sp := syncedPeer{entry: e, peer: peerOf(*e), name: old.name}
		if !ok {
			sp.name = id.String()
			changed = true
		} else if !old.peer.Equal(sp.peer) {
			changed = true
		}
		d.synced[id] = sp
	}
	if kept < before { // some peers are gone
		changed = true
		present := make(map[peer.ID]struct{}, len(entries))
		for _, e := range entries {
			present[e.Data.PeerID] = struct{}{}
		}
		for id := range d.synced {
			if _, ok := present[id]; !ok {
				delete(d.synced, id)
			}
		}
	}
	if !changed {
		return
	}
	peers := make([]selection.Peer, 0, len(d.synced))
	names := make(map[string]string, len(d.synced))
	for _, sp := range d.synced {
		peers = append(peers, sp.peer)
		names[sp.peer.ID] = sp.name
	}
	d.names.Store(&names)
	d.sel.SetPeers(peers)
}

// syncedPeer is a peer as the dispatcher last synced it: the table entry it
// came from, its selection candidate and its base58 ID.
type syncedPeer struct {
	entry *node.PeerInfo
	peer  selection.Peer
	name  string
}

// idString returns the base58 form of a raw peer ID, from the names of the
// synced peers when it is one of them.
func (d *Dispatcher) idString(raw string) string {
	if names := d.names.Load(); names != nil {
		if s, ok := (*names)[raw]; ok {
			return s
		}
	}
	return peer.ID(raw).String()
}

// peerOf converts a peer table entry to a selection candidate.
func peerOf(pi node.PeerInfo) selection.Peer {
	nd := pi.Data
	// Candidates carry the peer ID's raw bytes: turning them back into a
	// peer.ID costs nothing on the request path.
	p := selection.Peer{ID: string(nd.PeerID), Labels: nd.Labels, Connected: pi.Connected,
		Concurrency: nd.Capacity.MaxConcurrent}
	for _, wt := range nd.WorkTypes {
		t := selection.TypeInfo{Name: wt.Name}
		if wt.Head != nil {
			t.Head, t.HasHead = *wt.Head, true
		}
		p.Types = append(p.Types, t)
	}
	if c := nd.Capacity.MaxConcurrent + nd.Capacity.QueueSize; c > 0 {
		p.Load = float64(nd.Load.InFlight+nd.Load.Queued) / float64(c)
	}
	return p
}
