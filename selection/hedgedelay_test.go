package selection

import (
	"slices"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
)

// hedgeConfig is testConfig with hedging on and the measured delay's
// settings spelled out.
func hedgeConfig() config.Config {
	cfg := testConfig()
	cfg.Hedge = config.HedgeConfig{
		Delay: 100 * time.Millisecond, MaxCount: 1,
		Quantile: 0.95, DelayMin: 2 * time.Millisecond, DelayMax: time.Second,
		Window: 30 * time.Second, MinSamples: 20,
	}
	return cfg
}

// succeedIn runs one plan of workType to a success that took d.
func succeedIn(t *testing.T, s *Selector, workType string, d time.Duration) {
	t.Helper()
	p := s.Plan(Request{WorkType: workType, Idempotent: true})
	pk := mustNext(t, p)
	if v := p.Report(pk, Success, d); v != Done {
		t.Fatalf("Report(success) = %v, want Done", v)
	}
}

// wantHedgeDelay checks workType's hedge delay once the cached estimate
// is due again (hedgeRefresh later), so that every sample counts.
func wantHedgeDelay(t *testing.T, s *Selector, clk *testkit.FakeClock, workType string, want time.Duration, wantMeasured bool) {
	t.Helper()
	clk.Advance(hedgeRefresh)
	d, n, measured := s.HedgeDelay(workType)
	if d != want || measured != wantMeasured {
		t.Fatalf("HedgeDelay(%q) = %s (measured %v, %d samples), want %s (measured %v)", workType, d, measured, n, want, wantMeasured)
	}
	if p := s.Plan(Request{WorkType: workType, Idempotent: true}); p.HedgeDelay() != want {
		t.Fatalf("Plan(%q).HedgeDelay() = %s, want %s", workType, p.HedgeDelay(), want)
	}
}

func TestHedgeDelay_FixedUntilEnoughSamples(t *testing.T) {
	s, clk := newSelector(t, hedgeConfig(), peer("a"), peer("b"))
	wantHedgeDelay(t, s, clk, "sha256", 100*time.Millisecond, false)
	for range 19 {
		succeedIn(t, s, "sha256", 10*time.Millisecond)
	}
	wantHedgeDelay(t, s, clk, "sha256", 100*time.Millisecond, false)
	succeedIn(t, s, "sha256", 10*time.Millisecond)
	wantHedgeDelay(t, s, clk, "sha256", 10*time.Millisecond, true)
}

func TestHedgeDelay_QuantileOfRecentSuccesses(t *testing.T) {
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.95, 95 * time.Millisecond}, {0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}} {
		cfg := hedgeConfig()
		cfg.Hedge.Quantile = c.q
		s, clk := newSelector(t, cfg, peer("a"))
		// 1ms..100ms in a scrambled order: the quantile does not depend on it.
		for i := range 100 {
			s.observeHedge("sha256", Success, time.Duration((i*37)%100+1)*time.Millisecond, clk.Now())
		}
		wantHedgeDelay(t, s, clk, "sha256", c.want, true)
	}
	// Nearest rank where q*n is not a whole number: p95 of 1..30ms is the
	// 29th smallest (28.5 rounded up).
	s, clk := newSelector(t, hedgeConfig(), peer("a"))
	for i := range 30 {
		s.observeHedge("sha256", Success, time.Duration(30-i)*time.Millisecond, clk.Now())
	}
	wantHedgeDelay(t, s, clk, "sha256", 29*time.Millisecond, true)
}

func TestHedgeDelay_Bounded(t *testing.T) {
	s, clk := newSelector(t, hedgeConfig(), peer("a"))
	for range 20 {
		s.observeHedge("fast", Success, 100*time.Microsecond, clk.Now())
		s.observeHedge("slow", Success, 5*time.Second, clk.Now())
	}
	wantHedgeDelay(t, s, clk, "fast", 2*time.Millisecond, true) // hedge-delay-min
	wantHedgeDelay(t, s, clk, "slow", time.Second, true)        // hedge-delay-max
}

// TestHedgeDelay_FactorTimesTheQuantile: hedge-delay-factor multiplies the
// quantile, within the bounds; the shipped default is 2.
func TestHedgeDelay_FactorTimesTheQuantile(t *testing.T) {
	cfg := hedgeConfig()
	cfg.Hedge.Factor = 2
	s, clk := newSelector(t, cfg, peer("a"))
	for range 40 {
		s.observeHedge("sha256", Success, 30*time.Millisecond, clk.Now())
		s.observeHedge("slow", Success, 700*time.Millisecond, clk.Now())
	}
	wantHedgeDelay(t, s, clk, "sha256", 60*time.Millisecond, true)
	wantHedgeDelay(t, s, clk, "slow", time.Second, true) // 1.4s, above hedge-delay-max
	if got := config.Defaults().Hedge.Factor; got != 2 {
		t.Errorf("default hedge-delay-factor %v, want 2", got)
	}
}

