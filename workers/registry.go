package workers

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
)

// MaxTypeLen is the longest work type name, in bytes. Type names travel in
// every request and in advertisements, so they stay short.
const MaxTypeLen = 64

// Handler runs one work type. Do must honour ctx: when it is done, return
// promptly (RetryableError is the usual answer). Do may be called
// concurrently. The payload must not be modified or kept after Do returns.
type Handler interface {
	Do(ctx context.Context, payload []byte) Result
}

// HeadReporter is implemented by handlers of work types whose data has
// positions (blocks, offsets): Head returns the highest position this
// worker can serve, and false when it does not know. It feeds the
// beyond-head rule through NodeData.
type HeadReporter interface {
	Head() (uint64, bool)
}

// HandlerFunc adapts a function to the Handler interface.
type HandlerFunc func(ctx context.Context, payload []byte) Result

// Do calls f(ctx, payload).
func (f HandlerFunc) Do(ctx context.Context, payload []byte) Result { return f(ctx, payload) }

// Registry maps work type names to their handlers. It is safe for
// concurrent use; handlers are normally all registered at start-up.
type Registry struct {
	mu       sync.RWMutex
	handlers map[string]Handler
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{handlers: make(map[string]Handler)}
}

// ValidateTypeName checks that name can be used as a work type: 1 to
// MaxTypeLen bytes of ASCII letters, digits, '.', '_' and '-'. The name
// appears in protocol messages, provider keys and flags, so nothing else is
// allowed.
func ValidateTypeName(name string) error {
	if name == "" {
		return fmt.Errorf("work type name is empty: %w", ErrInvalidType)
	}
	if len(name) > MaxTypeLen {
		return fmt.Errorf("work type name of %d bytes is longer than %d: %w", len(name), MaxTypeLen, ErrInvalidType)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("work type %q: character %q not allowed: %w", name, c, ErrInvalidType)
		}
	}
	return nil
}

// Register adds a handler under name. It refuses invalid names, a nil
// handler and a name already taken.
func (r *Registry) Register(name string, h Handler) error {
	if err := ValidateTypeName(name); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	if h == nil {
		return fmt.Errorf("register work type %q: nil handler", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.handlers[name]; ok {
		return fmt.Errorf("register work type %q: %w", name, ErrDuplicateType)
	}
	r.handlers[name] = h
	return nil
}

// Get returns the handler registered under name.
func (r *Registry) Get(name string) (Handler, bool) {
	r.mu.RLock()
	h, ok := r.handlers[name]
	r.mu.RUnlock()
	return h, ok
}

// Names returns the registered work types, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	names := make([]string, 0, len(r.handlers))
	for n := range r.handlers {
		names = append(names, n)
	}
	r.mu.RUnlock()
	slices.Sort(names)
	return names
}

// Head returns the head the named type's handler reports, and false when
// the type is unknown, has no positions or does not know its head.
func (r *Registry) Head(name string) (uint64, bool) {
	h, ok := r.Get(name)
	if !ok {
		return 0, false
	}
	hr, ok := h.(HeadReporter)
	if !ok {
		return 0, false
	}
	return hr.Head()
}

// Unsupported is the answer for a work type this registry does not hold.
func (r *Registry) Unsupported(name string) Result {
	known := r.Names()
	list := "none"
	if len(known) > 0 {
		list = strings.Join(known, ", ")
	}
	return Fail(Unsupported, "work type %q is not served here (served: %s)", Truncate(name, MaxTypeLen), list)
}

// Do runs the handler for name. An unknown name gives Unsupported with the
// list of served types; a panic in the handler is recovered into a
// PermanentError; a result without a valid outcome is reported as a
// PermanentError too, so a broken handler can never look like a success.
func (r *Registry) Do(ctx context.Context, name string, payload []byte) Result {
	h, ok := r.Get(name)
	if !ok {
		return r.Unsupported(name)
	}
	return Run(ctx, name, h, payload, nil)
}

// Run calls h and turns a panic into a PermanentError and a result
// without a valid outcome into one too; onPanic, when set, receives the
// panic value and stack for logging. name is the work type, for messages.
func Run(ctx context.Context, name string, h Handler, payload []byte, onPanic func(v any, stack []byte)) (res Result) {
	defer func() {
		if v := recover(); v != nil {
			res = Fail(PermanentError, "handler %s panicked: %v", name, v)
			if onPanic != nil {
				onPanic(v, debug.Stack())
			}
		}
	}()
	res = h.Do(ctx, payload)
	if !res.Outcome.Valid() {
		return Fail(PermanentError, "handler %s returned an invalid outcome %v", name, res.Outcome)
	}
	return res
}
