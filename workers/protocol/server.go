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
)

// ServedRequest describes one stream the server handled, for metrics and
// logs (see WithObserver).
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
	// Duration is the time from the stream's arrival to its end.
	Duration time.Duration
}

// ServerStats counts the streams a server handled.
type ServerStats struct {
	// ByOutcome counts responses sent, by outcome.
	ByOutcome map[workers.Outcome]uint64
	// Malformed counts streams whose request could not be read or decoded.
	Malformed uint64
	// Dropped counts streams ended without a response for any other
	// reason: the client went away or broke the protocol after its
	// request, the resource manager refused the stream, the response could
	// not be written, fault injection dropped it (WithInterceptor).
	Dropped uint64
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
	// serving counts the streams being handled, for Drain; it is never
	// shut (Close refuses streams itself).
	serving workers.Gate
	// draining is set by Drain: responses are held until acknowledged,
	// at most ackWait.
	draining atomic.Bool
	ackWait  time.Duration

	// incomplete bounds the request bodies being read (WithIncompleteLimits).
	incomplete *incomplete

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
	ctx, cancel := context.WithCancelCause(context.Background())
	s := &Server{h: h, pid: ProtocolID(network), pool: pool, cfg: cfg, ctx: ctx, cancel: cancel, ackWait: defaultAckWait,
		incomplete: newIncomplete(cfg.incomplete)}
	s.cfg.log = cfg.log.WithField("protocol", string(s.pid))
	h.SetStreamHandler(s.pid, s.handle)
	return s, nil
}

// Protocol returns the protocol ID the server answers.
func (s *Server) Protocol() protocol.ID { return s.pid }

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	st := ServerStats{ByOutcome: make(map[workers.Outcome]uint64), Malformed: s.malformed.Load(), Dropped: s.dropped.Load()}
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

// handle serves one stream. Every path ends the stream: Close after a
// response was written, Reset otherwise.
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
	s.serving.Enter()
	defer s.serving.Leave()

	sr := ServedRequest{Peer: str.Conn().RemotePeer()}
	start := time.Now()
	defer func() {
		if v := recover(); v != nil {
			_ = str.Reset()
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
	s.serve(str, start, &sr)
}

func (s *Server) serve(str network.Stream, start time.Time, sr *ServedRequest) {
	_ = str.SetDeadline(start.Add(s.cfg.readTimeout))
	body, reserved, err := s.readRequest(str)
	if reserved > 0 {
		defer str.Scope().ReleaseMemory(reserved)
	}
	if err == nil {
		var req Request
		req, err = decodeRequest(body, s.cfg.maxPayload)
		if err == nil {
			sr.ID, sr.Type = req.ID, req.Type
			s.run(str, &req, sr)
			return
		}
	}
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("stream closed before a request: %w", ErrTruncated)
	}
	s.malformed.Add(1)
	sr.Err = fmt.Errorf("read request: %w", err)
	_ = str.Reset()
}

// run executes a decoded request and answers it.
func (s *Server) run(str network.Stream, req *Request, sr *ServedRequest) {
	if s.cfg.allow != nil && !s.cfg.allow(sr.Peer) {
		s.respond(str, req, workers.Fail(workers.Denied, "peer %s is not allowed to submit work here", sr.Peer), sr)
		return
	}
	if s.cfg.limiter != nil {
		if !s.acquire(str, req, sr) {
			return
		}
		defer s.release(sr.Peer)
	}
	budget := req.Timeout
	if budget <= 0 || budget > s.cfg.maxWorkTime {
		budget = s.cfg.maxWorkTime
	}
	deadline := time.Now().Add(budget)
	ctx, cancel := context.WithDeadline(s.ctx, deadline)
	defer cancel()
	_ = str.SetDeadline(deadline.Add(writeSlack))

	// A peer's work takes only the peers' share (local-reserve).
	t, res, ok := s.pool.AdmitPeer(ctx, req.Type, req.Payload)
	if ok {
		res = s.execute(str, req, t)
		// The ticket's context keeps the first cause it was cancelled with.
		if cause := context.Cause(t.Context()); errors.Is(cause, ErrClientGone) || errors.Is(cause, ErrMalformed) ||
			errors.Is(cause, workers.ErrDropped) {
			// Nobody is listening for the answer, the client broke the
			// protocol, or fault injection dropped it: do not write one.
			s.dropped.Add(1)
			sr.Err = cause
			_ = str.Reset()
			return
		}
	}
	s.respond(str, req, res, sr)
}

