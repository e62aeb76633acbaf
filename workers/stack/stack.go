package stack

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/node/httpapi"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/access"
	"github.com/workmesh/workmesh/workers/api"
	"github.com/workmesh/workmesh/workers/dispatch"
	"github.com/workmesh/workmesh/workers/faults"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/protocol"
)

// ErrUsage is wrapped by the errors of Start that come from the
// configuration (a bad setting, a work type that cannot be built), as
// opposed to a failure of the machine: `workmesh node start` exits 2 on
// them.
var ErrUsage = errors.New("bad configuration")

// usageError marks err as a configuration error (ErrUsage).
func usageError(err error) error { return fmt.Errorf("%w (%w)", err, ErrUsage) }

// Stack is everything one workmesh node runs: the node (host, DHT, gossip,
// peer table, API), the local worker pool and its registry, the work
// protocol server, the dispatcher and the work API. `workmesh node start`
// runs one, `devnet` several in one process; a Go program embeds one with
// Start and its own handlers (WithHandler).
type Stack struct {
	cfg    config.Config
	log    *logrus.Logger
	node   *node.Node
	reg    *workers.Registry
	pool   *pool.Pool
	server *protocol.Server
	disp   *dispatch.Dispatcher
	api    *api.Work
	// extra holds the http, jsonrpc and custom work types and their
	// pollers.
	extra *extraTypes
	// types keeps the advertised work types in step with their health.
	types *TypeHealth
	// faults and access are the work server's drill and admission settings.
	faults *faults.Faults
	access *access.Access
	// metrics is the node's own Prometheus registry, served at /metrics:
	// several stacks in one process (devnet, tests) never share one.
	metrics *prometheus.Registry

	// ctx lives as long as the stack: background loops run under it and
	// API requests are cut short by its end.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// drainTimedOut is set when drain gave up waiting for work, after
	// drainedFor.
	drainTimedOut atomic.Bool
	drainedFor    atomic.Int64

	closeOnce sync.Once
	closeErr  error
}

// Option adjusts a Stack.
type Option func(*options)

type options struct {
	nodeOpts []node.Option
	version  string
	handlers map[string]workers.Handler
}

// WithNodeOptions passes options to node.New (devnet mounts its control
// endpoint with one).
func WithNodeOptions(opts ...node.Option) Option {
	return func(o *options) { o.nodeOpts = append(o.nodeOpts, opts...) }
}

// WithVersion sets the version the node advertises.
func WithVersion(v string) Option { return func(o *options) { o.version = v } }

// WithHandler serves work type name with h, besides the types of the
// configuration: the way a Go program adds its own work. h's traits
// (workers.TraitsOf) go into the dispatcher's catalog; the name must not
// be a built-in type's or a custom type's.
func WithHandler(name string, h workers.Handler) Option {
	return func(o *options) {
		if o.handlers == nil {
			o.handlers = map[string]workers.Handler{}
		}
		o.handlers[name] = h
	}
}

