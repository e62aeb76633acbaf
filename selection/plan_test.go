package selection

import (
	"sync"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
)

func TestPlan_ExplainsWhyNothingIsLeft(t *testing.T) {
	cfg := testConfig()
	cfg.Liveness.PollFailureThreshold = 1
	s, _ := newSelector(t, cfg,
		peer("d1", "archive"), peer("d2", "archive"), // will be unreachable
		peer("n1"), // lacks archive
		peer("t1", "archive"), peer("t2", "archive"), peer("t3", "archive"))
	s.Liveness().Report("d1", false)
	s.Liveness().Report("d2", false)
	p := s.Plan(Request{WorkType: "sha256", Labels: []string{"archive"}})
	if got := walk(t, p, RetryableError); len(got) != 3 {
		t.Fatalf("tried %v, want the three reachable archive peers", got)
	}
	want := "6 candidates for work type sha256: 2 unreachable, 1 lacks label archive, 3 already tried"
	if got := p.Explain().String(); got != want {
		t.Fatalf("explanation:\n got %q\nwant %q", got, want)
	}

	// The budget is a reason too.
	cfg.Worker.MaxRemoteWorkers = 1
	s, _ = newSelector(t, cfg, peer("a"), peer("b"))
	p = s.Plan(Request{WorkType: "sha256"})
	if v := p.Report(mustNext(t, p), RetryableError, time.Millisecond); v != Exhausted {
		t.Fatalf("verdict %s, want exhausted with max-remote-workers 1", v)
	}
	// The dispatcher stops at the exhausted verdict: the explanation
	// names the limit without another Next.
	want = "2 candidates for work type sha256: 1 already tried, 1 not tried (max-remote-workers 1 reached)"
	if got := p.Explain().String(); got != want {
		t.Fatalf("explanation after the verdict:\n got %q\nwant %q", got, want)
	}
	if _, ok := p.Next(); ok {
		t.Fatal("max-remote-workers 1: a second peer was offered")
	}
	if got := p.Explain().String(); got != want {
		t.Fatalf("explanation:\n got %q\nwant %q", got, want)
	}

	// No peer of the type at all.
	if got := s.Plan(Request{WorkType: "nope"}).Explain().String(); got != "no peer advertises work type nope" {
		t.Fatalf("explanation %q", got)
	}
}

func TestPlan_RetryBudget(t *testing.T) {
	cfg := testConfig()
	cfg.Worker.MaxRetries = 2
	s, _ := newSelector(t, cfg, peer("a"), peer("b"), peer("c"), peer("d"))
	got := walk(t, s.Plan(Request{WorkType: "sha256"}), RetryableError)
	if want := []string{"a", "b", "c"}; !eq(got, want) {
		t.Fatalf("max-retries 2: got %v, want %v", got, want)
	}
	// Defaults: a retryable failure goes on to the other remote worker
	// before the local fallback (issue 17: one dead peer must not fail
	// requests; the default used to be one remote worker).
	s, _ = newSelector(t, config.Defaults(), peer("a"), peer("b"))
	p := s.Plan(Request{WorkType: "sha256"})
	if got := walk(t, p, RetryableError); len(got) != 2 || !p.FallbackAllowed() {
		t.Fatalf("defaults: tried %v, fallback %v; want both peers then the local worker", got, p.FallbackAllowed())
	}
}

func TestPlan_PermanentErrorIsFinal(t *testing.T) {
	s, _ := newSelector(t, testConfig(), peer("a"), peer("b"))
	p := s.Plan(Request{WorkType: "sha256"})
	if v := p.Report(mustNext(t, p), PermanentError, time.Millisecond); v != Done {
		t.Fatalf("verdict %s, want done", v)
	}
}

