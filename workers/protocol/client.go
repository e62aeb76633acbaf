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
	"github.com/workmesh/workmesh/node/frame"
	"github.com/workmesh/workmesh/workers"
)

// Client sends work to remote workers over the work protocol. It is safe
// for concurrent use. A call takes one of the streams the client keeps
// open to the peer, or opens one when all are busy, and sends only its
// own request on it until it has the response (WithStreamPool).
type Client struct {
	h   host.Host
	pid protocol.ID
	cfg settings

	// mu guards the pool of idle streams.
	mu     sync.Mutex
	idle   map[peer.ID][]*cstream // each peer's, most recently used last
	sweep  *time.Timer            // closes streams idle too long; nil when none is pending
	closed bool

	opened atomic.Uint64 // streams opened, for tests
}

// cstream is one work stream of a client. The call that owns the stream
// reads its frames itself, on its own goroutine. A stream idle in the pool
// for watchDelay gets a watch (idleWatch): a read pending on it, so that a
// stream that ends while idle (the server's FIN, a reset, a lost
// connection) leaves the pool at once, and its FIN is answered at once (a
// draining server waits for that). A call that takes a watched stream
// takes the watch's read over as the first of its response. A stream used
// again within watchDelay, as under load, has no goroutine of its own.
type cstream struct {
	p   peer.ID
	str network.Stream
	// dead is set when the idle watch found the stream ended; eof when the
	// stream ended at the server's FIN (closed, not reset).
	dead, eof atomic.Bool
	// used says the stream has carried a whole exchange (a refusal at the
	// host's stream limits comes only on a new one). Only the owning call
	// touches it.
	used bool
	// acceptState is the current call's accept timeout (see exchange),
	// acceptTimer the stream's timer for it.
	acceptState atomic.Int32
	acceptTimer *time.Timer
	// reset resets the stream: what a call's context ends it with.
	reset func()
	// watchTimer starts the idle watch; watch is the watch pending
	// (guarded by the client's mu). takeover is the watch the owning call
	// took the stream with; first is the byte that watch read, the first
	// of the response, and pending says it is still to be read.
	watchTimer *time.Timer
	watchArmed bool // the watch timer is running (guarded by the client's mu)
	watch      *idleWatch
	takeover   *idleWatch
	first      [1]byte
	pending    bool
	// hdr is room for the length of the frame the owning call reads.
	hdr frame.Header
	// inPool and idleSince are guarded by the client's mu.
	inPool    bool
	idleSince time.Time
}

// Read reads the stream for the call that owns it: first the byte its idle
// watch read, if it took one over, then the stream.
func (cs *cstream) Read(b []byte) (int, error) {
	if w := cs.takeover; w != nil {
		cs.takeover = nil
		<-w.done // the call's end resets the stream, which ends the read
		if w.n == 0 {
			return 0, w.err
		}
		cs.first[0], cs.pending = w.b[0], true
	}
	if cs.pending && len(b) > 0 {
		cs.pending = false
		b[0] = cs.first[0]
		return 1, nil
	}
	return cs.str.Read(b)
}

// acceptExpired resets the stream of a call whose worker sent nothing
// within its accept timeout.
func (cs *cstream) acceptExpired() {
	if cs.acceptState.CompareAndSwap(acceptWaiting, acceptExpired) {
		_ = cs.str.Reset()
	}
}

// errNotTaken means a stream ended cleanly where the response should
// begin: the server closed it before it took the request, between
// requests or, a new one, as one of more streams waiting for a request
// than it keeps (see the protocol's comment). The server ends a stream
// that took a request with its response, or resets it.
var errNotTaken = fmt.Errorf("stream closed by the worker before the request was taken: %w", ErrTruncated)

// errRefused means the worker's host reset a new stream at its resource
// limits, before the work protocol saw it: the request was not taken.
var errRefused = errors.New("the worker's host refused the stream at its stream limits")

// refusedByLimits matches the reset of a stream the remote host's
// resource manager refused.
var refusedByLimits = &network.StreamError{ErrorCode: network.StreamResourceLimitExceeded, Remote: true}

