package selection

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
)

// feed reports n outcomes for a peer through real plans.
func feed(t *testing.T, s *Selector, id string, o Outcome, latency time.Duration, n int) {
	t.Helper()
	for range n {
		p := s.Plan(Request{WorkType: "sha256", Labels: []string{id}})
		pk := mustNext(t, p)
		p.Report(pk, o, latency)
	}
}

func TestRating_OrdersByLatencyAndErrors(t *testing.T) {
	s, _ := newSelector(t, testConfig(), peer("slow", "slow"), peer("fast", "fast"), peer("flaky", "flaky"))
	feed(t, s, "slow", Success, 40*time.Millisecond, 5)
	feed(t, s, "fast", Success, 2*time.Millisecond, 5)
	feed(t, s, "flaky", Success, 2*time.Millisecond, 3)
	feed(t, s, "flaky", RetryableError, 2*time.Millisecond, 3)
	s.Refresh()
	if order, want := rankingOrder(s), []string{"fast", "flaky", "slow"}; !eq(order, want) {
		t.Fatalf("ranking %v, want %v", order, want)
	}
	if pk := mustNext(t, s.Plan(Request{WorkType: "sha256"})); pk.Peer != "fast" || !pk.Rated {
		t.Fatalf("first pick %s (rated %v), want fast", pk.Peer, pk.Rated)
	}
}

func TestRating_WindowForgetsOldFailures(t *testing.T) {
	cfg := testConfig()
	cfg.Rating.Window = 10 * time.Second
	s, clk := newSelector(t, cfg, peer("a", "a"), peer("b", "b"))
	feed(t, s, "a", RetryableError, time.Millisecond, 20)
	feed(t, s, "b", Success, time.Millisecond, 20)
	s.Refresh()
	if pk := mustNext(t, s.Plan(Request{WorkType: "sha256"})); pk.Peer != "b" {
		t.Fatalf("after a's failures: first pick %s, want b", pk.Peer)
	}
	// A minute later (6 half-lives) a recovers and b's record has decayed
	// too: a's fresh successes outweigh its old failures.
	clk.Advance(time.Minute)
	feed(t, s, "a", Success, time.Millisecond, 10)
	feed(t, s, "b", Success, time.Millisecond, 10)
	s.Refresh()
	r := s.Ranking("sha256")
	// Counted since the start a would still fail 2 of 3 (score 0.27).
	if r[0].Score-r[1].Score > 0.15 {
		t.Fatalf("after recovery the scores should be close: %+v", r)
	}
}

func TestRating_UnratedPeersAreExplored(t *testing.T) {
	s, _ := newSelector(t, testConfig(), peer("old", "old"), peer("new", "new"))
	feed(t, s, "old", Success, time.Millisecond, 10)
	s.Refresh()
	// The new peer has no samples: it is explored first ...
	p := s.Plan(Request{WorkType: "sha256"})
	pk := mustNext(t, p)
	if pk.Peer != "new" || pk.Rated {
		t.Fatalf("first pick %s (rated %v), want the unrated new peer", pk.Peer, pk.Rated)
	}
	// ... but only one attempt at a time: a concurrent request goes to the
	// rated peer rather than piling onto an unknown one.
	if pk2 := mustNext(t, s.Plan(Request{WorkType: "sha256"})); pk2.Peer != "old" {
		t.Fatalf("concurrent pick %s, want old while new is being explored", pk2.Peer)
	}
	// Below rating-min-samples a peer is not judged.
	p.Report(pk, RetryableError, time.Millisecond)
	s.Refresh()
	for _, r := range s.Ranking("sha256") {
		if r.Peer == "new" && r.Rated {
			t.Fatal("one sample must not rate a peer (rating-min-samples is 3)")
		}
	}
}

func TestRating_SpreadIsSeededAndBounded(t *testing.T) {
	cfg := testConfig()
	cfg.Rating.Spread = 2
	run := func() []string {
		s, _ := newSelector(t, cfg, peer("a", "a"), peer("b", "b"), peer("c", "c"))
		feed(t, s, "a", Success, time.Millisecond, 5)
		feed(t, s, "b", Success, time.Millisecond, 5)
		feed(t, s, "c", Success, 50*time.Millisecond, 5)
		s.Refresh()
		var got []string
		for range 40 {
			p := s.Plan(Request{WorkType: "sha256"})
			pk := mustNext(t, p)
			got = append(got, pk.Peer)
			p.Report(pk, Cancelled, 0)
		}
		return got
	}
	first, second := run(), run()
	if !eq(first, second) {
		t.Fatalf("the same seed must give the same picks:\n%v\n%v", first, second)
	}
	counts := map[string]int{}
	for _, id := range first {
		counts[id]++
	}
	if counts["c"] != 0 || counts["a"] == 0 || counts["b"] == 0 {
		t.Fatalf("spread 2 must share between the best two only: %v", counts)
	}
}

