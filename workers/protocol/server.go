package protocol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/sirupsen/logrus"
	"github.com/workmesh/workmesh/node/frame"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/reqctx"
)

// ServedRequest describes one request the server handled (a stream
// carries one or more, one after the other), for metrics and logs (see
// WithObserver).
type ServedRequest struct {
	// Peer is the requesting peer.
	Peer peer.ID
	// ID and Type are the request's, when it could be read.
	ID, Type string
	// Outcome is the outcome sent back; zero when no response was sent.
	Outcome workers.Outcome
	// Err says why no response was sent: a malformed or truncated request,
	// a client that went away, a failed write. Nil when a response was sent.
	Err error
	// Duration is the time from the request's arrival (its stream's, for
	// the first request of a stream) to its end.
	Duration time.Duration
}

// ServerStats counts the requests a server handled.
type ServerStats struct {
	// ByOutcome counts responses sent, by outcome.
	ByOutcome map[workers.Outcome]uint64
	// Malformed counts requests that could not be read or decoded (each
	// ends its stream).
	Malformed uint64
	// Dropped counts requests ended without a response for any other
	// reason: the client went away or broke the protocol after its
	// request, the resource manager refused the stream, the response could
	// not be written, fault injection dropped it (WithInterceptor).
	Dropped uint64
	// Waiting counts the streams waiting for a request now, and
	// WaitingClosed those closed so far because more waited than the
	// bounds allow (WithWaitingLimits).
	Waiting       int
	WaitingClosed uint64
}

// Server answers the work protocol on a host by running requests on a
// local worker pool.
type Server struct {
	h    host.Host
	pid  protocol.ID
	pool *pool.Pool
	cfg  settings

	// ctx is the parent of every request's context; Close cancels it.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// mu orders handler starts (wg.Add) against Close (wg.Wait).
	mu     sync.RWMutex
	closed bool
	wg     sync.WaitGroup
	// serving counts the requests being handled, for Drain (a stream
	// waiting for its next request is not); it is never shut (Close
	// refuses streams itself).
	serving workers.Gate
	// draining is set by Drain: responses are held until acknowledged,
	// at most ackWait.
	draining atomic.Bool
	ackWait  time.Duration

	// incomplete bounds the request bodies being read (WithIncompleteLimits).
	incomplete *incomplete
	// waiting holds the streams waiting for a request.
	waiting *waitingSet

	byOutcome [workers.NumOutcomes]atomic.Uint64
	malformed atomic.Uint64
	dropped   atomic.Uint64
}

// NewServer registers the work protocol of network on h, answering with
// pool. Close unregisters it.
func NewServer(h host.Host, network string, pool *pool.Pool, opts ...Option) (*Server, error) {
	if h == nil || pool == nil {
		return nil, errors.New("new work server: nil host or pool")
	}
	if err := checkNetwork(network); err != nil {
		return nil, fmt.Errorf("new work server: %w", err)
	}
	cfg, err := apply(defaults(), opts)
	if err != nil {
		return nil, fmt.Errorf("new work server: %w", err)
	}
	// The server's requests end when its pool closes: their contexts
	// descend from the pool's, which spares the pool a link of its own to
	// each of them.
	ctx, cancel := context.WithCancelCause(pool.Context())
	s := &Server{h: h, pid: ProtocolID(network), pool: pool, cfg: cfg, ctx: ctx, cancel: cancel, ackWait: defaultAckWait,
		incomplete: newIncomplete(cfg.incomplete), waiting: newWaitingSet(cfg.waiting)}
	s.cfg.log = cfg.log.WithField("protocol", string(s.pid))
	h.SetStreamHandler(s.pid, s.handle)
	return s, nil
}

// Protocol returns the protocol ID the server answers.
func (s *Server) Protocol() protocol.ID { return s.pid }

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	st := ServerStats{ByOutcome: make(map[workers.Outcome]uint64), Malformed: s.malformed.Load(), Dropped: s.dropped.Load()}
	st.Waiting, st.WaitingClosed = s.waiting.counts()
	for o := workers.Outcome(1); o < workers.NumOutcomes; o++ {
		if n := s.byOutcome[o].Load(); n > 0 {
			st.ByOutcome[o] = n
		}
	}
	return st
}

// Drain waits until no request is being served, for a node that is
// stopping once its peers have stopped sending it work. It returns nil
// then, or ctx's error if ctx ends first. The server keeps serving
// meanwhile: a peer that has not yet learnt the node withdrew its work
// types may still send some, and is answered. From the first call on, a
// request whose response is written counts as served only once its
// client has read the response, or after 2s without a sign of it (see
// awaitAck), so the node may close its connections when Drain returns.
func (s *Server) Drain(ctx context.Context) error {
	s.draining.Store(true)
	return s.serving.Wait(ctx)
}

