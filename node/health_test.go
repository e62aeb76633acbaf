package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// sickState is a LocalState with a health check whose answer is whatever
// err holds.
type sickState struct {
	stubState
	err atomic.Pointer[error]
}

func (s *sickState) Health() error {
	if p := s.err.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *sickState) set(err error) { s.err.Store(&err) }

// A node whose worker says it cannot work answers its pings with the reason,
// and Ping turns that into ErrUnhealthy; a dropped ping is an error too, and
// the node answers normally again once its worker is well.
func TestHealthPingCarriesWorkerHealth(t *testing.T) {
	st := &sickState{}
	a := startTestNode(t, testConfig(t), WithLocalState(st), WithHealthCheck(func(peer.ID) error { return st.Health() }))
	b := startTestNode(t, testConfig(t))
	connect(t, b, a)
	ping := func() (HealthAnswer, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, ans, err := b.Ping(ctx, a.ID())
		return ans, err
	}

	if _, err := ping(); err != nil {
		t.Fatalf("healthy worker: %v", err)
	}

	st.set(errors.New("work type jsonrpc: upstream down"))
	ans, err := ping()
	if !errors.Is(err, ErrUnhealthy) || !strings.Contains(err.Error(), "upstream down") {
		t.Fatalf("sick worker: err %v, want ErrUnhealthy naming the reason", err)
	}
	if ans.Sequence == 0 || ans.Load.InFlight != 2 {
		t.Errorf("a sick worker's answer still carries sequence and load: %+v", ans)
	}

	st.set(fmt.Errorf("%w: on purpose", ErrHealthDropped))
	if _, err := ping(); err == nil || errors.Is(err, ErrUnhealthy) {
		t.Fatalf("dropped ping: err %v, want a failed exchange", err)
	}

	// A peer's words about itself are bounded before they reach an error.
	st.set(errors.New(strings.Repeat("x", 10_000)))
	if _, err := ping(); !errors.Is(err, ErrUnhealthy) || len(err.Error()) > 2*maxUnhealthyText+200 {
		t.Fatalf("long reason: %d bytes of error", len(err.Error()))
	}

	st.set(nil)
	if _, err := ping(); err != nil {
		t.Fatalf("recovered worker: %v", err)
	}
}