// NewClient returns a client for the work protocol of network, sending
// from h.
func NewClient(h host.Host, network string, opts ...Option) (*Client, error) {
	if h == nil {
		return nil, errors.New("new work client: nil host")
	}
	if err := checkNetwork(network); err != nil {
		return nil, fmt.Errorf("new work client: %w", err)
	}
	cfg, err := apply(defaults(), opts)
	if err != nil {
		return nil, fmt.Errorf("new work client: %w", err)
	}
	return &Client{h: h, pid: ProtocolID(network), cfg: cfg, idle: map[peer.ID][]*cstream{}}, nil
}

// Close closes the client's idle streams; a stream in use is closed when
// its call ends. Calls after Close open a stream each. It does not close
// the host.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	if c.sweep != nil {
		c.sweep.Stop()
		c.sweep = nil
	}
	var all []*cstream
	for p, list := range c.idle {
		for _, cs := range list {
			cs.inPool = false
		}
		all = append(all, list...)
		delete(c.idle, p)
	}
	c.mu.Unlock()
	for _, cs := range all {
		_ = cs.str.Close()
	}
	return nil
}

// Do sends req to worker p and returns its response. The work's time
// budget is what is left of ctx's deadline (or the client's default
// timeout), lowered further by req.Timeout when that is shorter. An error
// means no response was received: it wraps ctx's error when ctx ended the
// call, ErrAcceptTimeout when the worker did not take the work within
// req.AcceptTimeout, and the protocol's sentinels for bad messages. A
// response, whatever its outcome, comes with a nil error.
//
// A request sent on a stream the worker closed before taking it (a kept
// one closed meanwhile by its idle timeout, a drain, its Close or its
// bounds on waiting streams; a new one closed by those bounds) is sent
// again once on a new stream: the worker did not take it. So is one on a
// new stream that the worker's host refused at its resource limits, after
// the idle streams to that worker are closed. Any other failure is not
// retried, as the work may have run.
func (c *Client) Do(ctx context.Context, p peer.ID, req Request) (Response, error) {
	if err := checkRequest(&req, c.cfg.maxPayload); err != nil {
		return Response{}, fmt.Errorf("work %s for %s: %w", req.Type, p, err)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.defaultTimeout)
		defer cancel()
		deadline, _ = ctx.Deadline()
	}
	left := time.Until(deadline)
	if left <= 0 || ctx.Err() != nil {
		err := contextError(ctx)
		if err == nil {
			// The deadline has passed but the context's timer has not
			// fired yet.
			err = context.DeadlineExceeded
		}
		return Response{}, fmt.Errorf("work %s for %s: %w", req.Type, p, err)
	}
	if req.Timeout <= 0 || req.Timeout > left {
		req.Timeout = left
	}

	for retry := false; ; retry = true {
		// The accept timeout runs from here. A stream kept open needs
		// nothing more; a call that opens one counts the opening too.
		var cs *cstream
		var acceptWithin time.Duration
		if !retry {
			cs = c.take(p)
		}
		if cs != nil {
			if req.AcceptTimeout > 0 && req.AcceptTimeout < left {
				acceptWithin = req.AcceptTimeout
			}
		} else {
			var err error
			if cs, acceptWithin, err = c.open(ctx, p, &req, deadline); err != nil {
				return Response{}, fmt.Errorf("work %s for %s: %w", req.Type, p, err)
			}
		}
		resp, err := c.call(ctx, cs, &req, acceptWithin)
		if err == nil {
			return resp, nil
		}
		if !retry && ctx.Err() == nil && (errors.Is(err, errNotTaken) || errors.Is(err, errRefused)) {
			if errors.Is(err, errRefused) {
				c.closeIdleTo(p) // they count against the worker's limits
			}
			continue
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", contextError(ctx), err)
		}
		return Response{}, fmt.Errorf("work %s for %s: %w", req.Type, p, err)
	}
}