// Serving returns the number of requests being served now.
func (s *Server) Serving() int { return int(s.serving.Active()) }

// Close unregisters the protocol, cancels the work of requests being
// served and waits for their streams to end (a handler that ignores its
// context delays Close until it returns). It does not close the pool,
// which the caller owns.
func (s *Server) Close() error {
	s.mu.Lock()
	already := s.closed
	s.closed = true
	s.mu.Unlock()
	if !already {
		s.h.RemoveStreamHandler(s.pid)
		s.cancel(ErrServerClosed)
	}
	s.wg.Wait()
	s.incomplete.stop()
	return nil
}

// handle serves one stream: its requests one after the other, until the
// client closes it, the stream breaks, or the server ends it (between
// requests: its idle timeout, Close, or a response sent while draining).
// Every path ends the stream: Close when no request is left unanswered,
// Reset otherwise.
func (s *Server) handle(str network.Stream) {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		_ = str.Reset()
		return
	}
	s.wg.Add(1)
	s.mu.RUnlock()
	defer s.wg.Done()

	c := &wstream{str: str, peer: str.Conn().RemotePeer()}
	c.state.Store(streamBusy)
	// The stream's own context, a child of the server's: its requests'
	// contexts descend from it, so that concurrent requests do not all
	// register with one parent (a lock and a map every one of them takes).
	var cancel context.CancelFunc
	c.ctx, cancel = context.WithCancel(s.ctx)
	defer cancel()
	defer context.AfterFunc(c.ctx, c.contextEnded)()
	// A new stream waits for its first request as a kept one waits for its
	// next (next), among the streams waiting (WithWaitingLimits), for the
	// request read timeout rather than the idle timeout.
	for fresh := true; s.next(c, fresh); fresh = false {
		s.serveOne(c)
		if !c.keep {
			break
		}
	}
	if w := c.watch; w != nil {
		<-w.done // the stream has ended, and with it the watchdog's read
	}
	if c.idle != nil {
		c.ended.Store(true) // before Stop: a check running now does not set it again
		c.idle.Stop()
	}
	c.stopGrace()
	c.stopDeadline()
}

// serveOne serves the stream's next request; c.keep says afterwards
// whether the stream may carry another one.
func (s *Server) serveOne(c *wstream) {
	c.keep = false
	s.serving.Enter()
	defer s.serving.Leave()
	sr := ServedRequest{Peer: c.peer}
	start := time.Now()
	defer func() {
		if v := recover(); v != nil {
			_ = c.str.Reset()
			c.keep = false
			sr.Outcome, sr.Err = 0, fmt.Errorf("work server panicked: %v", v)
			s.cfg.log.WithField("peer", sr.Peer).Errorf("work server panicked: %v", v)
		}
		sr.Duration = time.Since(start)
		if sr.Err != nil {
			s.cfg.log.WithFields(logrus.Fields{"peer": sr.Peer, "request_id": sr.ID}).Debugf("work stream ended without a response: %v", sr.Err)
		}
		if s.cfg.observe != nil {
			s.cfg.observe(sr)
		}
	}()
	s.serve(c, &sr, start)
}

// The states of a server's stream (wstream.state).
const (
	streamBusy int32 = iota
	streamIdle
	streamEnded
)

