package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/sec"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/quic-go/quic-go"

	"github.com/workmesh/workmesh/workers/protocol"
)

// Short causes of a failed attempt or poll, as the attempt's error, the
// summary line and the logs show them.
const (
	// causeConnLost: the connection or the stream to the worker broke
	// (the worker died, restarted, or reset the stream).
	causeConnLost = "connection lost"
	// causeUnreachable prefixes the cause of a dial that failed.
	causeUnreachable = "unreachable"
)

// dialError is a dial of a peer that failed within the dispatcher's
// connect-timeout: it marks the error as a dial's, whatever libp2p
// returned, and keeps the bound for the cause.
type dialError struct {
	timeout time.Duration
	err     error
}

func (e *dialError) Error() string {
	return fmt.Sprintf("connect within %s: %v", e.timeout, e.err)
}

func (e *dialError) Unwrap() error { return e.err }

// attemptCause turns the error of a remote attempt or health poll, a chain
// of libp2p, quic-go and work protocol errors, into one short line for a
// person: "connection lost" for a broken connection or stream,
// "unreachable: <cause>" for a dial that failed, the protocol's own
// sentinel for what the work protocol decided. It reads typed errors only;
// the text of the last resort is the innermost error's, on one line.
func attemptCause(err error) string {
	if err == nil {
		return ""
	}
	var de *dialError
	var sde *swarm.DialError
	switch {
	case errors.As(err, &de):
		return causeUnreachable + ": " + dialCause(de.err, de.timeout)
	case errors.As(err, &sde), errors.Is(err, swarm.ErrDialBackoff), errors.Is(err, swarm.ErrNoAddresses),
		errors.Is(err, swarm.ErrNoGoodAddresses):
		// A dial made below the dispatcher (NewStream dials when there
		// is no connection).
		return causeUnreachable + ": " + dialCause(err, 0)
	case errors.Is(err, protocol.ErrAcceptTimeout):
		return protocol.ErrAcceptTimeout.Error()
	case errors.Is(err, protocol.ErrTruncated):
		return "the worker closed the stream without an answer"
	case errors.Is(err, protocol.ErrMalformed), errors.Is(err, protocol.ErrFrameTooLarge):
		return "malformed answer from the worker"
	case errors.Is(err, context.DeadlineExceeded):
		return "no answer in time"
	case connLost(err):
		return causeConnLost
	}
	return oneLine(innermost(err).Error())
}

// connLost reports whether err says the connection or stream to the peer
// broke: a reset stream (libp2p's ErrReset, which its StreamError and
// ConnError unwrap to), a QUIC connection closed by the application or
// gone idle, a QUIC stream cancelled, a stateless reset, or a closed
// network connection.
func connLost(err error) bool {
	var appErr *quic.ApplicationError
	var streamErr *quic.StreamError
	var idleErr *quic.IdleTimeoutError
	var resetErr *quic.StatelessResetError
	return errors.Is(err, network.ErrReset) || errors.As(err, &appErr) || errors.As(err, &streamErr) ||
		errors.As(err, &idleErr) || errors.As(err, &resetErr) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.ErrUnexpectedEOF)
}

// dialCause says in a few words why a dial failed; timeout is the bound
// it ran within (0: unknown).
func dialCause(err error, timeout time.Duration) string {
	var hsErr *quic.HandshakeTimeoutError
	var qtErr *quic.TransportError
	var idErr sec.ErrPeerIDMismatch
	switch {
	case errors.Is(err, swarm.ErrDialBackoff):
		return "a dial just failed, not dialing again yet"
	case errors.Is(err, swarm.ErrNoAddresses), errors.Is(err, swarm.ErrNoGoodAddresses):
		return "no address known to dial"
	case errors.As(err, &idErr):
		return "another peer answers at its address"
	case errors.As(err, &qtErr) && qtErr.ErrorCode == quic.ConnectionRefused, errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &hsErr):
		if timeout > 0 {
			return fmt.Sprintf("no answer within %s", timeout)
		}
		return "no answer in time"
	case errors.Is(err, context.Canceled):
		return "dial cancelled"
	}
	var sde *swarm.DialError
	if errors.As(err, &sde) {
		// The first address's error says most; the others are alike.
		if len(sde.DialErrors) > 0 {
			return dialCause(sde.DialErrors[0].Cause, timeout)
		}
		if sde.Cause != nil {
			return oneLine(innermost(sde.Cause).Error())
		}
	}
	return oneLine(innermost(err).Error())
}

// innermost follows the chain of single wrappers down to the first error
// that wraps nothing or several (whose own text then says the most).
func innermost(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// oneLine joins the lines of s with "; ", so that an error stays one line
// in the summary and the logs.
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	for i := range fields {
		fields[i] = strings.TrimSpace(fields[i])
	}
	return strings.Join(fields, "; ")
}