// open opens a new stream to p for req and says within how long from now
// the worker must accept it (0: no accept timeout). Opening the stream
// over a connection counts towards the accept timeout (to a peer that
// stopped reading, it waits for stream credit). A dial, which NewStream makes when there is no connection, is
// the call's to bound, not the accept timeout's: then it runs from the
// open stream.
func (c *Client) open(ctx context.Context, p peer.ID, req *Request, deadline time.Time) (*cstream, time.Duration, error) {
	var acceptBy time.Time
	sctx := ctx
	if t := time.Now().Add(req.AcceptTimeout); req.AcceptTimeout > 0 && t.Before(deadline) && c.h.Network().Connectedness(p) == network.Connected {
		acceptBy = t
		var cancel context.CancelFunc
		sctx, cancel = context.WithDeadline(ctx, acceptBy)
		defer cancel()
	}
	cs, err := c.stream(sctx, p)
	if errors.Is(err, network.ErrResourceLimitExceeded) && c.closeIdleTo(p) > 0 {
		// This host's own limits: the streams kept idle to p count
		// against them.
		cs, err = c.stream(sctx, p)
	}
	if err != nil {
		switch {
		case ctx.Err() != nil:
			err = fmt.Errorf("%w (%v)", contextError(ctx), err)
		case sctx.Err() != nil:
			err = fmt.Errorf("%w: no stream within %s (%v)", ErrAcceptTimeout, req.AcceptTimeout, err)
		}
		return nil, 0, fmt.Errorf("open stream: %w", err)
	}
	if acceptBy.IsZero() {
		if t := time.Now().Add(req.AcceptTimeout); req.AcceptTimeout > 0 && t.Before(deadline) {
			return cs, req.AcceptTimeout, nil // NewStream dialed: the accept timeout runs from now
		}
		return cs, 0, nil
	}
	// What is left of it; a timeout that has run out fires at once.
	return cs, max(time.Until(acceptBy), time.Nanosecond), nil
}

// call makes one exchange on cs, which it owns, and then gives the stream
// back to the pool, or ends it when it broke. The worker must accept the
// work within acceptWithin, unless it is 0.
func (c *Client) call(ctx context.Context, cs *cstream, req *Request, acceptWithin time.Duration) (Response, error) {
	// A cancelled call resets the stream at once: the pending read fails,
	// and the server sees the reset and cancels the work.
	if cs.reset == nil {
		cs.reset = func() { _ = cs.str.Reset() } // made once per stream, not per call
	}
	// A request context of workmesh's (the dispatcher's) is watched at no
	// cost; any other, or one watched already, through the context
	// package.
	w, watched := ctx.(watcher)
	if watched {
		watched = w.Watch(cs.reset)
	}
	var stop func() bool
	if !watched {
		stop = context.AfterFunc(ctx, cs.reset)
	}
	resp, whole, err := c.exchange(ctx, cs, req, acceptWithin)
	var stopped bool
	if watched {
		stopped = w.Unwatch()
	} else {
		stopped = stop()
	}
	now := time.Now() // read once for the deadline and the pool
	if !stopped || err == nil && pastDeadline(ctx, now) {
		// Reset by the context, or its deadline passed and its timer is
		// late: the call ends with its context, as it would have had
		// the reset come a moment sooner (Do wraps the context's error).
		whole = false
		if err == nil {
			err = fmt.Errorf("the response came in as the call's deadline passed: %w", context.DeadlineExceeded)
		}
	}
	if err != nil || !whole || resp.Outcome == workers.Denied {
		// Broken, or refused as not allowed: the worker closes the
		// stream of a peer it denies, and would deny the next request.
		c.discard(cs)
		return resp, err
	}
	cs.used = true
	c.put(cs, now)
	return resp, nil
}

// watcher is a context that one caller at a time may watch for its end
// with no allocation (reqctx.Ctx): Watch has f run when it ends, and
// reports false when it has ended or is watched already; Unwatch undoes
// that, reporting false once f ran or runs.
type watcher interface {
	Watch(f func()) bool
	Unwatch() bool
}

// pastDeadline reports whether ctx's deadline has passed by now.
func pastDeadline(ctx context.Context, now time.Time) bool {
	dl, ok := ctx.Deadline()
	return ok && !now.Before(dl)
}

// stream opens a new stream to p.
func (c *Client) stream(ctx context.Context, p peer.ID) (*cstream, error) {
	str, err := c.h.NewStream(ctx, p, c.pid)
	if err != nil {
		return nil, err
	}
	c.opened.Add(1)
	return &cstream{p: p, str: str}, nil
}