// wstream is a work stream on the server's side, for as long as it
// carries requests.
type wstream struct {
	str  network.Stream
	peer peer.ID
	// ctx ends when the server closes or the stream is done with.
	ctx context.Context
	// reqs, a child of ctx, is the parent of the stream's requests'
	// contexts (reqctx.Ctx, begin): cancelRequests cancels it and the request
	// running with a cause (its Ticket's Cancel), endRequests only it, and
	// requests makes a new one for the next request.
	reqs           context.Context
	cancelRequests context.CancelCauseFunc
	endRequests    context.CancelCauseFunc
	// cur is the context of the request running (nil between requests)
	// and curEndParent the endRequests of its parent; deadline is the
	// stream's timer for its requests' deadlines (begin, deadlinePassed),
	// due at deadlineAt (zero when not pending). dmu guards them.
	dmu          sync.Mutex
	cur          *reqctx.Ctx
	curEndParent context.CancelCauseFunc
	deadline     *time.Timer
	deadlineAt   time.Time
	// state is streamIdle while the stream waits for a request (only
	// then may endIdle end it), streamBusy while it carries one.
	state atomic.Int32
	// waiting is its place among the streams waiting (Server.waiting).
	waiting waitingPlace
	// first is the first byte of the next request, read by next; pending
	// says Read has not returned it yet.
	first   [1]byte
	pending bool
	// hdr is room for the length of the request frame read next, and
	// lastType the work type of the last request (decodeRequestAs
	// returns it, not a copy, for the next request of the same type).
	hdr      frame.Header
	lastType string
	// watch is the watchdog of the last request, whose read is the
	// stream's next one; nil when there is none.
	watch *watchdog
	// keep is set once a response is written on a stream that may carry
	// the next request.
	keep bool
	// idle is the stream's idle timer (next): it ends the stream when it
	// has waited for its next request for idleTimeout, since idleFrom
	// (Unix nanoseconds). ended is set once the stream is done with.
	idle        *time.Timer
	idleTimeout time.Duration
	idleFrom    atomic.Int64
	ended       atomic.Bool
	// grace is the stream's grace timer (arm); when the running request
	// outlasts its grace period, until graceAt, fire sends the watchdog
	// it starts for the request in ticket and accept on fired. gmu
	// guards the timer's bookkeeping: timerAt is when it fires (zero when
	// not pending), running says a request is between arm and disarm,
	// expired that fire started its watchdog.
	gmu     sync.Mutex
	grace   *time.Timer
	timerAt time.Time
	graceAt time.Time
	running bool
	expired bool
	fired   chan *watchdog
	ticket  atomic.Pointer[pool.Ticket]
	accept  atomic.Bool
}

// requests returns the parent of the next request's context: the stream's
// request context, made again once a request's Ticket cancelled it.
func (c *wstream) requests() context.Context {
	if c.reqs == nil || c.reqs.Err() != nil {
		c.reqs, c.endRequests = context.WithCancelCause(c.ctx)
		end := c.endRequests
		c.cancelRequests = func(cause error) {
			end(cause)
			c.endCurrent()
		}
	}
	return c.reqs
}

// Read reads the stream, starting with the byte next read.
func (c *wstream) Read(b []byte) (int, error) {
	if c.pending && len(b) > 0 {
		c.pending = false
		b[0] = c.first[0]
		return 1, nil
	}
	return c.str.Read(b)
}

// serve reads, runs and answers the stream's next request, which arrived
// at start.
func (s *Server) serve(c *wstream, sr *ServedRequest, start time.Time) {
	body, reserved, err := s.readRequest(c)
	if reserved > 0 {
		defer c.str.Scope().ReleaseMemory(reserved)
	}
	if err == nil {
		var req Request
		req, err = decodeRequestAs(body, s.cfg.maxPayload, c.lastType)
		if err == nil {
			c.lastType = req.Type
			sr.ID, sr.Type = req.ID, req.Type
			s.run(c, &req, sr, start)
			return
		}
	}
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("stream closed before a request: %w", ErrTruncated)
	}
	s.malformed.Add(1)
	sr.Err = fmt.Errorf("read request: %w", err)
	_ = c.str.Reset()
}

// run executes a decoded request, which arrived at start, and answers it:
// its time budget runs from its arrival, as the client's did from its
// sending.
func (s *Server) run(c *wstream, req *Request, sr *ServedRequest, start time.Time) {
	if s.cfg.allow != nil && !s.cfg.allow(sr.Peer) {
		s.respond(c, req, workers.Fail(workers.Denied, "peer %s is not allowed to submit work here", sr.Peer), sr)
		return
	}
	if s.cfg.limiter != nil {
		if !s.acquire(c, req, sr) {
			return
		}
		defer s.release(sr.Peer)
	}
	budget := req.Timeout
	if budget <= 0 || budget > s.cfg.maxWorkTime {
		budget = s.cfg.maxWorkTime
	}
	deadline := start.Add(budget)
	ctx := c.begin(deadline)
	defer c.finish(ctx)
	_ = c.str.SetDeadline(deadline.Add(writeSlack))

	// A peer's work takes only the peers' share (local-reserve). Its
	// Ticket's Cancel cancels the stream's request context (requests),
	// and with it this request's.
	t, res, ok := s.pool.AdmitPeerIn(ctx, c.cancelRequests, req.Type, req.Payload)
	if ok {
		res = s.execute(c, req, t)
		// The ticket's context keeps the first cause it was cancelled with.
		if cause := context.Cause(t.Context()); errors.Is(cause, ErrClientGone) || errors.Is(cause, ErrMalformed) ||
			errors.Is(cause, workers.ErrDropped) {
			// Nobody is listening for the answer, the client broke the
			// protocol, or fault injection dropped it: do not write one.
			s.dropped.Add(1)
			sr.Err = cause
			_ = c.str.Reset()
			return
		}
	}
	s.respond(c, req, res, sr)
}

