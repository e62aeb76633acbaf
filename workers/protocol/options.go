package protocol

import (
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/sirupsen/logrus"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/pool"
)

// settings are what the options set, for a Server and a Client alike;
// each reads its own (each option's comment says whose it is).
type settings struct {
	maxPayload     int
	defaultTimeout time.Duration
	maxWorkTime    time.Duration
	readTimeout    time.Duration
	grace          time.Duration
	allow          func(peer.ID) bool
	limiter        PeerLimiter
	intercept      Interceptor
	observe        func(ServedRequest)
	log            logrus.FieldLogger
	incomplete     bounds
	waiting        bounds
	// idleTimeout is how long a server keeps a stream that waits for its
	// next request; maxIdle and clientIdle are a client's stream pool.
	idleTimeout time.Duration
	maxIdle     int
	clientIdle  time.Duration
}

// Option configures a Server or a Client.
type Option func(*settings) error

// defaults are the settings no option changed.
func defaults() settings {
	return settings{
		maxPayload:     workers.DefaultMaxPayload,
		defaultTimeout: DefaultClientTimeout,
		maxWorkTime:    DefaultMaxWorkTime,
		readTimeout:    DefaultRequestReadTimeout,
		grace:          DefaultGracePeriod,
		log:            logrus.StandardLogger(),
		incomplete:     bounds{total: DefaultIncompleteTotal, perPeer: DefaultIncompletePerPeer},
		waiting:        bounds{total: DefaultWaitingTotal, perPeer: DefaultWaitingPerPeer},
		idleTimeout:    DefaultServerIdleTimeout,
		maxIdle:        DefaultMaxIdleStreams,
		clientIdle:     DefaultClientIdleTimeout,
	}
}

// apply returns s changed by opts.
func apply(s settings, opts []Option) (settings, error) {
	for _, o := range opts {
		if err := o(&s); err != nil {
			return s, err
		}
	}
	return s, nil
}

// WithMaxPayload sets the largest request payload and response output a
// server handles, or a client sends and reads (default
// workers.DefaultMaxPayload). A server refuses larger requests before it
// reads them.
func WithMaxPayload(n int) Option {
	return func(c *settings) error {
		if n < 1 || n > maxMaxPayload {
			return fmt.Errorf("max payload %d: want 1 to %d bytes", n, maxMaxPayload)
		}
		c.maxPayload = n
		return nil
	}
}

// WithMaxWorkTime caps the time given to one request, and is the time
// given to a request that names none (default DefaultMaxWorkTime).
func WithMaxWorkTime(d time.Duration) Option {
	return func(c *settings) error {
		if d <= 0 {
			return fmt.Errorf("max work time %s: want a positive duration", d)
		}
		c.maxWorkTime = d
		return nil
	}
}

// WithRequestReadTimeout bounds the time to receive a request after the
// stream opened (default DefaultRequestReadTimeout), so a peer that sends
// half a message holds nothing for long.
func WithRequestReadTimeout(d time.Duration) Option {
	return func(c *settings) error {
		if d <= 0 {
			return fmt.Errorf("request read timeout %s: want a positive duration", d)
		}
		c.readTimeout = d
		return nil
	}
}

// WithGracePeriod sets how long the server waits for a result before it
// starts watching the client for cancellation and sends the accept frame
// the client asked for (default DefaultGracePeriod). The period used is
// never more than a quarter of the client's accept timeout. Work finished
// within it costs no extra goroutine and no extra frame; a client that
// gives up is noticed at most this late. Zero watches and accepts at once.
func WithGracePeriod(d time.Duration) Option {
	return func(c *settings) error {
		if d < 0 {
			return fmt.Errorf("grace period %s: want zero or more", d)
		}
		c.grace = d
		return nil
	}
}

// WithAllow sets the access check: a request from a peer for which allow
// returns false is answered Denied without running. Nil allows everyone.
func WithAllow(allow func(peer.ID) bool) Option {
	return func(c *settings) error { c.allow = allow; return nil }
}

// PeerLimiter bounds what each peer may have the server do: Acquire
// admits a request of peer p before it reaches the local worker (or
// returns the answer that refuses it, and false), and Release is called
// once for every admitted request when it has ended.
type PeerLimiter interface {
	Acquire(p peer.ID) (workers.Result, bool)
	Release(p peer.ID)
}

// WithPeerLimiter makes the server ask l before it runs a peer's request.
// Nil means no limit.
func WithPeerLimiter(l PeerLimiter) Option {
	return func(c *settings) error { c.limiter = l; return nil }
}

// Interceptor may act on a request the local worker admitted, before its
// handler runs: Intercept returns the request's result and true when it
// acted, in which case it released the ticket (pool.RunInline after
// cancelling it); false lets the request run. An interceptor that wants
// the request dropped without an answer cancels the ticket with a cause
// that wraps workers.ErrDropped.
type Interceptor interface {
	Intercept(p *pool.Pool, t *pool.Ticket) (workers.Result, bool)
}

// WithInterceptor makes the server pass every admitted request through i
// (fault injection does). A request the local worker is too busy to admit
// is answered Busy whatever i would do. Nil means none.
func WithInterceptor(i Interceptor) Option {
	return func(c *settings) error { c.intercept = i; return nil }
}

// WithObserver sets a function called once for every request the server
// handled, after it ended. It runs on the stream's goroutine: keep it short.
func WithObserver(observe func(ServedRequest)) Option {
	return func(c *settings) error { c.observe = observe; return nil }
}

// WithLogger sets the logger (default logrus's standard logger).
func WithLogger(log logrus.FieldLogger) Option {
	return func(c *settings) error {
		if log == nil {
			return errors.New("nil logger")
		}
		c.log = log
		return nil
	}
}

// WithDefaultTimeout bounds a client's calls whose context has no deadline (default
// DefaultClientTimeout), so that no call waits forever.
func WithDefaultTimeout(d time.Duration) Option {
	return func(c *settings) error {
		if d <= 0 {
			return fmt.Errorf("default timeout %s: want a positive duration", d)
		}
		c.defaultTimeout = d
		return nil
	}
}

// WithIdleTimeout sets how long a server keeps a stream open that waits
// for its next request (default DefaultServerIdleTimeout); then it closes
// the stream, which tells the client that no request it sent meanwhile
// was taken. It is longer than a client's, so the client closes first. A
// server option.
func WithIdleTimeout(d time.Duration) Option {
	return func(c *settings) error {
		if d <= 0 {
			return fmt.Errorf("idle timeout %s: want a positive duration", d)
		}
		c.idleTimeout = d
		return nil
	}
}

// WithStreamPool sets a client's pool of work streams: it keeps up to
// maxIdle streams per peer open between calls, each for at most idle
// (defaults DefaultMaxIdleStreams and DefaultClientIdleTimeout). A call
// takes an idle stream, or opens one when all are busy; a stream beyond
// maxIdle is closed after its call. maxIdle 0 opens a stream for every
// call, as a client that keeps none. A client option.
func WithStreamPool(maxIdle int, idle time.Duration) Option {
	return func(c *settings) error {
		if maxIdle < 0 || maxIdle > maxMaxIdle {
			return fmt.Errorf("idle streams per peer %d: want 0 to %d", maxIdle, maxMaxIdle)
		}
		if idle <= 0 {
			return fmt.Errorf("stream idle timeout %s: want a positive duration", idle)
		}
		c.maxIdle, c.clientIdle = maxIdle, idle
		return nil
	}
}