// exchange writes the request and reads the response on cs; a worker
// that has not accepted the work within acceptWithin (if not 0) is given
// up. whole says the stream is fit to carry the next request.
func (c *Client) exchange(ctx context.Context, cs *cstream, req *Request, acceptWithin time.Duration) (_ Response, whole bool, _ error) {
	str := cs.str
	// Neither bound is a stream deadline. The call's deadline is the
	// context's, and Do resets the stream when it passes. The accept
	// timeout is a timer that resets the stream unless the first frame
	// came in before it: that ends a blocked write as well as a pending
	// read, on every transport (go-libp2p's mock network ignores stream
	// deadlines), and costs no deadline to set and lift on each call.
	// acceptState is waiting until the first frame is in (then in) or the
	// accept timeout passed first (then expired).
	acceptState := &cs.acceptState
	acceptState.Store(acceptWaiting)
	if acceptWithin > 0 {
		// The write is bounded too: to a peer that died without closing
		// its connection, writing the request can block (no stream
		// credit, no acknowledgements) until the whole deadline, which is
		// what the accept timeout exists to prevent. The timer is the
		// stream's, set again for each call; one that fired leaves the
		// stream out of the pool, so that it never fires into the next.
		if cs.acceptTimer == nil {
			cs.acceptTimer = time.AfterFunc(acceptWithin, cs.acceptExpired)
		} else {
			cs.acceptTimer.Reset(acceptWithin)
		}
		defer func() {
			if !cs.acceptTimer.Stop() {
				whole = false
			}
		}()
	}
	// An error after the timer fired is the accept timeout's reset.
	timedOut := func() bool { return acceptState.Load() == acceptExpired }

	if err := writeRequest(str, req); err != nil {
		if !cs.used && errors.Is(err, refusedByLimits) {
			return Response{}, false, fmt.Errorf("%w: %w", errRefused, err)
		}
		if !timedOut() {
			// The server may have closed the stream before it took the
			// request (between requests, or a new stream among the
			// streams waiting beyond its bounds): then its FIN is there
			// to read.
			if body, err := c.readFrame(cs); body == nil && errors.Is(err, io.EOF) && ctx.Err() == nil {
				return Response{}, false, errNotTaken
			}
		}
		if timedOut() {
			err = fmt.Errorf("%w: the request could not be sent within %s (%v)", ErrAcceptTimeout, req.AcceptTimeout, err)
		}
		return Response{}, false, fmt.Errorf("write request: %w", err)
	}

	for first := true; ; first = false {
		body, err := c.readFrame(cs)
		if err != nil {
			if first && !cs.used && errors.Is(err, refusedByLimits) {
				return Response{}, false, fmt.Errorf("%w: %w", errRefused, err)
			}
			if errors.Is(err, io.EOF) {
				if first {
					return Response{}, false, errNotTaken
				}
				err = fmt.Errorf("stream closed without a response: %w", ErrTruncated)
			}
			if first && timedOut() {
				err = fmt.Errorf("%w: nothing within %s (%v)", ErrAcceptTimeout, req.AcceptTimeout, err)
			}
			return Response{}, false, fmt.Errorf("read response: %w", err)
		}
		// The first frame stops the accept timer; one that lost the race
		// with it still counts when it is the whole response.
		expired := first && !acceptState.CompareAndSwap(acceptWaiting, acceptIn) && acceptState.Load() == acceptExpired
		resp, accepted, err := decodeServerFrameFor(body, c.cfg.maxPayload, req.ID)
		if err != nil {
			return Response{}, false, err
		}
		if accepted {
			if !first {
				return Response{}, false, fmt.Errorf("second accept frame: %w", ErrMalformed)
			}
			if expired {
				return Response{}, false, fmt.Errorf("read response: %w: accepted after %s, the stream already reset", ErrAcceptTimeout, req.AcceptTimeout)
			}
			continue
		}
		if resp.ID != req.ID {
			return Response{}, false, fmt.Errorf("response for request %q, want %q: %w", workers.Truncate(resp.ID, 32), req.ID, ErrMalformed)
		}
		return resp, !expired, nil
	}
}

// readFrame reads the next frame on cs for the call that owns it. The
// context's end and the accept timeout reset the stream, which ends the
// read with an error.
func (c *Client) readFrame(cs *cstream) ([]byte, error) {
	body, reserved, err := cs.hdr.ReadFast(cs, frameLimit(c.cfg.maxPayload), cs.str.Scope())
	if reserved > 0 {
		// The output becomes the caller's memory once returned.
		cs.str.Scope().ReleaseMemory(reserved)
	}
	if errors.Is(err, io.EOF) {
		cs.eof.Store(true)
	}
	return body, err
}

// The states of a call's accept timeout (see Client.exchange).
const (
	acceptWaiting int32 = iota
	acceptIn
	acceptExpired
)

// contextError returns ctx's cause when it has one worth more than its error.
func contextError(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil {
		return cause
	}
	return ctx.Err()
}