func TestRating_UnreachablePeersDoNotSetTheBenchmark(t *testing.T) {
	cfg := testConfig()
	cfg.Liveness.PollFailureThreshold = 1
	s, _ := newSelector(t, cfg, peer("dead", "dead"), peer("ok", "ok"), peer("grey", "grey"))
	feed(t, s, "dead", Success, time.Millisecond, 10)
	feed(t, s, "ok", Success, 10*time.Millisecond, 10)
	feed(t, s, "grey", Success, 8*time.Millisecond, 5)
	feed(t, s, "grey", RetryableError, 8*time.Millisecond, 5)
	s.Liveness().Report("dead", false)
	s.Refresh()
	if pk := mustNext(t, s.Plan(Request{WorkType: "sha256"})); pk.Peer != "ok" {
		t.Fatalf("first pick %s: a dead peer's quick answers made the healthy survivor look slower than a peer failing half its work", pk.Peer)
	}
}

// Concurrent requests spread over equally good peers by the attempts this
// node has in flight on each, weighed against each peer's concurrency; a
// peer that fails half its work is not chosen until the good ones carry
// twice their concurrency each; nothing in flight is the strict best.
func TestRating_ConcurrentPicksWeighInFlight(t *testing.T) {
	withCap := func(p Peer, c int) Peer { p.Concurrency = c; return p }
	s, _ := newSelector(t, testConfig(),
		withCap(peer("a", "a"), 4), withCap(peer("b", "b"), 4), withCap(peer("grey", "grey"), 4))
	feed(t, s, "a", Success, time.Millisecond, 5)
	feed(t, s, "b", Success, time.Millisecond, 5)
	feed(t, s, "grey", Success, time.Millisecond, 5)
	feed(t, s, "grey", RetryableError, time.Millisecond, 5) // error rate 0.5: cost 2 at error weight 4
	s.Refresh()

	// Picks held open, as concurrent requests hold theirs.
	var open []*Plan
	var picks []Pick
	count := map[string]int{}
	hold := func() string {
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		open = append(open, p)
		picks = append(picks, pk)
		count[pk.Peer]++
		return pk.Peer
	}
	for range 8 {
		hold()
	}
	if count["a"] != 4 || count["b"] != 4 || count["grey"] != 0 {
		t.Fatalf("8 concurrent picks: %v; want 4 each on a and b, none on grey", count)
	}
	// a and b now each hold a concurrency's worth (cost 1); grey costs 2 with
	// nothing in flight: the good ones take another concurrency's worth
	// before grey gets its first request.
	for range 8 {
		hold()
	}
	if count["grey"] != 0 {
		t.Fatalf("16 concurrent picks: %v; grey should wait until a and b carry twice their concurrency", count)
	}
	// At twice their concurrency a and b weigh as much as grey; ties keep the
	// rank order, so each takes one more, and then grey is the lightest.
	for i, want := range []string{"a", "b", "grey"} {
		if got := hold(); got != want {
			t.Fatalf("concurrent pick %d: %s, want %s", 17+i, got, want)
		}
	}
	// Once the attempts end, the best peer is the strict first pick again.
	for i, p := range open {
		p.Report(picks[i], Success, time.Millisecond)
	}
	first := s.Ranking("sha256")[0].Peer
	for range 3 {
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		if pk.Peer != first {
			t.Fatalf("with nothing in flight the pick is %s, want the best, %s", pk.Peer, first)
		}
		p.Report(pk, Success, time.Millisecond)
	}
}

