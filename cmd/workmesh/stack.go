package main

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

// loadAnnounceInterval is how often the stack looks at the local worker's
// load and, when it changed, asks the node to re-announce. Peers rate load
// over seconds, so fresher figures would only add gossip.
const loadAnnounceInterval = time.Second

// stack is everything one workmesh node runs: the node (host, DHT, gossip,
// peer table, API), the local worker pool and its registry, the work
// protocol server, the dispatcher and the work API. `node start` runs one;
// `devnet` runs several in one process.
type stack struct {
	cfg    config.Config
	log    *logrus.Logger
	node   *node.Node
	reg    *workers.Registry
	pool   *pool.Pool
	server *protocol.Server
	disp   *dispatch.Dispatcher
	api    *api.Work
	// extra holds the http and jsonrpc work types and their head poller.
	extra *extraTypes
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
	// drainTimedOut is set when drain gave up waiting for work.
	drainTimedOut atomic.Bool

	closeOnce sync.Once
	closeErr  error
}

// stackOption adjusts what startStack passes to the node.
type stackOption func(*stackOptions)

type stackOptions struct {
	nodeOpts []node.Option
}

// withNodeOptions passes options to node.New (devnet mounts its control
// endpoint with one).
func withNodeOptions(opts ...node.Option) stackOption {
	return func(o *stackOptions) { o.nodeOpts = append(o.nodeOpts, opts...) }
}

// startStack starts a whole node from cfg. ctx bounds the start only; the
// stack runs until Close. On error everything started is stopped again.
func startStack(ctx context.Context, cfg config.Config, log *logrus.Logger, opts ...stackOption) (*stack, error) {
	var so stackOptions
	for _, o := range opts {
		o(&so)
	}
	if err := httpapi.CheckExposure(cfg.Node.API, cfg.Access.APIToken); err != nil {
		return nil, usageError{err}
	}
	acc, err := access.New(cfg.Access)
	if err != nil {
		return nil, usageError{err}
	}
	inj, err := faults.New(cfg.Fault)
	if err != nil {
		return nil, usageError{err}
	}
	// The work types that need settings of their own are built first, so
	// a bad setting stops the start before anything listens.
	extra, err := newExtraTypes(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	reg, err := extra.newRegistry(cfg.Node.WorkTypes)
	if err != nil {
		extra.close()
		return nil, fmt.Errorf("work-types: %w", err)
	}
	local, err := pool.New(reg, cfg.Worker, log)
	if err != nil {
		extra.close()
		return nil, err
	}
	// The node advertises exactly what the registry serves: with no
	// work-types configured the registry holds every built-in type.
	cfg.Node.WorkTypes = reg.Names()

	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &stack{cfg: cfg, log: log, reg: reg, pool: local, ctx: sctx, cancel: cancel, extra: extra, faults: inj, access: acc}
	fail := func(err error) (*stack, error) {
		s.Close()
		return nil, err
	}
	state := pool.NewLocalState(local, inj)
	memberOpts, localLabels, err := membershipOptions(cfg)
	if err != nil {
		return fail(err)
	}
	nodeOpts := append([]node.Option{
		node.WithLogger(log), node.WithVersion(version), node.WithLocalState(state), node.WithHealthCheck(state.Health),
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
		protocol.WithObserver(servedLogger(log)), protocol.WithPeerLimiter(acc), protocol.WithInterceptor(inj)); err != nil {
		return fail(err)
	}
	// The local worker's labels, for a request's required labels: in a
	// closed network the attested ones only.
	dcfg := cfg
	dcfg.Node.Labels = localLabels
	if s.disp, err = dispatch.New(dcfg, n, local, dispatch.WithLogger(log), dispatch.WithCatalog(knownTypes())); err != nil {
		return fail(err)
	}
	if s.api, err = api.NewWork(s.dispatch, api.WithLogger(log)); err != nil {
		return fail(err)
	}
	if err := s.api.Register(n.HandleAPI); err != nil {
		return fail(err)
	}
	if err := inj.Register(n.HandleAPI); err != nil {
		return fail(err)
	}
	rpc, err := api.NewRPC(s.dispatch, api.WithLogger(log))
	if err != nil {
		return fail(err)
	}
	if err := rpc.Register(n.HandleAPI); err != nil {
		return fail(err)
	}
	extra.onHead(n.Announce)
	s.wg.Go(func() { extra.run(sctx) })
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
	s.wg.Go(s.announceLoad)
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("start: %w", err))
	}
	return s, nil
}

// dispatch runs one API request, ending it early when the stack closes so
// that shutdown does not wait for the request's own deadline.
func (s *stack) dispatch(ctx context.Context, req dispatch.WorkRequest) dispatch.WorkResult {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(s.ctx, func() {
		why := "the node stopped"
		if s.drainTimedOut.Load() {
			why += " (drain-timeout " + s.cfg.Node.DrainTimeout.String() + " passed)"
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

// announceLoad re-announces the node's record when the local worker's load
// changed, at most once per loadAnnounceInterval.
func (s *stack) announceLoad() {
	t := time.NewTicker(loadAnnounceInterval)
	defer t.Stop()
	var last pool.Stats
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		st := s.pool.Stats()
		if st.InFlight != last.InFlight || st.Queued != last.Queued {
			last = st
			s.node.Announce()
		}
	}
}

// withdrawGrace is how long a draining node keeps serving peers after it
// withdrew its work types, even with nothing in progress: its peers learn
// of the withdrawal by gossip within milliseconds, and a request one of
// them sent before that arrives meanwhile and is answered rather than cut.
const withdrawGrace = time.Second

// drain is the first part of a clean stop: the node withdraws its work
// types (a re-signed record with none, gossiped at once), so that peers
// stop choosing it; the dispatcher refuses new API work; and drain waits,
// at most d, until the work in progress has ended: the requests of the
// node's own API (remote or local) and those it serves for peers, which
// it keeps answering meanwhile, for withdrawGrace at least. A d of 0
// skips it.
func (s *stack) drain(d time.Duration) {
	if d <= 0 {
		return
	}
	start := time.Now()
	if err := s.node.SetWorkTypes(nil); err != nil {
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
func (s *stack) Close() error {
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

// closeWithin closes the stack, giving up after d (the process is about to
// exit, so what is still stopping is not waited for).
func (s *stack) closeWithin(d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return fmt.Errorf("shutdown: node %s did not stop within %s", s.node.ID(), d)
	}
}
