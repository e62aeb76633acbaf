package stack

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/workers"
)

// TypeHealthInterval is how often TypeHealth looks at the health of the
// work types that report one, besides the wake-ups their changes send.
const TypeHealthInterval = time.Second

// TypeHealth keeps the work types a node advertises in step with the
// health of each: a type whose handler is a workers.TypeHealthReporter
// that reports an error is withdrawn (the node re-announces its record
// without it) and added back once it is healthy again. The node's other
// types, and its health pings, are not affected: a worker whose one
// service is down stays in the pool for the rest. Once drained, it
// advertises nothing, whatever the health.
type TypeHealth struct {
	reg *workers.Registry
	set func([]string) error
	log logrus.FieldLogger

	wake chan struct{}

	mu      sync.Mutex
	drained bool
	last    []string // advertised last; nil before the first set
	out     map[string]string
}

// NewTypeHealth returns the health keeper of the types of reg; set
// changes what the node advertises (node.Node.SetWorkTypes).
func NewTypeHealth(reg *workers.Registry, set func([]string) error, log logrus.FieldLogger) *TypeHealth {
	return &TypeHealth{reg: reg, set: set, log: log, wake: make(chan struct{}, 1), out: map[string]string{}}
}

// Healthy returns the types of reg that are healthy now, sorted: the
// types to advertise.
func (h *TypeHealth) Healthy() []string {
	var ok []string
	for _, name := range h.reg.Names() {
		if hd, found := h.reg.Get(name); found {
			if r, is := hd.(workers.TypeHealthReporter); is && r.TypeHealth() != nil {
				continue
			}
		}
		ok = append(ok, name)
	}
	return ok
}

// Wake asks for a look at once (a type's health changed).
func (h *TypeHealth) Wake() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Run keeps the advertised types in step until ctx ends.
func (h *TypeHealth) Run(ctx context.Context) {
	t := time.NewTicker(TypeHealthInterval)
	defer t.Stop()
	for {
		h.update()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.wake:
		}
	}
}

// update advertises the healthy types when they changed.
func (h *TypeHealth) update() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.drained {
		return
	}
	for _, name := range h.reg.Names() {
		hd, _ := h.reg.Get(name)
		r, is := hd.(workers.TypeHealthReporter)
		if !is {
			continue
		}
		err := r.TypeHealth()
		switch {
		case err != nil && h.out[name] == "":
			h.out[name] = err.Error()
			h.log.WithField("work_type", name).WithError(err).Warn("work type out: withdrawn from what this node advertises")
		case err == nil && h.out[name] != "":
			delete(h.out, name)
			h.log.WithField("work_type", name).Info("work type healthy again: advertised")
		}
	}
	types := h.Healthy()
	if h.last != nil && slices.Equal(types, h.last) {
		return
	}
	if types == nil {
		types = []string{}
	}
	if err := h.set(types); err != nil {
		h.log.WithError(err).Warn("could not re-announce the work types")
		return
	}
	h.last = types
}

// Drain withdraws every type, for good: the node is stopping.
func (h *TypeHealth) Drain() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.drained = true
	return h.set(nil)
}