// TestRating_DirectWinsOverRelayedAmongEquals: of two peers with the same
// outcomes, the one reached through a relay only ranks after the direct
// one (without the relay's cost the tie would go to the first by ID, the
// relayed one); a relayed peer clearly faster than the direct one still
// ranks first.
func TestRating_DirectWinsOverRelayedAmongEquals(t *testing.T) {
	relayed := peer("a", "a")
	relayed.Relayed = true
	s, clk := newSelector(t, testConfig(), relayed, peer("b", "b"))
	first := func() string {
		t.Helper()
		s.Refresh()
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		p.Report(pk, Cancelled, 0) // nothing stays in flight
		return pk.Peer
	}
	if got := first(); got != "b" {
		t.Fatalf("unrated: first pick %s, want the direct peer b (%+v)", got, s.Ranking("sha256"))
	}
	feed(t, s, "a", Success, 5*time.Millisecond, 5)
	feed(t, s, "b", Success, 5*time.Millisecond, 5)
	clk.Advance(time.Second)
	if got := first(); got != "b" {
		t.Fatalf("equal outcomes: first pick %s, want the direct peer b (%+v)", got, s.Ranking("sha256"))
	}
	// b turns four times slower: the relayed peer is the better one.
	feed(t, s, "b", Success, 40*time.Millisecond, 20)
	clk.Advance(time.Second)
	if got := first(); got != "a" {
		t.Fatalf("relayed peer much faster: first pick %s, want a (%+v)", got, s.Ranking("sha256"))
	}
}

// A peer proven bad is not a newcomer again when its outcomes fade below
// rating-min-samples: it stays rated, behind the good peer, and its bad
// record fades gradually (as if the missing samples were good) instead of
// earning it a newcomer's exploration all at once.
func TestRating_ProvenPeerStaysRatedAsItsRecordFades(t *testing.T) {
	s, clk := newSelector(t, testConfig(), peer("good", "good"), peer("flaky", "flaky"))
	feed(t, s, "good", Success, time.Millisecond, 20)
	feed(t, s, "flaky", RetryableError, time.Millisecond, 2)
	feed(t, s, "flaky", Success, time.Millisecond, 2)
	score := func() (flaky Ranked) {
		t.Helper()
		s.Refresh()
		for _, r := range s.Ranking("sha256") {
			if r.Peer == "flaky" {
				flaky = r
			}
		}
		return flaky
	}
	// 20s on (two thirds of a half-life) flaky's 4 outcomes weigh 2.5,
	// fewer than rating-min-samples (3).
	clk.Advance(20 * time.Second)
	f := score()
	if !f.Rated {
		t.Fatalf("flaky unrated again after its outcomes faded below rating-min-samples: %+v", s.Ranking("sha256"))
	}
	for i := range 5 {
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		if pk.Peer != "good" {
			t.Fatalf("first pick %d is %s, want good: a proven bad peer is not explored as a newcomer", i, pk.Peer)
		}
		p.Report(pk, Success, time.Millisecond)
	}
	// A minute later its errors weigh less: the score rises, yet stays
	// below a clean record's.
	clk.Advance(time.Minute)
	later := score()
	if later.Score <= f.Score || later.Score >= 0.9 {
		t.Fatalf("a minute later flaky scores %.3f (was %.3f): want it rising as its record fades, still below 0.9", later.Score, f.Score)
	}
	// Ten half-lives on the record has all but faded: flaky is judged
	// nearly as a clean peer, and tried again as a rated one.
	clk.Advance(5 * time.Minute)
	if f := score(); !f.Rated || f.Score < 0.95 {
		t.Fatalf("after ten half-lives flaky is %+v: want rated with a score near 1", f)
	}
}

// A peer whose failures come back at once does not look fast: latency is
// the time a worker takes to answer, so a quick refusal or error never
// lowers it (a failure slower than the peer's answers, a timeout, still
// raises it). Counted from every outcome, half-failing "grey" would have
// a mean of 1ms, set the benchmark latency and rank before "ok", whose
// answers take as long as grey's own.
func TestRating_QuickFailuresDoNotMakeAPeerLookFast(t *testing.T) {
	s, _ := newSelector(t, testConfig(), peer("ok", "ok"), peer("grey", "grey"), peer("slowfail", "slowfail"))
	feed(t, s, "ok", Success, 10*time.Millisecond, 10)
	feed(t, s, "grey", Success, 10*time.Millisecond, 5)
	feed(t, s, "grey", RetryableError, 100*time.Microsecond, 5)
	feed(t, s, "slowfail", Success, 10*time.Millisecond, 9)
	feed(t, s, "slowfail", RetryableError, 500*time.Millisecond, 1) // a timeout
	s.Refresh()
	if order, want := rankingOrder(s), []string{"ok", "slowfail", "grey"}; !eq(order, want) {
		t.Fatalf("ranking %v, want %v: %+v", order, want, s.Ranking("sha256"))
	}
	if lat := latencyOf(s, "grey"); lat < 9*time.Millisecond || lat > 11*time.Millisecond {
		t.Fatalf("grey's latency %v, want its answers' 10ms", lat)
	}
	if lat := latencyOf(s, "slowfail"); lat <= 11*time.Millisecond {
		t.Fatalf("slowfail's latency %v: its timeout must count against it", lat)
	}
}

