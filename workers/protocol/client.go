package protocol

import (
	"context"
	"errors"
	"fmt"
	"io"
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
// for concurrent use; every call uses a stream of its own.
type Client struct {
	h   host.Host
	pid protocol.ID
	cfg settings
}

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
	return &Client{h: h, pid: ProtocolID(network), cfg: cfg}, nil
}

// Do sends req to worker p and returns its response. The work's time
// budget is what is left of ctx's deadline (or the client's default
// timeout), lowered further by req.Timeout when that is shorter. An error
// means no response was received: it wraps ctx's error when ctx ended the
// call, ErrAcceptTimeout when the worker did not take the work within
// req.AcceptTimeout, and the protocol's sentinels for bad messages. A
// response, whatever its outcome, comes with a nil error.
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

	// The accept timeout runs from here: opening the stream over a
	// connection counts too (to a peer that stopped reading, it waits for
	// stream credit). A dial, which NewStream makes when there is no
	// connection, is the call's to bound, not the accept timeout's.
	var acceptBy time.Time
	sctx := ctx
	if req.AcceptTimeout > 0 && req.AcceptTimeout < left && c.h.Network().Connectedness(p) == network.Connected {
		acceptBy = time.Now().Add(req.AcceptTimeout)
		var cancel context.CancelFunc
		sctx, cancel = context.WithDeadline(ctx, acceptBy)
		defer cancel()
	}
	str, err := c.h.NewStream(sctx, p, c.pid)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			err = fmt.Errorf("%w (%v)", contextError(ctx), err)
		case sctx.Err() != nil:
			err = fmt.Errorf("%w: no stream within %s (%v)", ErrAcceptTimeout, req.AcceptTimeout, err)
		}
		return Response{}, fmt.Errorf("work %s for %s: open stream: %w", req.Type, p, err)
	}
	if t := time.Now().Add(req.AcceptTimeout); acceptBy.IsZero() && req.AcceptTimeout > 0 && t.Before(deadline) {
		acceptBy = t // NewStream dialed: the accept timeout runs from now
	}
	// A cancelled call resets the stream at once: the pending read fails
	// here, and the server sees the reset and cancels the work.
	stop := context.AfterFunc(ctx, func() { _ = str.Reset() })
	defer stop()

	resp, err := c.exchange(str, &req, acceptBy)
	if err != nil {
		_ = str.Reset()
		switch {
		case ctx.Err() != nil:
			err = fmt.Errorf("%w (%v)", contextError(ctx), err)
		}
		return Response{}, fmt.Errorf("work %s for %s: %w", req.Type, p, err)
	}
	_ = str.Close()
	return resp, nil
}

// exchange writes the request and reads the response on str; a worker
// that has not accepted the work by acceptBy (if set) is given up.
func (c *Client) exchange(str network.Stream, req *Request, acceptBy time.Time) (Response, error) {
	// Neither bound is a stream deadline. The call's deadline is the
	// context's, and Do resets the stream when it passes. The accept
	// timeout is a timer that resets the stream unless the first frame
	// came in before it: that ends a blocked write as well as a pending
	// read, on every transport (go-libp2p's mock network ignores stream
	// deadlines), and costs no deadline to set and lift on each call.
	// acceptState is waiting until the first frame is in (then in) or the
	// accept timeout passed first (then expired).
	var acceptState atomic.Int32
	if !acceptBy.IsZero() {
		// The write is bounded too: to a peer that died without closing
		// its connection, writing the request can block (no stream
		// credit, no acknowledgements) until the whole deadline, which is
		// what the accept timeout exists to prevent.
		timer := time.AfterFunc(time.Until(acceptBy), func() {
			if acceptState.CompareAndSwap(acceptWaiting, acceptExpired) {
				_ = str.Reset()
			}
		})
		defer timer.Stop()
	}
	// An error after the timer fired is the accept timeout's reset.
	timedOut := func() bool { return acceptState.Load() == acceptExpired }

	buf := getBuf()
	*buf = appendRequest((*buf)[:0], req)
	_, err := str.Write(*buf)
	putBuf(buf)
	if err != nil {
		if timedOut() {
			err = fmt.Errorf("%w: the request could not be sent within %s (%v)", ErrAcceptTimeout, req.AcceptTimeout, err)
		}
		return Response{}, fmt.Errorf("write request: %w", err)
	}

	limit := frameLimit(c.cfg.maxPayload)
	for first := true; ; first = false {
		body, reserved, err := frame.Read(str, limit, str.Scope())
		if reserved > 0 {
			// The output becomes the caller's memory once returned.
			str.Scope().ReleaseMemory(reserved)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("stream closed without a response: %w", ErrTruncated)
			}
			if first && timedOut() {
				err = fmt.Errorf("%w: nothing within %s (%v)", ErrAcceptTimeout, req.AcceptTimeout, err)
			}
			return Response{}, fmt.Errorf("read response: %w", err)
		}
		// The first frame stops the accept timer; one that lost the race
		// with it still counts when it is the whole response.
		expired := first && !acceptState.CompareAndSwap(acceptWaiting, acceptIn) && acceptState.Load() == acceptExpired
		resp, accepted, err := decodeServerFrame(body, c.cfg.maxPayload)
		if err != nil {
			return Response{}, err
		}
		if accepted {
			if !first {
				return Response{}, fmt.Errorf("second accept frame: %w", ErrMalformed)
			}
			if expired {
				return Response{}, fmt.Errorf("read response: %w: accepted after %s, the stream already reset", ErrAcceptTimeout, req.AcceptTimeout)
			}
			continue
		}
		if resp.ID != req.ID {
			return Response{}, fmt.Errorf("response for request %q, want %q: %w", workers.Truncate(resp.ID, 32), req.ID, ErrMalformed)
		}
		return resp, nil
	}
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
