package workers

// Traits are what a work type promises about its work. They are declared
// by the handler (TraitsOf) and known by name for the types a binary has
// (Catalog), so that a node can hedge work it does not serve itself.
type Traits struct {
	// Idempotent reports whether the work for payload may run more than
	// once, on several workers at the same time, without harm: only such
	// work is hedged. Nil means never.
	Idempotent func(payload []byte) bool
	// Deterministic means the same payload always gives the same result,
	// so that results of different workers can be compared.
	Deterministic bool
}

// Always is an Idempotent for work that has no side effects whatever its
// payload.
func Always([]byte) bool { return true }

// TraitsReporter is implemented by a handler that declares its work
// type's Traits; a handler that does not promises nothing.
type TraitsReporter interface {
	Traits() Traits
}

// TraitsOf returns what h declares, or no promises at all.
func TraitsOf(h Handler) Traits {
	if tr, ok := h.(TraitsReporter); ok {
		return tr.Traits()
	}
	return Traits{}
}

// Catalog holds the Traits of work types by name.
type Catalog map[string]Traits

// Idempotent reports whether work of workType with payload may be hedged:
// the type is known and declares the work idempotent.
func (c Catalog) Idempotent(workType string, payload []byte) bool {
	t, ok := c[workType]
	return ok && t.Idempotent != nil && t.Idempotent(payload)
}

// Add sets the traits of every type in reg, from its handlers.
func (c Catalog) Add(reg *Registry) {
	for _, name := range reg.Names() {
		if h, ok := reg.Get(name); ok {
			c[name] = TraitsOf(h)
		}
	}
}

// HealthChecker is a part of the local worker that can tell it cannot work
// now: a work type whose upstream stopped answering, or fault injection.
// Healthy is called once per health ping and must be quick.
type HealthChecker interface {
	Healthy() error
}

// TypeHealthReporter is implemented by a handler whose work type can be
// out while the rest of the worker works: a local service whose health
// URL fails, a JSON-RPC upstream that stopped answering. While TypeHealth
// returns an error the node withdraws that work type alone from what it
// advertises (and the handler refuses its work); the node's other types
// and its health pings are not affected. It must be quick.
type TypeHealthReporter interface {
	TypeHealth() error
}