// latencyOf is the mean latency rating holds for a peer of "sha256".
func latencyOf(s *Selector, id string) time.Duration {
	for _, e := range s.snap.Load().types["sha256"].all {
		if e.id == id {
			return time.Duration(e.rate.read(s.clock.Now(), s.cfg.Rating.Window).latency * float64(time.Second))
		}
	}
	return 0
}

// Latency differences below rating-latency-floor count as a fraction of
// it: a worker whose last answers came in 0.2ms after the best one's (as
// on a busy machine's loopback) is not judged worse than one that fails
// half its work, as it would be at 3.2 times the best's latency.
func TestRating_SubMillisecondLatencyDoesNotOutweighErrors(t *testing.T) {
	s, _ := newSelector(t, testConfig(), peer("best", "best"), peer("stale", "stale"), peer("flaky", "flaky"))
	feed(t, s, "best", Success, 90*time.Microsecond, 10)
	feed(t, s, "stale", Success, 290*time.Microsecond, 10)
	feed(t, s, "flaky", Success, 90*time.Microsecond, 5)
	feed(t, s, "flaky", RetryableError, 90*time.Microsecond, 5)
	s.Refresh()
	if order, want := rankingOrder(s), []string{"best", "stale", "flaky"}; !eq(order, want) {
		t.Fatalf("ranking %v, want %v: %+v", order, want, s.Ranking("sha256"))
	}
	// Above the floor latency counts as before: twice as slow costs 1.
	s2, _ := newSelector(t, testConfig(), peer("fast", "fast"), peer("slow", "slow"))
	feed(t, s2, "fast", Success, 20*time.Millisecond, 10)
	feed(t, s2, "slow", Success, 40*time.Millisecond, 10)
	s2.Refresh()
	if r := s2.Ranking("sha256"); r[1].Peer != "slow" || math.Abs(r[1].Score-0.5) > 0.01 {
		t.Fatalf("twice as slow: %+v, want slow with score 0.5 (cost 1)", r)
	}
}

// A newcomer is explored one attempt at a time until its outcomes reach
// rating-min-samples, and not one attempt more while the ranking still
// holds it as unrated: a newcomer failing every attempt got every first
// attempt in a row until the next refresh, which on a busy machine is
// dozens of requests.
func TestRating_NewcomerProvenBeforeTheRefreshIsNotExploredOn(t *testing.T) {
	s, _ := newSelector(t, testConfig(), peer("good", "good"), peer("new", "new"))
	feed(t, s, "good", Success, time.Millisecond, 10)
	s.Refresh()
	for i := range 3 { // rating-min-samples
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		if pk.Peer != "new" || pk.Rated {
			t.Fatalf("exploration pick %d: %s (rated %v), want the unrated newcomer", i, pk.Peer, pk.Rated)
		}
		p.Report(pk, RetryableError, time.Millisecond)
	}
	// No refresh yet: the ranking still says "new" is unrated.
	for i := range 5 {
		p := s.Plan(Request{WorkType: "sha256"})
		pk := mustNext(t, p)
		if pk.Peer != "good" {
			t.Fatalf("first pick %d after the newcomer's third outcome: %s, want good", i, pk.Peer)
		}
		p.Report(pk, Success, time.Millisecond)
	}
	// With nothing else selectable it is still tried.
	p := s.Plan(Request{WorkType: "sha256", Labels: []string{"new"}})
	if pk := mustNext(t, p); pk.Peer != "new" {
		t.Fatalf("the only candidate: %s, want new", pk.Peer)
	}
}

// rankingOrder is the peers of "sha256" in ranking order.
func rankingOrder(s *Selector) []string {
	var order []string
	for _, r := range s.Ranking("sha256") {
		order = append(order, r.Peer)
	}
	return order
}