func TestPlan_ReportsAreCountedOnce(t *testing.T) {
	s, _ := newSelector(t, testConfig(), peer("a"), peer("b"))
	p := s.Plan(Request{WorkType: "sha256"})
	pk := mustNext(t, p)
	if v := p.Report(pk, Success, time.Millisecond); v != Done {
		t.Fatalf("verdict %s", v)
	}
	if v := p.Report(pk, RetryableError, time.Millisecond); v != Ignored {
		t.Fatalf("second report verdict %s, want ignored", v)
	}
	if v := p.Report(Pick{Peer: "stranger"}, Success, 0); v != Ignored {
		t.Fatalf("report for a peer never picked: %s, want ignored", v)
	}
	if n := p.InFlight(); n != 0 {
		t.Fatalf("in flight %d, want 0", n)
	}
}

func TestPlan_ConcurrentAttemptsShareOnePlan(t *testing.T) {
	cfg := testConfig()
	cfg.Worker.MaxRemoteWorkers = 50
	cfg.Worker.MaxRetries = 50
	cfg.Hedge.MaxCount = 50
	var peers []Peer
	for i := range 40 {
		peers = append(peers, peer(string(rune('A'+i))))
	}
	s, _ := newSelector(t, cfg, peers...)
	p := s.Plan(Request{WorkType: "sha256", Idempotent: true})
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for {
				var pk Pick
				var ok bool
				if i%2 == 0 {
					pk, ok = p.Next()
				} else {
					pk, ok = p.Hedge()
				}
				if !ok {
					return
				}
				mu.Lock()
				seen[pk.Peer]++
				mu.Unlock()
				p.Report(pk, RetryableError, time.Millisecond)
				s.MaybeRefresh()
			}
		})
	}
	wg.Wait()
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("peer %s tried %d times in one request", id, n)
		}
	}
}

func TestSelectionModes(t *testing.T) {
	peers := []Peer{peer("a"), peer("b"), peer("c")}
	cfg := testConfig()
	cfg.Selection.Mode = config.ModeRoundRobin
	s, _ := newSelector(t, cfg, peers...)
	var got []string
	for range 6 {
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		got = append(got, pk.Peer)
		p.Report(pk, Success, time.Millisecond)
	}
	if want := []string{"a", "b", "c", "a", "b", "c"}; !eq(got, want) {
		t.Fatalf("round-robin: got %v, want %v", got, want)
	}
	cfg.Selection.Mode = config.ModeRandom
	s, _ = newSelector(t, cfg, peers...)
	counts := map[string]int{}
	for range 300 {
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		counts[pk.Peer]++
		p.Report(pk, Cancelled, 0)
	}
	for _, id := range []string{"a", "b", "c"} {
		if counts[id] < 50 {
			t.Fatalf("random: %v, want every peer picked often", counts)
		}
	}
	if _, err := New(config.Config{Selection: config.SelectionConfig{Mode: "fastest"}}); err == nil {
		t.Fatal("an unknown selection mode must be refused")
	}
}

func TestPlan_UpcomingPeeksWithoutSpending(t *testing.T) {
	cfg := testConfig()
	cfg.Worker.MaxRemoteWorkers = 3
	cfg.LabelBalancing = labelBalancing(false, true, "full", "archive")
	s, _ := newSelector(t, cfg, tiers()...)
	p := s.Plan(Request{WorkType: "sha256"})
	first := mustNext(t, p)
	if got := p.Upcoming(5); !eq(got, []string{"f2", "a1"}) {
		t.Fatalf("upcoming after %s: %v, want [f2 a1] (bounded by max-remote-workers 3)", first.Peer, got)
	}
	// Appended after what the caller holds, bounded the same.
	if got := p.AppendUpcoming(make([]string, 1, 4), 5); !eq(got, []string{"", "f2", "a1"}) {
		t.Fatalf("AppendUpcoming after one held: %v, want [ f2 a1]", got)
	}
	if got := walk(t, p, RetryableError); !eq(got, []string{"f2", "a1"}) {
		t.Fatalf("Upcoming must not spend budget: then tried %v", got)
	}
}