// acquire asks the peer limiter whether sr's peer may run req, and
// answers the refusal when it may not. It is apart from run, whose stack
// frame every stream's goroutine carries.
func (s *Server) acquire(c *wstream, req *Request, sr *ServedRequest) bool {
	res, ok := s.cfg.limiter.Acquire(sr.Peer)
	if !ok {
		s.respond(c, req, res, sr)
	}
	return ok
}

// release ends what acquire admitted.
func (s *Server) release(p peer.ID) { s.cfg.limiter.Release(p) }

// execute runs an admitted request on the stream's goroutine. Work that is
// done within the grace period (most of it) costs nothing more. Longer
// work, or work that waits in the queue, gets a watchdog goroutine that
// sends the accept frame when the client asked for one, then keeps a read
// pending on the stream and cancels the work when the client resets it.
// That read is never stopped: once the work is done, it becomes the
// stream's wait for its next request (c.watch), so the stream stays
// whole on every transport, with or without deadlines.
func (s *Server) execute(c *wstream, req *Request, t *pool.Ticket) workers.Result {
	grace := s.cfg.grace
	if req.AcceptTimeout > 0 {
		grace = min(grace, req.AcceptTimeout/4)
	}
	c.arm(t, req.AcceptTimeout > 0, grace)
	res, intercepted := workers.Result{}, false
	if s.cfg.intercept != nil {
		res, intercepted = s.cfg.intercept.Intercept(s.pool, t)
	}
	if !intercepted {
		res = s.pool.RunInline(t)
	}
	if !c.disarm() {
		// It fired: the watchdog's accept frame goes first, its read is
		// the stream's next.
		w := <-c.fired
		w.takeOver()
		c.watch = w
	}
	return res
}

// load is the pool's load now, carried in every response.
func (s *Server) load() Load {
	st := s.pool.Stats()
	return Load{InFlight: st.InFlight, Queued: st.Queued, Known: true}
}

// respond writes the response frame, then keeps the stream for the next
// request (c.keep), or closes it: after the client's acknowledgement while
// the server drains, at once after a denial; it resets the stream when
// writing fails.
func (s *Server) respond(c *wstream, req *Request, res workers.Result, sr *ServedRequest) {
	if len(res.Output) > s.cfg.maxPayload {
		res = workers.Fail(workers.PermanentError, "%s: output of %d bytes exceeds the limit of %d", req.Type, len(res.Output), s.cfg.maxPayload)
	}
	resp := Response{ID: req.ID, Result: res, Load: s.load()}
	if err := writeResponse(c.str, &resp); err != nil {
		s.dropped.Add(1)
		sr.Err = fmt.Errorf("write response: %w", err)
		_ = c.str.Reset()
		return
	}
	s.byOutcome[res.Outcome].Add(1)
	sr.Outcome = res.Outcome
	if s.draining.Load() {
		s.awaitAck(c)
		_ = c.str.Close()
		return
	}
	if res.Outcome == workers.Denied {
		// Not kept for a peer refused: its next request would be
		// refused too, and it would hold the stream meanwhile.
		_ = c.str.Close()
		return
	}
	c.keep = true
}

// awaitAck half-closes a stream whose response is written and waits until
// the client has read it: the client closes its write side only after
// reading the response, so its FIN (EOF here) is the acknowledgement. A
// draining node closes its connections once Drain returns, and QUIC
// discards, with the connection, a response the client has not read yet.
// The wait for the FIN ends at ackWait, or when the server closes, by
// closing the read side: the response itself stays on its way. Bytes the
// client sent meanwhile (a next request, sent before it saw the FIN) are
// not taken: the FIN told it so.
func (s *Server) awaitAck(c *wstream) {
	ctx, cancel := context.WithTimeout(s.ctx, s.ackWait)
	defer cancel()
	// CloseRead ends the read on every transport, deadline or not.
	defer context.AfterFunc(ctx, func() { _ = c.str.CloseRead() })()
	_ = c.str.CloseWrite()
	_ = c.str.SetReadDeadline(time.Now().Add(s.ackWait))
	if w := c.watch; w != nil {
		c.watch = nil
		<-w.done
		if w.n == 0 {
			s.acked(c, w.err)
			return
		}
	}
	var b [64]byte
	for {
		_, err := c.str.Read(b[:])
		if err != nil {
			s.acked(c, err)
			return
		}
	}
}

// acked logs an acknowledgement wait that ended with err other than the
// client's FIN.
func (s *Server) acked(c *wstream, err error) {
	if !errors.Is(err, io.EOF) {
		s.cfg.log.WithField("peer", c.peer).Debugf("draining: no acknowledgement of a response: %v", err)
	}
}