// A peer that has only failed is judged on how long its failures took:
// one whose every attempt times out after 5s ranks behind a working peer
// six times slower than the best, not before it. A peer whose failures
// come back at once and that never answered does not set the benchmark
// latency either.
func TestRating_APeerThatOnlyFailsIsJudgedOnItsWaits(t *testing.T) {
	s, _ := newSelector(t, testConfig(), peer("fast", "fast"), peer("slowok", "slowok"), peer("timeouts", "timeouts"), peer("refuses", "refuses"))
	feed(t, s, "fast", Success, 20*time.Millisecond, 10)
	feed(t, s, "slowok", Success, 120*time.Millisecond, 10)
	feed(t, s, "timeouts", RetryableError, 5*time.Second, 10)
	feed(t, s, "refuses", RetryableError, 50*time.Microsecond, 10)
	s.Refresh()
	order := rankingOrder(s)
	if order[0] != "fast" || slices.Index(order, "slowok") > slices.Index(order, "timeouts") {
		t.Fatalf("ranking %v: want fast first and slowok before timeouts: %+v", order, s.Ranking("sha256"))
	}
	// fast's score stays 1: refuses' quick failures did not become the
	// benchmark it is compared with.
	if r := s.Ranking("sha256"); r[0].Score < 0.999 {
		t.Fatalf("fast scores %.3f: a peer that never answered set the benchmark latency (%+v)", r[0].Score, r)
	}
	// Timeouts before a peer's first answer still count against it.
	s2, _ := newSelector(t, testConfig(), peer("a", "a"), peer("b", "b"))
	feed(t, s2, "a", Success, 10*time.Millisecond, 10)
	feed(t, s2, "b", RetryableError, 5*time.Second, 3)
	feed(t, s2, "b", Success, 10*time.Millisecond, 3)
	if lat := latencyOf(s2, "b"); lat < 100*time.Millisecond {
		t.Fatalf("b's latency %v after 3 timeouts of 5s and 3 answers of 10ms: its early timeouts were dropped", lat)
	}
}

// A peer's work types are rated apart: its slow work of one type (200ms
// sleeps) and its failures at another (an upstream behind it that is
// down) do not make it slow or failing for a third it runs as fast as
// anyone, and the peers view's score for that type says so.
func TestRating_IsPerWorkType(t *testing.T) {
	both := Peer{ID: "both", Labels: []string{"both"}, Types: []TypeInfo{{Name: "sha256"}, {Name: "sleep"}, {Name: "rpc"}}}
	s, _ := newSelector(t, testConfig(), both, peer("only", "only"))
	feedType := func(id, workType string, o Outcome, latency time.Duration, n int) {
		t.Helper()
		for range n {
			p := s.Plan(Request{WorkType: workType, Labels: []string{id}})
			p.Report(mustNext(t, p), o, latency)
		}
	}
	feedType("both", "sha256", Success, time.Millisecond, 10)
	feedType("only", "sha256", Success, time.Millisecond, 10)
	feedType("both", "sleep", Success, 200*time.Millisecond, 20)
	feedType("both", "rpc", RetryableError, 2*time.Millisecond, 20)
	s.Refresh()
	score := func(workType, id string) float64 {
		t.Helper()
		for _, r := range s.Ranking(workType) {
			if r.Peer == id {
				return r.Score
			}
		}
		t.Fatalf("%s not ranked for %s", id, workType)
		return 0
	}
	if a, b := score("sha256", "both"), score("sha256", "only"); a < 0.99*b {
		t.Fatalf("sha256 scores: both %.3f, only %.3f; want them equal (both answer in 1ms)", a, b)
	}
	if lat := latencyOf(s, "both"); lat > 2*time.Millisecond {
		t.Fatalf("both's sha256 latency %v, want its sha256 answers' 1ms, not its sleeps'", lat)
	}
	if sc := score("rpc", "both"); sc > 0.5 {
		t.Fatalf("rpc score of a peer failing every rpc %.3f, want it low", sc)
	}
}