// Start starts a whole node from cfg, whose defaults must be set
// (config.Load does it, as does config.Defaults). ctx bounds the start
// only; the stack runs until Close. On error everything started is
// stopped again; an error of the configuration wraps ErrUsage.
func Start(ctx context.Context, cfg config.Config, log *logrus.Logger, opts ...Option) (*Stack, error) {
	so := options{version: "dev"}
	for _, o := range opts {
		o(&so)
	}
	if err := httpapi.CheckExposure(cfg.Node.API, cfg.Access.APIToken); err != nil {
		return nil, usageError(err)
	}
	acc, err := access.New(cfg.Access)
	if err != nil {
		return nil, usageError(err)
	}
	inj, err := faults.New(cfg.Fault)
	if err != nil {
		return nil, usageError(err)
	}
	// The work types that need settings of their own are built first, so
	// a bad setting stops the start before anything listens.
	extra, err := newExtraTypes(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	extra.own = so.handlers
	reg, err := extra.newRegistry(cfg.Node.WorkTypes, cfg.CustomTypes)
	if err != nil {
		extra.close()
		return nil, usageError(fmt.Errorf("work-types: %w", err))
	}
	local, err := pool.New(reg, cfg.Worker, log)
	if err != nil {
		extra.close()
		return nil, err
	}
	// The node advertises exactly what the registry serves: with no
	// work-types configured the registry holds every built-in type. A
	// type that reports itself out (a custom type's health URL, the
	// jsonrpc upstream) is left out until it is healthy (types).
	var s *Stack
	types := NewTypeHealth(reg, func(t []string) error { return s.node.SetWorkTypes(t) }, log)
	cfg.Node.WorkTypes = types.Healthy()

	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s = &Stack{cfg: cfg, log: log, reg: reg, pool: local, ctx: sctx, cancel: cancel, extra: extra, faults: inj, access: acc, types: types}
	fail := func(err error) (*Stack, error) {
		s.Close()
		return nil, err
	}
	state := pool.NewLocalState(local, inj)
	memberOpts, localLabels, err := membershipOptions(cfg)
	if err != nil {
		return fail(err)
	}
	nodeOpts := append([]node.Option{
		node.WithLogger(log), node.WithVersion(so.version), node.WithLocalState(state), node.WithHealthCheck(state.Health),
		node.WithAPIToken(cfg.Access.APIToken), node.WithInfo("faults", func() any { return inj.View() }),
	}, append(memberOpts, so.nodeOpts...)...)
	n, err := node.New(sctx, cfg.Node, nodeOpts...)
	if err != nil {
		return fail(err)
	}
	s.node = n
	if n.Members() != nil {
		acc.RequireMembers(n.IsMember)
	}
	extra.protectOwnPorts(n)
	if s.server, err = protocol.NewServer(n.Host(), n.Network(), local, protocol.WithLogger(log),
		protocol.WithMaxPayload(workers.WireLimit(cfg.Limits.MaxPayload, cfg.Limits.MaxResult)),
		protocol.WithObserver(servedLogger(log)), protocol.WithPeerLimiter(acc), protocol.WithInterceptor(inj),
		waitingLimits(node.WorkStreamBudget(n.Host(), n.Network()))); err != nil {
		return fail(err)
	}
	// The local worker's labels, for a request's required labels: in a
	// closed network the attested ones only.
	dcfg := cfg
	dcfg.Node.Labels = localLabels
	if s.disp, err = dispatch.New(dcfg, n, local, dispatch.WithLogger(log), dispatch.WithCatalog(extra.catalog(cfg))); err != nil {
		return fail(err)
	}
	if s.api, err = api.NewWork(s.Dispatch, api.WithLogger(log), api.WithMaxPayload(cfg.Limits.MaxPayload),
		api.WithMaxBody(max(apiv1.DefaultMaxBody, int64(cfg.Limits.MaxPayload)/3*4+(1<<20)))); err != nil {
		return fail(err)
	}
	if err := s.api.Register(n.HandleAPI); err != nil {
		return fail(err)
	}
	if err := inj.Register(n.HandleAPI); err != nil {
		return fail(err)
	}
	rpc, err := api.NewRPC(s.Dispatch, api.WithLogger(log))
	if err != nil {
		return fail(err)
	}
	if err := rpc.Register(n.HandleAPI); err != nil {
		return fail(err)
	}
	extra.onHead(n.Announce)
	extra.onTypeHealth(types.Wake)
	s.wg.Go(func() { extra.run(sctx) })
	s.wg.Go(func() { types.Run(sctx) })
	s.metrics = prometheus.NewRegistry()
	if err := registerAll(s.metrics,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		n.Collector(), s.disp.Collector(), local.Collector(),
		s.server.Collector(), s.api.Collector()); err != nil {
		return fail(err)
	}
	op, err := api.NewOperator(s.disp, s.metrics, api.WithStatusWork(s.api),
		api.WithStatusServer(s.server), api.WithLogger(log))
	if err != nil {
		return fail(err)
	}
	if err := op.Register(n.HandleAPI); err != nil {
		return fail(err)
	}
	s.wg.Go(func() {
		if err := s.disp.Run(sctx); err != nil {
			log.WithError(err).Error("dispatcher stopped")
		}
	})
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("start: %w", err))
	}
	return s, nil
}

// Dispatch runs one request, ending it early when the stack closes so
// that shutdown does not wait for the request's own deadline.
func (s *Stack) Dispatch(ctx context.Context, req dispatch.WorkRequest) dispatch.WorkResult {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(s.ctx, func() {
		why := "the node stopped"
		if s.drainTimedOut.Load() {
			why += " (drain-timeout " + time.Duration(s.drainedFor.Load()).String() + " passed)"
		}
		cancel(errors.New(why + " before the request ended; the work may or may not have run"))
	})
	defer stop()
	return s.disp.Dispatch(ctx, req)
}

// registerAll registers every collector in reg.
func registerAll(reg *prometheus.Registry, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	return nil
}

// servedLogger logs, at debug, each request this node's work server
// answered for a peer, with request_id, peer and work_type fields.
// waitingLimits bounds the work streams that wait for a request to half of
// budget, the inbound work streams the host allows (node.WorkStreamBudget),
// and at most the protocol's defaults: streams held open and idle, however
// many identities hold them, leave the other half to streams that carry
// work. A budget of 0 (unknown) leaves the defaults.
func waitingLimits(budget int) protocol.Option {
	total := protocol.DefaultWaitingTotal
	if budget > 0 {
		total = max(1, min(total, budget/2))
	}
	return protocol.WithWaitingLimits(total, min(protocol.DefaultWaitingPerPeer, total))
}

