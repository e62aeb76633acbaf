package custom

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
)

// Type is one custom work type: a workers.Handler that declares its
// Traits and may report its health. Close releases what it holds (the
// health poller, idle connections).
type Type interface {
	workers.Handler
	workers.TraitsReporter
	workers.TypeHealthReporter
	// Addr is the host:port of the type's local service, "" for a command.
	Addr() string
	// Run runs the type's background work (health polls) until ctx ends.
	Run(ctx context.Context)
	Close()
}

// Options bound every custom type of a node.
type Options struct {
	// MaxOutput is the largest result, in bytes, when a type sets no
	// max-output of its own: the payload limit of the work protocol.
	MaxOutput int
	// LocalConcurrency is how many runs the node's local worker makes at
	// once (local-concurrency); 0 when not known.
	LocalConcurrency int
}

// New builds the custom types of cfg, by name. A type that cannot be
// built (a program not found, a bad URL) stops the start with an error
// naming it.
func New(types map[string]config.CustomTypeConfig, o Options) (map[string]Type, error) {
	if o.MaxOutput <= 0 {
		o.MaxOutput = workers.DefaultMaxPayload
	}
	names := make([]string, 0, len(types))
	for name := range types {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make(map[string]Type, len(types))
	closeAll := func() {
		for _, t := range out {
			t.Close()
		}
	}
	for _, name := range names {
		t, err := newType(name, types[name], o)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("custom-types %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

func newType(name string, c config.CustomTypeConfig, o Options) (Type, error) {
	switch {
	case len(c.Command) > 0 && c.URL != "":
		return nil, errors.New("has both a command and a url")
	case len(c.Command) > 0:
		return NewCommand(name, c, o)
	case c.URL != "":
		return NewService(name, c, o)
	}
	return nil, errors.New("needs a command or a url")
}

// common is what both kinds of type share: name, traits, bounds.
type common struct {
	name      string
	traits    workers.Traits
	timeout   time.Duration
	maxOutput int
	slots     chan struct{} // nil: no concurrency bound of the type's own
}

// TraitsOf returns the traits c declares: a node that does not serve the
// type itself (a gateway) knows from them whether it may hedge it.
func TraitsOf(c config.CustomTypeConfig) workers.Traits {
	var t workers.Traits
	if c.Idempotent {
		t.Idempotent = workers.Always
	}
	t.Deterministic = c.Deterministic
	return t
}

func newCommon(name string, c config.CustomTypeConfig, o Options) common {
	cm := common{name: name, timeout: c.Timeout, maxOutput: c.MaxOutput}
	if cm.timeout <= 0 {
		cm.timeout = config.DefaultCustomTimeout
	}
	if cm.maxOutput <= 0 || cm.maxOutput > o.MaxOutput {
		cm.maxOutput = o.MaxOutput
	}
	cm.traits = TraitsOf(c)
	if c.Concurrency > 0 {
		cm.slots = make(chan struct{}, c.Concurrency)
	}
	return cm
}

// Traits returns what the type declares: idempotent (hedged and retried
// only then) and deterministic.
func (c *common) Traits() workers.Traits { return c.traits }

// acquire takes one of the type's run slots, or reports false when all
// are taken (the worker answers busy).
func (c *common) acquire() bool {
	if c.slots == nil {
		return true
	}
	select {
	case c.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

func (c *common) release() {
	if c.slots != nil {
		<-c.slots
	}
}

// busy is the answer when every slot of the type is taken.
func (c *common) busy() workers.Result {
	return workers.Fail(workers.Busy, "work type %s runs %d at once (concurrency), all taken", c.name, cap(c.slots))
}
