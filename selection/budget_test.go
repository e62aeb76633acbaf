package selection

import (
	"strings"
	"testing"
	"time"
)

// failOnce starts a plan, fails its first attempt with o and reports
// whether the plan then offered a retry, with its explanation.
func failOnce(t *testing.T, s *Selector, req Request, o Outcome) (bool, string) {
	t.Helper()
	p := s.Plan(req)
	pk := mustNext(t, p)
	v := p.Report(pk, o, time.Millisecond)
	pk2, ok := p.Next()
	if ok {
		p.Report(pk2, Success, time.Millisecond)
	}
	if ok != (v == Retry) {
		t.Fatalf("verdict %s but Next offered %v", v, ok)
	}
	return ok, p.Explain().String()
}

// succeed runs n requests whose first attempt succeeds.
func succeed(t *testing.T, s *Selector, n int) {
	t.Helper()
	for range n {
		p := s.Plan(Request{WorkType: "sha256"})
		p.Report(mustNext(t, p), Success, time.Millisecond)
	}
}

func TestRetryBudget_MinPerSecond(t *testing.T) {
	cfg := testConfig()
	cfg.Worker.RetryBudgetWindow = time.Second
	cfg.Worker.RetryBudgetRatio = 0
	cfg.Worker.RetryBudgetMinPerSecond = 3
	s, clk := newSelector(t, cfg, peer("a"), peer("b"))
	req := Request{WorkType: "sha256"}
	for i := range 3 {
		if ok, why := failOnce(t, s, req, RetryableError); !ok {
			t.Fatalf("retry %d of 3 refused: %s", i+1, why)
		}
	}
	ok, why := failOnce(t, s, req, Unreachable)
	if ok {
		t.Fatal("a fourth retry within the window was allowed; want the budget spent")
	}
	if want := "retry budget spent (3 retries in the last 1s, 3 allowed)"; !strings.Contains(why, want) {
		t.Fatalf("explanation %q does not say %q", why, want)
	}
	// The window slides: a second later the old retries are out of it.
	clk.Advance(1100 * time.Millisecond)
	if ok, why := failOnce(t, s, req, RetryableError); !ok {
		t.Fatalf("after the window, a retry was refused: %s", why)
	}
}

func TestRetryBudget_RatioOfRecentRequests(t *testing.T) {
	cfg := testConfig()
	cfg.Worker.RetryBudgetWindow = 10 * time.Second
	cfg.Worker.RetryBudgetRatio = 0.2
	cfg.Worker.RetryBudgetMinPerSecond = 0
	s, clk := newSelector(t, cfg, peer("a"), peer("b"))
	req := Request{WorkType: "sha256"}
	// Nothing asked yet: a ratio of nothing is nothing.
	if ok, _ := failOnce(t, s, req, RetryableError); ok {
		t.Fatal("a retry with no recent requests and no minimum was allowed")
	}
	succeed(t, s, 19) // 20 requests in the window with the failed one
	allowed := 0
	for range 10 {
		clk.Advance(10 * time.Millisecond)
		if ok, _ := failOnce(t, s, req, RetryableError); ok {
			allowed++
		}
	}
	// 20 requests, then each failOnce adds one: 20% of 21..30 grows from 4 to 6.
	if allowed < 4 || allowed > 6 {
		t.Fatalf("%d retries allowed among 30 requests at ratio 0.2; want 4 to 6", allowed)
	}
	// Once the window has passed, the requests have left it too.
	clk.Advance(11 * time.Second)
	if ok, _ := failOnce(t, s, req, RetryableError); ok {
		t.Fatal("a retry was allowed on requests that left the window")
	}
}

func TestRetryBudget_OffAndViews(t *testing.T) {
	cfg := testConfig()
	cfg.Worker.RetryBudgetWindow = time.Second
	cfg.Worker.RetryBudgetRatio = 0
	cfg.Worker.RetryBudgetMinPerSecond = 1
	s, _ := newSelector(t, cfg, peer("a"), peer("b"), peer("c"))
	// A plan view walks every peer and spends nothing.
	for range 5 {
		if got := walk(t, s.Plan(Request{WorkType: "sha256", View: true}), RetryableError); len(got) != 3 {
			t.Fatalf("view walked %v, want all three peers", got)
		}
	}
	if ok, why := failOnce(t, s, Request{WorkType: "sha256"}, RetryableError); !ok {
		t.Fatalf("views spent the budget: %s", why)
	}

	cfg.Worker.RetryBudgetWindow = 0 // no budget: only the caps bound retries
	s, _ = newSelector(t, cfg, peer("a"), peer("b"), peer("c"))
	for range 5 {
		if got := walk(t, s.Plan(Request{WorkType: "sha256"}), RetryableError); len(got) != 3 {
			t.Fatalf("without a budget walked %v, want all three peers", got)
		}
	}
}

// TestRetryBudget_BusyMovesAreNoRetries: a worker that refuses at once as
// busy ran nothing, so the move to the next peer spends neither the retry
// budget nor max-retries (only max-remote-workers bounds it), and a
// request back from the admission queue is not counted again.
func TestRetryBudget_BusyMovesAreNoRetries(t *testing.T) {
	cfg := testConfig()
	cfg.Worker.MaxRetries = 1
	cfg.Worker.MaxRemoteWorkers = 4
	cfg.Worker.RetryBudgetWindow = time.Second
	cfg.Worker.RetryBudgetRatio = 0
	cfg.Worker.RetryBudgetMinPerSecond = 1 // one retry in the window
	s, _ := newSelector(t, cfg, peer("a"), peer("b"), peer("c"), peer("d"), peer("e"))
	for i := range 3 {
		got := walk(t, s.Plan(Request{WorkType: "sha256"}), Busy)
		if want := []string{"a", "b", "c", "d"}; !eq(got, want) {
			t.Fatalf("busy walk %d: tried %v, want %v (max-remote-workers 4, no retry spent)", i, got, want)
		}
	}
	// The budget is untouched: its one retry is still there, and spent by
	// an error.
	if ok, why := failOnce(t, s, Request{WorkType: "sha256"}, RetryableError); !ok {
		t.Fatalf("busy moves spent the retry budget: %s", why)
	}
	ok, why := failOnce(t, s, Request{WorkType: "sha256"}, RetryableError)
	if ok || !strings.Contains(why, "retry budget spent") {
		t.Fatalf("second error retry: offered %v (%s), want the budget spent", ok, why)
	}
	// After a busy refusal and then an error, the error's retry is a retry.
	p := s.Plan(Request{WorkType: "sha256"})
	if v := p.Report(mustNext(t, p), Busy, time.Millisecond); v != Retry {
		t.Fatalf("after busy: %s, want retry", v)
	}
	if v := p.Report(mustNext(t, p), RetryableError, time.Millisecond); v != Exhausted {
		t.Fatalf("after an error with the budget spent: %s, want exhausted", v)
	}
	// A request back from the admission queue counts as no new request:
	// requests of the window stay as they were.
	before, _ := s.budget.sums(s.clock.Now())
	p = s.Plan(Request{WorkType: "sha256", Again: true})
	p.Report(mustNext(t, p), Success, time.Millisecond)
	if after, _ := s.budget.sums(s.clock.Now()); after != before {
		t.Fatalf("a request back from the admission queue was counted again: %d requests, want %d", after, before)
	}
}
