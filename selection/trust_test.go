package selection

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
)

// A peer outvoted dispute-threshold times within dispute-window is
// cordoned for dispute-cordon with the reason; disputes spread wider than
// the window are counted but do not cordon.
func TestLiveness_DisputeCordons(t *testing.T) {
	clk := testkit.NewFakeClock()
	l, err := NewLiveness(config.LivenessConfig{PollInterval: time.Second, PollFailureThreshold: 3, RedialBackoffMin: time.Second, RedialBackoffMax: time.Second}, clk)
	if err != nil {
		t.Fatal(err)
	}
	l.SetTrust(config.TrustConfig{DisputeThreshold: 3, DisputeWindow: time.Minute, DisputeCordon: 5 * time.Minute})
	l.handles([]string{"liar", "slow"})
	for range 4 {
		l.ReportDispute("slow")
		clk.Advance(31 * time.Second) // at most two within any minute
	}
	if l.State("slow") != StateAlive || l.Disputes("slow") != 4 {
		t.Fatalf("disputes spread out: state %s disputes %d, want alive with 4", l.State("slow"), l.Disputes("slow"))
	}
	l.ReportDispute("liar")
	l.ReportDispute("liar")
	if l.State("liar") != StateAlive || l.disputeCount("liar", clk.Now()) != 2 {
		t.Fatalf("two disputes: state %s, want alive", l.State("liar"))
	}
	if _, changed := l.ReportDispute("liar"); !changed || l.State("liar") != StateUnreachable {
		t.Fatalf("three disputes in a minute: state %s, want unreachable", l.State("liar"))
	}
	if r := l.Reason("liar"); !strings.HasPrefix(r, "disputed: 3 results outvoted") {
		t.Fatalf("reason %q, want it to say disputed", r)
	}
	clk.Advance(4 * time.Minute)
	for _, id := range l.Due() {
		if id == "liar" {
			t.Fatal("the liar is due for a redial within its cordon")
		}
	}
}

// A dispute cordon lasts its whole dispute-cordon, as a stall cordon does:
// a poll that was in flight when it began, a probe that news of the peer
// asked for, a failed redial and good polls during it do not bring the
// liar back sooner; once it has passed, good polls do.
func TestLiveness_DisputeCordonIsNotCutShortByPolls(t *testing.T) {
	clk := testkit.NewFakeClock()
	l, err := NewLiveness(config.LivenessConfig{
		PollInterval: time.Second, PollFailureThreshold: 3, PollSuccessThreshold: 2,
		RedialBackoffMin: time.Second, RedialBackoffMax: 8 * time.Second,
	}, clk)
	if err != nil {
		t.Fatal(err)
	}
	l.SetTrust(config.TrustConfig{DisputeThreshold: 2, DisputeWindow: time.Minute, DisputeCordon: 30 * time.Second})
	l.handles([]string{"liar"})
	l.Report("liar", true)
	inFlight, _ := l.PollFor("liar")
	l.ReportDispute("liar")
	if _, changed := l.ReportDispute("liar"); !changed {
		t.Fatal("two disputes did not cordon the liar")
	}
	start := clk.Now()
	l.ReportPoll(inFlight, true) // sent before the cordon, answered after
	news, _ := l.ProbeFor("liar")
	l.ReportPoll(news, true)
	l.Report("liar", false) // a redial that failed: no earlier redial
	for clk.Now().Sub(start) < 30*time.Second {
		if got := l.State("liar"); got != StateUnreachable {
			t.Fatalf("%s into a 30s dispute cordon: %s, want unreachable", clk.Now().Sub(start), got)
		}
		if slices.Contains(l.Due(), "liar") {
			t.Fatalf("due for a redial %s into a 30s dispute cordon", clk.Now().Sub(start))
		}
		l.Report("liar", true)
		clk.Advance(time.Second)
	}
	report(l, "liar", "sss")
	if got := l.State("liar"); got != StateAlive {
		t.Fatalf("after the cordon and good polls: %s, want alive", got)
	}
}

// rated makes every peer of s rated for sha256.
func rated(t *testing.T, s *Selector, ids ...string) {
	t.Helper()
	for _, id := range ids {
		for range s.cfg.Rating.MinSamples + 1 {
			p := s.Plan(Request{WorkType: "sha256", View: true})
			for {
				pk, ok := p.Next()
				if !ok {
					t.Fatalf("could not pick %s", id)
				}
				if pk.Peer == id {
					p.Report(pk, Success, time.Millisecond)
					break
				}
				p.Report(pk, Cancelled, 0)
			}
		}
	}
	s.Refresh()
}

// Unproven peers share at most explore-share of the first attempts while a
// proven peer is there; with none proven they take the work.
func TestPlan_ExploreBudget(t *testing.T) {
	cfg := testConfig()
	cfg.Trust.ExploreShare = 0.1
	var peers []Peer
	for _, id := range []string{"p1", "p2", "n1", "n2", "n3"} {
		peers = append(peers, peer(id))
	}
	s, _ := newSelector(t, cfg, peers...)
	// Nobody proven yet: the network works, on unproven peers.
	pk := mustNext(t, s.Plan(Request{WorkType: "sha256"}))
	if pk.Rated {
		t.Fatalf("first pick %+v rated with nobody rated", pk)
	}
	rated(t, s, "p1", "p2")
	explored := 0
	const n = 1000
	for range n {
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		if !pk.Rated {
			explored++
		}
		p.Report(pk, Cancelled, 0) // learns nothing: n1..n3 stay unproven
	}
	if explored == 0 || explored > n/10+1 {
		t.Fatalf("unproven peers took %d of %d first attempts, want 1 to %d", explored, n, n/10+1)
	}
	if sh := s.ExploreShare(); sh > 0.1 {
		t.Fatalf("ExploreShare %g, want at most 0.1", sh)
	}
}

// The plans of one verified request never share a peer, even picking at
// once.
func TestPlan_ClaimsKeepReplicasDistinct(t *testing.T) {
	s, _ := newSelector(t, testConfig(), peer("a"), peer("b"), peer("c"), peer("d"))
	for range 50 {
		var claims Claims
		var mu sync.Mutex
		seen := map[string]int{}
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				p := s.Plan(Request{WorkType: "sha256", Claims: &claims})
				pk, ok := p.Next()
				if ok {
					mu.Lock()
					seen[pk.Peer]++
					mu.Unlock()
					p.Report(pk, Cancelled, 0)
				}
			})
		}
		wg.Wait()
		if len(seen) != 4 {
			t.Fatalf("four replicas took %v, want four distinct peers", seen)
		}
	}
	var claims Claims
	p := s.Plan(Request{WorkType: "sha256", Claims: &claims})
	got := walk(t, p, RetryableError)
	q := s.Plan(Request{WorkType: "sha256", Claims: &claims})
	if pk, ok := q.Next(); ok {
		t.Fatalf("a second replica got %s after the first walked %v", pk.Peer, got)
	}
}