func TestHedgeDelay_SlidingWindow(t *testing.T) {
	s, clk := newSelector(t, hedgeConfig(), peer("a"))
	for range 40 {
		s.observeHedge("sha256", Success, 50*time.Millisecond, clk.Now())
	}
	wantHedgeDelay(t, s, clk, "sha256", 50*time.Millisecond, true)
	// Older than hedge-window: forgotten, back to hedge-delay.
	clk.Advance(31 * time.Second)
	wantHedgeDelay(t, s, clk, "sha256", 100*time.Millisecond, false)
	for range 20 {
		s.observeHedge("sha256", Success, 20*time.Millisecond, clk.Now())
	}
	wantHedgeDelay(t, s, clk, "sha256", 20*time.Millisecond, true)
	// The ring keeps the last hedgeRing samples only: a burst of fast ones
	// pushes the slow ones out, within the window.
	for range hedgeRing {
		s.observeHedge("sha256", Success, 200*time.Millisecond, clk.Now())
	}
	wantHedgeDelay(t, s, clk, "sha256", 200*time.Millisecond, true)
	// p95 of 256 is the 244th smallest: with 243 fast ones it is still slow.
	for range 243 {
		s.observeHedge("sha256", Success, 8*time.Millisecond, clk.Now())
	}
	wantHedgeDelay(t, s, clk, "sha256", 200*time.Millisecond, true)
	s.observeHedge("sha256", Success, 8*time.Millisecond, clk.Now())
	wantHedgeDelay(t, s, clk, "sha256", 8*time.Millisecond, true)
}

func TestHedgeDelay_OnlySuccessesCount(t *testing.T) {
	var peers []Peer
	for i := range 10 {
		peers = append(peers, peer(string(rune('a'+i))))
	}
	s, clk := newSelector(t, hedgeConfig(), peers...)
	for range 20 {
		succeedIn(t, s, "sha256", 10*time.Millisecond)
	}
	// Every other outcome, however long it took, leaves the delay alone:
	// errors, refusals, misses and abandoned attempts. Two of them
	// counted would make the p95 of 22 samples 900ms.
	for _, o := range []Outcome{Cancelled, RetryableError, PermanentError, Busy, Empty, Denied, Unsupported, Unreachable} {
		for range 2 {
			p := s.Plan(Request{WorkType: "sha256", Idempotent: true})
			pk := mustNext(t, p)
			p.Report(pk, o, 900*time.Millisecond)
		}
	}
	wantHedgeDelay(t, s, clk, "sha256", 10*time.Millisecond, true)
	// Nor do the successes of requests that may not be hedged (writes).
	for range 2 {
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		p.Report(pk, Success, 900*time.Millisecond)
	}
	wantHedgeDelay(t, s, clk, "sha256", 10*time.Millisecond, true)
	// The loser of a hedged request: the winner decides, the loser is
	// reported cancelled and does not count.
	p := s.Plan(Request{WorkType: "sha256", Idempotent: true})
	first := mustNext(t, p)
	hedge, ok := p.Hedge()
	if !ok {
		t.Fatalf("Hedge: nothing offered: %s", p.Explain())
	}
	p.Report(hedge, Success, 12*time.Millisecond)
	p.Report(first, Cancelled, 950*time.Millisecond)
	wantHedgeDelay(t, s, clk, "sha256", 10*time.Millisecond, true)
	if _, n, _ := s.HedgeDelay("sha256"); n != 21 {
		t.Fatalf("%d samples after the hedged request, want 21 (the winner only)", n)
	}
}

func TestHedgeDelay_PerWorkType(t *testing.T) {
	s, clk := newSelector(t, hedgeConfig(),
		Peer{ID: "a", Types: []TypeInfo{{Name: "quick"}, {Name: "slow"}}},
		Peer{ID: "b", Types: []TypeInfo{{Name: "quick"}, {Name: "slow"}}})
	for range 20 {
		succeedIn(t, s, "quick", 3*time.Millisecond)
		succeedIn(t, s, "slow", 300*time.Millisecond)
	}
	wantHedgeDelay(t, s, clk, "quick", 3*time.Millisecond, true)
	wantHedgeDelay(t, s, clk, "slow", 300*time.Millisecond, true)
	wantHedgeDelay(t, s, clk, "unseen", 100*time.Millisecond, false)
}

func TestHedgeDelay_QuantileZeroIsFixed(t *testing.T) {
	cfg := hedgeConfig()
	cfg.Hedge.Quantile = 0
	s, clk := newSelector(t, cfg, peer("a"))
	for range 50 {
		succeedIn(t, s, "sha256", 10*time.Millisecond)
	}
	wantHedgeDelay(t, s, clk, "sha256", 100*time.Millisecond, false)
}

// BenchmarkHedgeDelay is the cost on the request path of the measured
// delay: one success recorded and the delay read, as a hedged request does.
func BenchmarkHedgeDelay(b *testing.B) {
	s, clk := newSelector(b, hedgeConfig(), peer("a"))
	for i := range hedgeRing {
		s.observeHedge("sha256", Success, time.Duration(i)*time.Microsecond, clk.Now())
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		s.observeHedge("sha256", Success, time.Duration(i%1000)*time.Microsecond, clk.Now())
		if d, _, _ := s.HedgeDelay("sha256"); d <= 0 {
			b.Fatal("no delay")
		}
	}
}

func TestHedgeDelay_NthMatchesSort(t *testing.T) {
	rnd := uint64(7)
	for n := 1; n <= 300; n += 7 {
		for _, spread := range []uint64{3, 1000} { // many ties, few ties
			s := make([]time.Duration, n)
			for i := range s {
				rnd = splitmix(rnd + 1)
				s[i] = time.Duration(rnd % spread)
			}
			sorted := slices.Clone(s)
			slices.Sort(sorted)
			for k := range n {
				if got := nth(slices.Clone(s), k); got != sorted[k] {
					t.Fatalf("n %d spread %d: nth(%d) = %d, want %d", n, spread, k, got, sorted[k])
				}
			}
		}
	}
}