// acquire asks the peer limiter whether sr's peer may run req, and
// answers the refusal when it may not. It is apart from run, whose stack
// frame every stream's goroutine carries.
func (s *Server) acquire(str network.Stream, req *Request, sr *ServedRequest) bool {
	res, ok := s.cfg.limiter.Acquire(sr.Peer)
	if !ok {
		s.respond(str, req, res, sr)
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
func (s *Server) execute(str network.Stream, req *Request, t *pool.Ticket) workers.Result {
	grace := s.cfg.grace
	if req.AcceptTimeout > 0 {
		grace = min(grace, req.AcceptTimeout/4)
	}
	w := &watchdog{str: str, ticket: t, accept: req.AcceptTimeout > 0, done: make(chan struct{})}
	timer := time.AfterFunc(grace, w.run)
	res, intercepted := workers.Result{}, false
	if s.cfg.intercept != nil {
		res, intercepted = s.cfg.intercept.Intercept(s.pool, t)
	}
	if !intercepted {
		res = s.pool.RunInline(t)
	}
	if !timer.Stop() {
		w.stop(s.draining.Load()) // it fired: end its read and wait for it
	}
	return res
}

// watchdog watches a request's stream while its work runs. It is started
// by a timer and stopped by the stream's goroutine, which waits for it, so
// the accept frame is always written before the response.
type watchdog struct {
	str      network.Stream
	ticket   *pool.Ticket // the work: its context is cancelled through it
	accept   bool
	stopping atomic.Bool
	done     chan struct{}
}

func (w *watchdog) run() {
	defer close(w.done)
	if w.accept {
		var accept [frame.HeaderLen + 1]byte
		if _, err := w.str.Write(appendAccept(accept[:0])); err != nil {
			w.ticket.Cancel(fmt.Errorf("%w: write accept frame: %v", ErrClientGone, err))
			return
		}
	}
	// The client keeps its write side open while it waits, so this read
	// only ends with an error: its reset, a lost connection, or stop.
	var b [1]byte
	n, err := w.str.Read(b[:])
	switch {
	case n > 0:
		w.ticket.Cancel(fmt.Errorf("unexpected bytes after the request: %w", ErrMalformed))
	case w.stopping.Load():
		// Ended on purpose by stop.
	case err != nil && !errors.Is(err, io.EOF):
		w.ticket.Cancel(fmt.Errorf("%w: %v", ErrClientGone, err))
	}
}

// stop ends the pending read (a deadline in the past also ends a read not
// yet started) and waits for run to return. Closing the read side ends it
// where the transport ignores deadlines (mocknet does; there the response
// was never sent): nothing more is read from the client after its request.
// While the server drains, the read side stays open for the client's
// acknowledgement (awaitAck): it is closed only when the deadline has not
// ended the read within stopWait.
func (w *watchdog) stop(draining bool) {
	w.stopping.Store(true)
	_ = w.str.SetReadDeadline(time.Now())
	if draining && w.endsWithin(stopWait) {
		return
	}
	_ = w.str.CloseRead()
	<-w.done
}

// endsWithin reports whether run returns within d.
func (w *watchdog) endsWithin(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.done:
		return true
	case <-t.C:
		return false
	}
}

// load is the pool's load now, carried in every response.
func (s *Server) load() Load {
	st := s.pool.Stats()
	return Load{InFlight: st.InFlight, Queued: st.Queued, Known: true}
}

// respond writes the response frame and closes the stream, or resets it
// when writing fails.
func (s *Server) respond(str network.Stream, req *Request, res workers.Result, sr *ServedRequest) {
	if len(res.Output) > s.cfg.maxPayload {
		res = workers.Fail(workers.PermanentError, "%s: output of %d bytes exceeds the limit of %d", req.Type, len(res.Output), s.cfg.maxPayload)
	}
	resp := Response{ID: req.ID, Result: res, Load: s.load()}
	buf := getBuf()
	*buf = appendResponse((*buf)[:0], &resp)
	_, err := str.Write(*buf)
	putBuf(buf)
	if err != nil {
		s.dropped.Add(1)
		sr.Err = fmt.Errorf("write response: %w", err)
		_ = str.Reset()
		return
	}
	s.byOutcome[res.Outcome].Add(1)
	sr.Outcome = res.Outcome
	if s.draining.Load() {
		s.awaitAck(str)
	}
	_ = str.Close()
}

// awaitAck half-closes a stream whose response is written and waits until
// the client has read it: the client closes its write side only after
// reading the response, so its FIN (EOF here) is the acknowledgement. A
// draining node closes its connections once Drain returns, and QUIC
// discards, with the connection, a response the client has not read yet.
// The wait for the FIN ends at ackWait, or when the server closes, by
// closing the read side: the response itself stays on its way. (When
// Drain began only after a watchdog had closed the read side, there is no
// wait: the stack's drain serves on for a second after it began anyway.)
func (s *Server) awaitAck(str network.Stream) {
	ctx, cancel := context.WithTimeout(s.ctx, s.ackWait)
	defer cancel()
	// CloseRead ends the read on every transport, deadline or not.
	defer context.AfterFunc(ctx, func() { _ = str.CloseRead() })()
	_ = str.CloseWrite()
	_ = str.SetReadDeadline(time.Now().Add(s.ackWait))
	var b [64]byte
	for {
		_, err := str.Read(b[:])
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			s.cfg.log.WithField("peer", str.Conn().RemotePeer()).Debugf("draining: no acknowledgement of a response: %v", err)
			return
		}
	}
}
