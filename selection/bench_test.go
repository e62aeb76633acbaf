package selection

import (
	"fmt"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
)

// benchPeers returns n candidates split over three labelled groups, with
// some outcomes recorded so that most are rated.
func benchSelector(b *testing.B, n int) *Selector { return benchSelectorTypes(b, n, 2) }

// benchSelectorTypes is benchSelector with each peer serving types work
// types (1 or 2).
func benchSelectorTypes(b *testing.B, n, types int) *Selector {
	b.Helper()
	cfg := testConfig()
	cfg.LabelBalancing = labelBalancing(false, true, "full", "archive", "fast")
	labels := [][]string{{"full"}, {"archive"}, {"fast", "full"}}
	peers := make([]Peer, n)
	for i := range peers {
		peers[i] = Peer{
			ID:     fmt.Sprintf("12D3KooW%040d", i),
			Labels: labels[i%len(labels)],
			Types:  []TypeInfo{{Name: "sha256"}, {Name: "block", Head: uint64(1000 + i%7), HasHead: true}}[:types],
			Load:   float64(i%10) / 10,
		}
	}
	s, _ := newSelector(b, cfg, peers...)
	for i := range peers {
		st := s.rates[rateKey{peers[i].ID, "sha256"}]
		for k := range 4 {
			o := Success
			if (i+k)%9 == 0 {
				o = RetryableError
			}
			st.record(o, time.Duration(1+i%13)*time.Millisecond, s.clock.Now(), cfg.Rating.Window, float64(cfg.Rating.MinSamples), false)
		}
	}
	s.Refresh()
	return s
}

// BenchmarkPlanFirstPick measures making a plan and getting its first peer,
// with three label groups: the request path. It must not grow with the
// number of peers.
func BenchmarkPlanFirstPick(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			firstPicks(b, benchSelector(b, n))
		})
	}
}

// firstPicks times plans of s and their first peers, for "sha256".
func firstPicks(b *testing.B, s *Selector) {
	req := Request{WorkType: "sha256"}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p := s.Plan(req)
		pk, ok := p.Next()
		if !ok {
			b.Fatal("nothing offered")
		}
		p.Report(pk, Cancelled, 0)
	}
}

// BenchmarkRankRefresh measures rebuilding the ranking snapshot, off the
// request path, at 10,000 peers serving one work type each (the goal's
// case) and two each (twice the entries).
func BenchmarkRankRefresh(b *testing.B) {
	for _, types := range []int{1, 2} {
		b.Run(fmt.Sprintf("peers=10000/types=%d", types), func(b *testing.B) {
			s := benchSelectorTypes(b, 10000, types)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				s.Refresh()
			}
		})
	}
}

// BenchmarkPlanFirstPickFewRated is BenchmarkPlanFirstPick in a network
// where a dispatcher has rated only a few of the peers (a large network:
// most peers have too few outcomes here to be judged), so that most first
// picks, with the exploration budget spent, must find a rated peer behind
// the unrated ones that a group lists first. It must not grow with the
// number of peers either.
func BenchmarkPlanFirstPickFewRated(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			cfg := testConfig()
			peers := make([]Peer, n)
			for i := range peers {
				peers[i] = peer(fmt.Sprintf("12D3KooW%040d", i))
			}
			s, _ := newSelector(b, cfg, peers...)
			for i := range 5 { // five rated peers
				st := s.rates[rateKey{peers[i*(n/5)].ID, "sha256"}]
				for range 4 {
					st.record(Success, time.Millisecond, s.clock.Now(), cfg.Rating.Window, float64(cfg.Rating.MinSamples), false)
				}
			}
			s.Refresh()
			firstPicks(b, s)
		})
	}
}

// BenchmarkLivenessDueTick is one tick of a dispatcher's poll loop at the
// default poll-interval and poll-budget, with 200 and 10,000 peers: the due
// polls are asked for every 50ms and each is answered at once, so that a
// tick finds a few due among many.
func BenchmarkLivenessDueTick(b *testing.B) {
	for _, n := range []int{200, 10000} {
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			clk := testkit.NewFakeClock()
			l, err := NewLiveness(config.Defaults().Liveness, clk)
			if err != nil {
				b.Fatal(err)
			}
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprintf("peer-%05d", i)
			}
			l.handles(ids)
			polls := 0
			for b.Loop() {
				clk.Advance(50 * time.Millisecond)
				for _, p := range l.DuePolls() {
					l.ReportPoll(p, true)
					polls++
				}
			}
			b.ReportMetric(float64(polls)/float64(b.N), "polls/tick")
		})
	}
}
