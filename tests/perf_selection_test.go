package tests

import (
	"fmt"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/selection"
)

// perfSelector returns a selector of n candidates over three label groups,
// every one of them rated, built through the public API the dispatcher
// uses: SetPeers, then plans whose outcomes are reported.
func perfSelector(b *testing.B, n int) *selection.Selector {
	b.Helper()
	cfg := config.Defaults()
	include := true
	cfg.LabelBalancing = &config.LabelBalancingConfig{Order: []string{"full", "archive", "fast"}, IncludeDefault: &include}
	// Rating everyone below explores every peer: no exploration budget
	// (explore-share) holds the unrated back.
	cfg.Trust.ExploreShare = 1
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	s, err := selection.New(cfg, selection.WithSeed(1))
	if err != nil {
		b.Fatal(err)
	}
	labels := [][]string{{"full"}, {"archive"}, {"fast", "full"}}
	peers := make([]selection.Peer, n)
	for i := range peers {
		peers[i] = selection.Peer{
			ID:     fmt.Sprintf("12D3KooW%040d", i),
			Labels: labels[i%len(labels)],
			Types:  []selection.TypeInfo{{Name: "sha256"}, {Name: "block", Head: uint64(1000 + i%7), HasHead: true}},
			Load:   float64(i%10) / 10,
		}
	}
	s.SetPeers(peers)
	// Rate everyone, a batch at a time. An unrated peer is offered to one
	// request at a time, so plans held open at once take distinct peers,
	// and unrated peers come first, so the same batch is offered again
	// until a refresh ranks it rated. Samples decay: MinSamples+1 rounds
	// make sure the weighted count passes MinSamples. A label constraint
	// reaches the peers of each group.
	const batch = 200
	for _, labels := range [][]string{{"full"}, {"archive"}} {
		req := selection.Request{WorkType: "sha256", Labels: labels}
		for {
			var plans []*selection.Plan
			var picks []selection.Pick
			for round := range cfg.Rating.MinSamples + 1 {
				plans, picks = plans[:0], picks[:0]
				for range batch {
					p := s.Plan(req)
					pk, ok := p.Next()
					if !ok || pk.Rated {
						p.Report(pk, selection.Cancelled, 0)
						break
					}
					plans, picks = append(plans, p), append(picks, pk)
				}
				for i, p := range plans {
					o := selection.Success
					if (i+round)%9 == 0 {
						o = selection.RetryableError
					}
					p.Report(picks[i], o, time.Duration(1+i%13)*time.Millisecond)
				}
			}
			s.Refresh()
			if len(plans) < batch {
				break
			}
		}
	}
	rated := map[string]bool{} // a peer in several groups is ranked once per group
	for _, r := range s.Ranking("sha256") {
		if r.Rated {
			rated[r.Peer] = true
		}
	}
	if len(rated) < n {
		b.Fatalf("%d of %d peers rated", len(rated), n)
	}
	return s
}

// firstPick makes one request's plan and takes its first peer: the
// request path of the selection core.
func firstPick(b *testing.B, s *selection.Selector, req selection.Request) {
	p := s.Plan(req)
	pk, ok := p.Next()
	if !ok {
		b.Fatal("nothing offered")
	}
	p.Report(pk, selection.Cancelled, 0)
}

// BenchmarkPerfSelectionFirstPick measures the selection core's first pick
// (plan and first peer, three label groups, everyone rated) at 100, 1,000
// and 10,000 peers against itself at 100, interleaved: each round times a
// batch at every size in turn, so the sizes share the machine's noise.
// BenchmarkPlanFirstPick in selection/ measures the same thing one size
// after another. ratio is the median of the per-round ratios of 10,000 to
// 100 peers (ratio-1000 of 1,000 to 100). Goal: flat, at most 1.5.
func BenchmarkPerfSelectionFirstPick(b *testing.B) { benchFirstPick(b, perfSelector) }

// benchFirstPick times first picks of the selectors newSelector makes for
// 100, 1,000 and 10,000 peers, interleaved (see
// BenchmarkPerfSelectionFirstPick).
func benchFirstPick(b *testing.B, newSelector func(*testing.B, int) *selection.Selector) {
	sizes := []int{100, 1000, 10000}
	sels := make([]*selection.Selector, len(sizes))
	for i, n := range sizes {
		sels[i] = newSelector(b, n)
	}
	const rounds, batch = 21, 50000
	req := selection.Request{WorkType: "sha256"}
	nsop := make([][]float64, len(sizes))
	var r1000, r10000 []float64
	b.ReportAllocs()
	for b.Loop() {
		for r := range rounds {
			round := make([]float64, len(sizes))
			for k := range sizes {
				i := (k + r) % len(sizes) // rotate which size goes first
				start := time.Now()
				for range batch {
					firstPick(b, sels[i], req)
				}
				round[i] = float64(time.Since(start).Nanoseconds()) / batch
				nsop[i] = append(nsop[i], round[i])
			}
			r1000 = append(r1000, round[1]/round[0])
			r10000 = append(r10000, round[2]/round[0])
		}
	}
	reportFigure(b, median(nsop[2]), median(nsop[0]), "ns/op", median(r10000))
	b.ReportMetric(median(nsop[1]), "workmesh-1000-ns/op")
	b.ReportMetric(median(r1000), "ratio-1000")
	b.Logf("first pick, median of %d rounds of %d: 100 peers %.0f ns, 1,000 %.0f ns, 10,000 %.0f ns; ratios to 100: %.2f, %.2f",
		rounds, batch, median(nsop[0]), median(nsop[1]), median(nsop[2]), median(r1000), median(r10000))
}

// fewRatedSelector returns a selector of n peers of which only five are
// rated, as at a dispatcher of a large network, with the shipped
// exploration budget (explore-share).
func fewRatedSelector(b *testing.B, n int) *selection.Selector {
	b.Helper()
	cfg := config.Defaults()
	s, err := selection.New(cfg, selection.WithSeed(1))
	if err != nil {
		b.Fatal(err)
	}
	peers := make([]selection.Peer, n)
	for i := range peers {
		peers[i] = selection.Peer{ID: fmt.Sprintf("12D3KooW%040d", i), Types: []selection.TypeInfo{{Name: "sha256"}}}
		if i%(n/5) == 0 {
			peers[i].Labels = []string{"rated"} // how the five are reached to be rated
		}
	}
	s.SetPeers(peers)
	req := selection.Request{WorkType: "sha256", Labels: []string{"rated"}}
	for range 40 * (cfg.Rating.MinSamples + 1) {
		p := s.Plan(req)
		pk, ok := p.Next()
		if !ok {
			b.Fatal("nothing offered")
		}
		p.Report(pk, selection.Success, time.Millisecond)
		s.Refresh()
	}
	rated := 0
	for _, r := range s.Ranking("sha256") {
		if r.Rated {
			rated++
		}
	}
	if rated != 5 {
		b.Fatalf("%d peers rated, want 5", rated)
	}
	return s
}

// BenchmarkPerfSelectionFirstPickFewRated is BenchmarkPerfSelectionFirstPick
// where only five of the peers are rated: with the exploration budget
// spent, most first picks must find a rated peer behind the unrated ones.
// Goal: flat, at most 1.5 (10,000 against 100 peers).
func BenchmarkPerfSelectionFirstPickFewRated(b *testing.B) {
	benchFirstPick(b, fewRatedSelector)
}
