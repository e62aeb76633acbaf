package selection

import (
	"fmt"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
)

// testConfig returns defaults with a generous budget so that tests see the
// walk, not the limits.
func testConfig() config.Config {
	cfg := config.Defaults()
	cfg.Worker.MaxRemoteWorkers = 10
	cfg.Worker.MaxRetries = 10
	return cfg
}

func labelBalancing(passOnError, includeDefault bool, order ...string) *config.LabelBalancingConfig {
	return &config.LabelBalancingConfig{Order: order, PassOnError: passOnError, IncludeDefault: &includeDefault}
}

func newSelector(t testing.TB, cfg config.Config, peers ...Peer) (*Selector, *testkit.FakeClock) {
	t.Helper()
	clk := testkit.NewFakeClock()
	s, err := New(cfg, WithClock(clk), WithSeed(1))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	s.SetPeers(peers)
	return s, clk
}

// peer returns a candidate for work type "sha256" with the given labels.
func peer(id string, labels ...string) Peer {
	return Peer{ID: id, Labels: labels, Types: []TypeInfo{{Name: "sha256"}}}
}

// headPeer returns a candidate for work type "block" with a head.
func headPeer(id string, head uint64, labels ...string) Peer {
	return Peer{ID: id, Labels: labels, Types: []TypeInfo{{Name: "block", Head: head, HasHead: true}}}
}

// walk drives a plan as a dispatcher would when every attempt fails with o:
// it returns the peers tried, in order.
func walk(t testing.TB, p *Plan, o Outcome) []string {
	t.Helper()
	var got []string
	for range 100 {
		pk, ok := p.Next()
		if !ok {
			return got
		}
		got = append(got, pk.Peer)
		if v := p.Report(pk, o, time.Millisecond); v != Retry {
			return got
		}
	}
	t.Fatalf("plan did not end after 100 attempts: %v", got)
	return nil
}

func mustNext(t testing.TB, p *Plan) Pick {
	t.Helper()
	pk, ok := p.Next()
	if !ok {
		t.Fatalf("Next: nothing offered: %s", p.Explain())
	}
	return pk
}

func eq(a, b []string) bool { return fmt.Sprint(a) == fmt.Sprint(b) }