func servedLogger(log *logrus.Logger) func(protocol.ServedRequest) {
	return func(sr protocol.ServedRequest) {
		if !log.IsLevelEnabled(logrus.DebugLevel) {
			return
		}
		f := log.WithFields(logrus.Fields{
			"request_id": sr.ID, "peer": sr.Peer.String(), "work_type": sr.Type, "duration_ms": apiv1.Millis(sr.Duration),
		})
		if sr.Err != nil {
			f.WithError(sr.Err).Debug("served request dropped")
			return
		}
		f.WithField("outcome", sr.Outcome.String()).Debug("served request")
	}
}

// The local worker's load is not announced: it travels in the answers to
// work and to health pings (see dispatch's load.go), and the node's record
// is re-signed only for what changes rarely.

// withdrawGrace is how long a draining node keeps serving peers after it
// withdrew its work types, even with nothing in progress: its peers learn
// of the withdrawal by gossip within milliseconds, and a request one of
// them sent before that arrives meanwhile and is answered rather than cut.
const withdrawGrace = time.Second

// Drain is the first part of a clean stop: the node withdraws its work
// types (a re-signed record with none, gossiped at once), so that peers
// stop choosing it; the dispatcher refuses new API work; and drain waits,
// at most d, until the work in progress has ended: the requests of the
// node's own API (remote or local) and those it serves for peers, which
// it keeps answering meanwhile, for withdrawGrace at least. A d of 0
// skips it.
func (s *Stack) Drain(d time.Duration) {
	if d <= 0 {
		return
	}
	start := time.Now()
	if err := s.types.Drain(); err != nil {
		s.log.WithError(err).Warn("drain: could not withdraw the work types")
	}
	s.log.WithFields(logrus.Fields{"requests": s.disp.InFlight(), "serving": s.server.Serving(), "drain_timeout_ms": apiv1.Millis(d)}).
		Info("draining: work types withdrawn, waiting for the work in progress (a second SIGINT or SIGTERM stops at once)")
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	grace := time.NewTimer(min(withdrawGrace, d))
	defer grace.Stop()
	graced := false
	for {
		var wg sync.WaitGroup
		var dispErr, srvErr error
		wg.Go(func() { dispErr = s.disp.Drain(ctx) })
		wg.Go(func() { srvErr = s.server.Drain(ctx) })
		wg.Wait()
		if dispErr != nil || srvErr != nil {
			s.log.WithFields(logrus.Fields{"requests": s.disp.InFlight(), "serving": s.server.Serving(), "drain_timeout_ms": apiv1.Millis(d)}).
				Warn("drain timed out: cancelling the work still in progress")
			s.drainedFor.Store(int64(d))
			s.drainTimedOut.Store(true)
			return
		}
		if graced {
			break
		}
		// Idle, but a peer may not have heard yet: serve on until the
		// grace ends, then wait once more for what arrived meanwhile.
		select {
		case <-grace.C:
		case <-ctx.Done():
		}
		graced = true
	}
	s.log.WithField("took_ms", apiv1.Millis(time.Since(start))).Info("drained: no work in progress")
}

// cancelledWait bounds how long Close waits for the API's requests, once
// cancelled, to end with the reason before it closes the local worker.
const cancelledWait = 2 * time.Second

// Close stops the stack: the background loops first, and the requests of
// the node's own API, which end with the reason (the node stopped); then
// the work server (cancelling work served for peers), the local worker,
// and the node with its API. It is safe to call more than once.
func (s *Stack) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		s.wg.Wait()
		if s.disp != nil {
			// Each request's context is cancelled by now or in a moment
			// (dispatch), and its work ends with that cause. Closing the
			// local worker first would race it: a request running there
			// would end as "local worker closed" and be reported as an
			// ordinary failure.
			ctx, cancel := context.WithTimeout(context.Background(), cancelledWait)
			if err := s.disp.Drain(ctx); err != nil {
				s.log.WithField("requests", s.disp.InFlight()).Warnf("stop: API requests still running after %s; closing the local worker under them", cancelledWait)
			}
			cancel()
		}
		var errs []error
		if s.server != nil {
			if err := s.server.Close(); err != nil {
				errs = append(errs, fmt.Errorf("work server: %w", err))
			}
		}
		if err := s.pool.Close(); err != nil {
			errs = append(errs, fmt.Errorf("local worker: %w", err))
		}
		if s.node != nil {
			if err := s.node.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		s.extra.close()
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// CloseWithin closes the stack, giving up after d (the process is about to
// exit, so what is still stopping is not waited for).
func (s *Stack) CloseWithin(d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return fmt.Errorf("shutdown: node %s did not stop within %s", s.node.ID(), d)
	}
}

// Node returns the stack's node.
func (s *Stack) Node() *node.Node { return s.node }

// Dispatcher returns the stack's dispatcher.
func (s *Stack) Dispatcher() *dispatch.Dispatcher { return s.disp }

// Registry returns the work types the local worker serves.
func (s *Stack) Registry() *workers.Registry { return s.reg }

// Config returns the configuration the stack runs with (its work-types
// are those it serves).
func (s *Stack) Config() config.Config { return s.cfg }
