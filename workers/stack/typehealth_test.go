package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
)

// outable is a handler whose type can be out.
type outable struct{ out atomic.Bool }

func (o *outable) Do(context.Context, []byte) workers.Result { return workers.OK(nil) }
func (o *outable) TypeHealth() error {
	if o.out.Load() {
		return errors.New("service down")
	}
	return nil
}

// TestTypeHealthWithdrawsOnlyTheTypeThatIsOut: the advertised types
// follow each type's health, the others stay, and drain withdraws all
// for good.
func TestTypeHealthWithdrawsOnlyTheTypeThatIsOut(t *testing.T) {
	reg := workers.NewRegistry()
	enrich := &outable{}
	for name, h := range map[string]workers.Handler{"echo": workers.HandlerFunc(func(context.Context, []byte) workers.Result { return workers.OK(nil) }), "enrich": enrich} {
		if err := reg.Register(name, h); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var advertised [][]string
	set := func(types []string) error {
		mu.Lock()
		defer mu.Unlock()
		advertised = append(advertised, slices.Clone(types))
		return nil
	}
	last := func() []string {
		mu.Lock()
		defer mu.Unlock()
		if len(advertised) == 0 {
			return nil
		}
		return advertised[len(advertised)-1]
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	th := NewTypeHealth(reg, set, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); th.Run(ctx) }()
	defer func() { cancel(); <-done }()
	want := func(types ...string) func() error {
		return func() error {
			if got := last(); !slices.Equal(got, types) {
				return fmt.Errorf("advertised %v", got)
			}
			return nil
		}
	}
	testkit.WaitFor(t, 5*time.Second, "both types advertised", want("echo", "enrich"))
	enrich.out.Store(true)
	th.Wake()
	testkit.WaitFor(t, 5*time.Second, "enrich withdrawn, echo kept", want("echo"))
	enrich.out.Store(false)
	th.Wake()
	testkit.WaitFor(t, 5*time.Second, "enrich back", want("echo", "enrich"))
	if err := th.Drain(); err != nil {
		t.Fatal(err)
	}
	th.Wake()
	if got := last(); got != nil {
		t.Fatalf("after drain advertised %v, want nothing", got)
	}
	th.update()
	if got := last(); got != nil {
		t.Fatalf("a health look after drain advertised %v", got)
	}
}