// Round-robin and random plans start each group at their own rotation, and
// the peers dialed ahead must be the ones they offer next, not the first
// ones in ID order.
func TestPlan_UpcomingFollowsRotation(t *testing.T) {
	for _, mode := range []string{config.ModeRoundRobin, config.ModeRandom} {
		cfg := testConfig()
		cfg.Selection.Mode = mode
		cfg.Worker.MaxRemoteWorkers = 3
		cfg.Worker.MaxRetries = 2
		s, _ := newSelector(t, cfg, peer("a"), peer("b"), peer("c"), peer("d"), peer("e"))
		for range 7 {
			p := s.Plan(Request{WorkType: "sha256"})
			first := mustNext(t, p)
			ahead := p.Upcoming(cfg.Worker.MaxRemoteWorkers)
			if got := walk(t, p, RetryableError); !eq(got, ahead) {
				t.Fatalf("%s: after %s, Upcoming said %v, then the plan offered %v", mode, first.Peer, ahead, got)
			}
		}
	}
}

// The round-robin position survives a refresh: a dispatcher refreshes the
// ranking every 50ms under load, and a rotation restarted each time sends
// most requests to the first peers in ID order.
func TestPlan_RoundRobinAcrossRefreshes(t *testing.T) {
	cfg := testConfig()
	cfg.Selection.Mode = config.ModeRoundRobin
	s, _ := newSelector(t, cfg, peer("a"), peer("b"), peer("c"), peer("d"))
	counts := map[string]int{}
	for range 40 {
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		counts[pk.Peer]++
		p.Report(pk, Success, time.Millisecond)
		s.Refresh()
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		if counts[id] != 10 {
			t.Fatalf("round-robin over 40 requests with a refresh after each: %v, want 10 each", counts)
		}
	}
}

// In rating mode a peer the node is not connected to comes after the
// connected ones, whatever its score: a worker that went away is no longer
// the favourite once its connection closed, instead of holding every
// request for a connect-timeout until its failures are counted.
func TestPlan_RatingPrefersConnected(t *testing.T) {
	cfg := testConfig()
	fast, slow := peer("fast"), peer("slow")
	fast.Connected, slow.Connected = true, true
	s, _ := newSelector(t, cfg, fast, slow)
	for range cfg.Rating.MinSamples + 2 { // rate both: fast at 1ms, slow at 5ms
		// Two plans open at once take both unrated peers.
		p1, p2 := s.Plan(Request{WorkType: "sha256"}), s.Plan(Request{WorkType: "sha256"})
		pk1, pk2 := mustNext(t, p1), mustNext(t, p2)
		for _, x := range []struct {
			p  *Plan
			pk Pick
		}{{p1, pk1}, {p2, pk2}} {
			lat := time.Millisecond
			if x.pk.Peer == "slow" {
				lat = 5 * time.Millisecond
			}
			x.p.Report(x.pk, Success, lat)
		}
	}
	s.Refresh()
	order := func() []string {
		var ids []string
		for _, r := range s.Ranking("sha256") {
			ids = append(ids, r.Peer)
		}
		return ids
	}
	if got := order(); !eq(got, []string{"fast", "slow"}) {
		t.Fatalf("both connected: %v, want [fast slow]", got)
	}
	fast.Connected = false
	s.SetPeers([]Peer{fast, slow})
	if got := order(); !eq(got, []string{"slow", "fast"}) {
		t.Fatalf("fast not connected: %v, want [slow fast]", got)
	}
	p := s.Plan(Request{WorkType: "sha256"})
	if pk := mustNext(t, p); pk.Peer != "slow" {
		t.Fatalf("first pick %s, want the connected peer", pk.Peer)
	}
	if got := p.Upcoming(2); !eq(got, []string{"fast"}) {
		t.Fatalf("upcoming after the connected peer: %v, want [fast]", got)
	}
}
