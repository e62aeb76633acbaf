package api

import (
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/protocol"
)

// settings are what the options set. Each route's constructor starts
// from its own defaults; an option a route has no use for is left unread
// (each option's comment names the routes that read it).
type settings struct {
	log          logrus.FieldLogger
	maxBody      int64
	maxPayload   int
	maxTimeout   time.Duration
	maxBatch     int
	concurrency  int
	timeout      time.Duration
	workType     string
	statusWork   *Work
	statusServer *protocol.Server
}

// Option adjusts a route (Work, RPC, Operator).
type Option func(*settings) error

// apply returns defaults changed by opts; what names the route prefixes
// an option's error.
func apply(defaults settings, what string, opts []Option) (settings, error) {
	s := defaults
	for _, o := range opts {
		if err := o(&s); err != nil {
			return s, fmt.Errorf("%s: %w", what, err)
		}
	}
	return s, nil
}

// WithLogger sets the logger for failures to write a response (every
// route; default logrus's standard logger).
func WithLogger(log logrus.FieldLogger) Option {
	return func(s *settings) error {
		if log == nil {
			return errors.New("nil logger")
		}
		s.log = log
		return nil
	}
}

// WithMaxBody bounds a request body, in bytes (Work: default
// apiv1.DefaultMaxBody; RPC: DefaultRPCMaxBody).
func WithMaxBody(n int64) Option {
	return func(s *settings) error {
		if n < 64 {
			return fmt.Errorf("max body %d bytes: want at least 64", n)
		}
		s.maxBody = n
		return nil
	}
}

// WithMaxPayload bounds a request's decoded payload, in bytes (Work;
// default workers.DefaultMaxPayload, what the work protocol carries).
func WithMaxPayload(n int) Option {
	return func(s *settings) error {
		if n < 0 {
			return fmt.Errorf("max payload %d bytes: want 0 or more", n)
		}
		s.maxPayload = n
		return nil
	}
}

// WithMaxTimeout bounds the timeout a request may ask for (Work; default
// DefaultMaxTimeout).
func WithMaxTimeout(d time.Duration) Option {
	return func(s *settings) error {
		if d <= 0 {
			return fmt.Errorf("max timeout %s: want more than 0", d)
		}
		s.maxTimeout = d
		return nil
	}
}

// WithMaxBatch bounds the requests of one batch (RPC; default
// jsonrpc.DefaultMaxBatch).
func WithMaxBatch(n int) Option {
	return func(s *settings) error {
		if n < 1 {
			return fmt.Errorf("max batch %d: want at least 1", n)
		}
		s.maxBatch = n
		return nil
	}
}

// WithConcurrency sets how many requests of one batch are dispatched at
// once (RPC; default DefaultRPCConcurrency).
func WithConcurrency(n int) Option {
	return func(s *settings) error {
		if n < 1 {
			return fmt.Errorf("concurrency %d: want at least 1", n)
		}
		s.concurrency = n
		return nil
	}
}

// WithTimeout bounds each request's dispatch (RPC; default
// dispatch.DefaultRequestTimeout).
func WithTimeout(d time.Duration) Option {
	return func(s *settings) error {
		if d <= 0 {
			return fmt.Errorf("timeout %s: want more than 0", d)
		}
		s.timeout = d
		return nil
	}
}

// WithWorkType sets the work type requests are dispatched as (RPC;
// default jsonrpc.Type), for a network that names its chains' types
// apart.
func WithWorkType(name string) Option {
	return func(s *settings) error {
		if err := workers.ValidateTypeName(name); err != nil {
			return err
		}
		s.workType = name
		return nil
	}
}

// WithStatusWork adds the work route's request counters to GET
// /v1/status (Operator).
func WithStatusWork(w *Work) Option {
	return func(s *settings) error {
		if w == nil {
			return errors.New("nil work route")
		}
		s.statusWork = w
		return nil
	}
}

// WithStatusServer adds the work server's counters to GET /v1/status
// (Operator).
func WithStatusServer(srv *protocol.Server) Option {
	return func(s *settings) error {
		if srv == nil {
			return errors.New("nil work server")
		}
		s.statusServer = srv
		return nil
	}
}
