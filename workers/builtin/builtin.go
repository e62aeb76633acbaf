package builtin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/workmesh/workmesh/workers"
)

// MaxSleep is the longest duration the built-in sleep type accepts.
const MaxSleep = time.Minute

// traits of every built-in type: none has a side effect, and each gives
// the same result for the same payload.
var traits = workers.Traits{Idempotent: workers.Always, Deterministic: true}

// handler is a built-in work type: a function and its traits.
type handler struct {
	do func(ctx context.Context, payload []byte) workers.Result
}

// Do runs the work.
func (h handler) Do(ctx context.Context, payload []byte) workers.Result { return h.do(ctx, payload) }

// Traits says the work has no side effects and is deterministic.
func (handler) Traits() workers.Traits { return traits }

// builtins are the work types every workmesh binary can serve.
var builtins = map[string]workers.Handler{
	"echo":   handler{echo},
	"sha256": handler{sha256Hex},
	"sleep":  handler{sleep},
}

// Types returns the names of the built-in work types, sorted.
func Types() []string {
	names := make([]string, 0, len(builtins))
	for n := range builtins {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Catalog returns the traits of every built-in type, by name.
func Catalog() workers.Catalog {
	c := make(workers.Catalog, len(builtins))
	for name := range builtins {
		c[name] = traits
	}
	return c
}

// NewRegistry returns a registry holding the named built-in work types
// (config's work-types list), or all of them when types is empty.
func NewRegistry(types ...string) (*workers.Registry, error) {
	if len(types) == 0 {
		types = Types()
	}
	r := workers.NewRegistry()
	for _, t := range types {
		h, ok := builtins[t]
		if !ok {
			return nil, fmt.Errorf("work type %q: not a built-in type (built-in: %s): %w",
				t, strings.Join(Types(), ", "), workers.ErrInvalidType)
		}
		if err := r.Register(t, h); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// echo returns its payload.
func echo(_ context.Context, payload []byte) workers.Result { return workers.OK(payload) }

// sha256Hex returns the lower-case hex SHA-256 digest of its payload.
func sha256Hex(_ context.Context, payload []byte) workers.Result {
	sum := sha256.Sum256(payload)
	out := make([]byte, hex.EncodedLen(len(sum)))
	hex.Encode(out, sum[:])
	return workers.OK(out)
}

// sleep waits for the duration in its payload ("150ms"), up to MaxSleep,
// and stops early when ctx is done.
func sleep(ctx context.Context, payload []byte) workers.Result {
	const maxShown = 64
	s := strings.TrimSpace(string(payload))
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return workers.Fail(workers.PermanentError, "sleep: payload %q is not a duration like \"150ms\"", workers.Truncate(s, maxShown))
	case d < 0:
		return workers.Fail(workers.PermanentError, "sleep: duration %s is negative", d)
	case d > MaxSleep:
		return workers.Fail(workers.PermanentError, "sleep: duration %s is longer than the maximum %s", d, MaxSleep)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return workers.OK([]byte("slept " + d.String()))
	case <-ctx.Done():
		return workers.Fail(workers.RetryableError, "sleep cancelled: %v", context.Cause(ctx))
	}
}