// A peer that withdraws a work type for a while (its health flapped, or it
// means to shed its record) and advertises it again keeps its rating for
// that type: its failures still count, it is not a newcomer to explore
// again. A peer that leaves and comes back starts afresh.
func TestRating_WithdrawnTypeKeepsItsRating(t *testing.T) {
	flappy := Peer{ID: "flappy", Types: []TypeInfo{{Name: "sha256"}, {Name: "rpc"}}}
	s, _ := newSelector(t, testConfig(), flappy, peer("good"))
	for range 20 {
		p := s.Plan(Request{WorkType: "sha256"})
		for {
			pk := mustNext(t, p)
			if pk.Peer == "flappy" {
				p.Report(pk, RetryableError, time.Millisecond)
				continue
			}
			p.Report(pk, Success, time.Millisecond)
			break
		}
	}
	s.Refresh()
	judged := func(when string) {
		t.Helper()
		r := s.Ranking("sha256")
		if len(r) != 2 || r[0].Peer != "good" || r[1].Peer != "flappy" || !r[1].Rated || r[1].Score >= r[0].Score {
			t.Fatalf("%s: ranking %+v, want good first and flappy rated below it", when, r)
		}
	}
	judged("after 20 failures")
	withdrawn := Peer{ID: "flappy", Types: []TypeInfo{{Name: "rpc"}}}
	s.SetPeers([]Peer{withdrawn, peer("good")})
	if r := s.Ranking("sha256"); len(r) != 1 {
		t.Fatalf("sha256 withdrawn: ranking %+v, want good alone", r)
	}
	s.SetPeers([]Peer{flappy, peer("good")})
	judged("withdrawn and advertised again")
	s.SetPeers([]Peer{peer("good")})
	s.SetPeers([]Peer{flappy, peer("good")})
	for _, r := range s.Ranking("sha256") {
		if r.Peer == "flappy" && r.Rated {
			t.Fatalf("a peer that left and came back: %+v, want it unrated", r)
		}
	}
}

// A worker that answers every request empty, at or below the head, while
// other workers answer it with data, misses: its quick empty answers are
// not answers for rating (they set no latency benchmark), and each one
// another worker contradicted with data counts as an error. It ends last
// and gets few first attempts, and the requests do not run out of retries
// on it. When every worker answers empty, the empty answer is the truth
// and counts against none of them.
func TestRating_AWorkerThatAlwaysMissesRanksLast(t *testing.T) {
	cfg := config.Defaults() // the retry budget on
	s, clk := newSelector(t, cfg, peer("liar"), peer("h1"), peer("h2"))
	first := map[string]int{}
	unanswered := 0
	for i := range 2000 {
		clk.Advance(5 * time.Millisecond)
		if i%20 == 0 {
			s.Refresh()
		}
		p := s.Plan(Request{WorkType: "sha256"})
		for n := 0; ; n++ {
			pk, ok := p.Next()
			if !ok {
				unanswered++
				break
			}
			if n == 0 {
				first[pk.Peer]++
			}
			o, lat := Success, 5*time.Millisecond
			if pk.Peer == "liar" {
				o, lat = Empty, 100*time.Microsecond
			}
			if v := p.Report(pk, o, lat); v == Done {
				break
			} else if v != Retry {
				unanswered++
				break
			}
		}
	}
	s.Refresh()
	r := s.Ranking("sha256")
	if r[len(r)-1].Peer != "liar" || first["liar"] > 200 || unanswered > 0 {
		t.Fatalf("ranking %+v; first attempts %v; %d of 2000 requests unanswered: want the liar last, with at most 200 first attempts, and every request answered", r, first, unanswered)
	}

	// Every worker answers empty: nobody is contradicted.
	s2, _ := newSelector(t, cfg, peer("a"), peer("b"))
	for range 50 {
		p := s2.Plan(Request{WorkType: "sha256"})
		for {
			pk, ok := p.Next()
			if !ok {
				break
			}
			if p.Report(pk, Empty, time.Millisecond) != Retry {
				break
			}
		}
	}
	s2.Refresh()
	for _, id := range []string{"a", "b"} {
		if v := errRateOf(s2, id); v != 0 {
			t.Fatalf("%s answered empty as every worker did: error rate %.2f, want 0", id, v)
		}
	}
}

// errRateOf is the error rate rating holds of id for sha256.
func errRateOf(s *Selector, id string) float64 {
	for _, e := range s.snap.Load().types["sha256"].all {
		if e.id == id {
			return e.rate.read(s.clock.Now(), s.cfg.Rating.Window).errRate
		}
	}
	return -1
}
