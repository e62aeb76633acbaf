package tests

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/selection"
)

// awaitEligible waits until every gateway's selector ranks id alive for
// workType and returns the time the last one did. A gateway is checked at
// every new ranking it publishes (a new peer is ranked as its dispatcher
// syncs the peer table), and every 20ms for a change of liveness alone,
// which publishes none; waiting on events rather than polling keeps the
// measurement from competing for the CPU with what it measures.
func awaitEligible(ctx context.Context, gws []*member, workType string, id peer.ID) (time.Time, error) {
	return awaitAll(len(gws), func(i int) error {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		sel := gws[i].disp.Selector()
		for {
			ch := sel.Changed()
			if slices.ContainsFunc(sel.Ranking(workType), func(r selection.Ranked) bool {
				return r.Peer == string(id) && r.State == selection.StateAlive
			}) {
				return nil
			}
			select {
			case <-ch:
			case <-tick.C:
			case <-ctx.Done():
				return fmt.Errorf("gateway %d: not eligible: %w", i, ctx.Err())
			}
		}
	})
}

// BenchmarkPerfEligibleVsRawGossip extends BenchmarkNetworkJoinVsRawGossip
// from peer tables to dispatchers: 19 full members (node, worker, server
// and a running dispatcher, shipped poll settings) and per iteration a new
// node serving echo. eligible is the time from calling node.New to the
// last of the 19 dispatchers ranking the node alive for echo, so that a
// request there could be sent to it; raw is the time a raw gossipsub
// message the new node then publishes takes to reach the same 19 hosts,
// 300ms later, when the join's own traffic (syncs, DHT refresh) has passed
// (the dispatchers' first polls of the new node are spread over their
// 2s poll-interval, so a few may still fall in either part). ratio is the median of the per-iteration ratios. Goal: at most 3.
// node-new-ms (node.New returning) and in-tables-ms (the last of the 19
// peer tables holding the record) break the eligible time down.
func BenchmarkPerfEligibleVsRawGossip(b *testing.B) {
	const others, iterations = 19, 40
	hits := newHitCounter()
	gws := make([]*member, others)
	gws[0] = startMember(b, hits, memberSpec{name: "m0", cfg: productionSettings}, nil)
	for i := 1; i < others; i++ {
		gws[i] = startMember(b, hits, memberSpec{name: fmt.Sprintf("m%d", i), cfg: productionSettings}, gws[0])
	}
	tables := make([]*node.PeerTable, others)
	members := make([]*rawMember, others)
	for i, m := range gws {
		tables[i] = m.node.Peers()
		members[i] = joinRaw(b, m.node)
	}
	waitFor(b, 30*time.Second, "19 nodes list each other", func() error {
		for i, m := range gws {
			if got := m.node.Peers().Len(); got != others-1 {
				return fmt.Errorf("node %d lists %d peers", i, got)
			}
		}
		return nil
	}, tables...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	settleRawGossip(b, ctx, members)

	boot := addrStrings(gws[0].node)
	spec := nodeSpec{workTypes: []string{"echo"}}
	var elig, tabled, news, raws []time.Duration
	var ratios []float64
	for b.Loop() {
		for i := range iterations {
			cfg := testNodeConfig(b, spec, boot)
			start := time.Now()
			n, err := node.New(ctx, cfg, node.WithLogger(testLogger()))
			if err != nil {
				b.Fatal(err)
			}
			built := time.Since(start)
			var known time.Time
			var kerr error
			var kwg sync.WaitGroup
			kwg.Go(func() { known, kerr = awaitKnown(ctx, tables, n.ID()) })
			last, err := awaitEligible(ctx, gws, "echo", n.ID())
			kwg.Wait()
			if err != nil || kerr != nil {
				b.Fatal(err, kerr)
			}
			// A measurement pause, not a wait for a condition: the raw
			// message is sent once the join's own traffic has passed.
			time.Sleep(300 * time.Millisecond)
			raw := rawGossip(b, ctx, n, members, fmt.Sprintf("raw-%d", i))
			elig = append(elig, last.Sub(start))
			tabled = append(tabled, known.Sub(start))
			news = append(news, built)
			raws = append(raws, raw)
			ratios = append(ratios, float64(last.Sub(start))/float64(raw))
			n.Close()
		}
	}
	e, r, ratio := median(elig), median(raws), median(ratios)
	reportFigure(b, ms(e), ms(r), "ms", ratio)
	b.ReportMetric(ms(median(tabled)), "in-tables-ms")
	b.ReportMetric(ms(median(news)), "node-new-ms")
	b.Logf("n=%d: median eligible at 19 dispatchers %s (node.New returned after %s, in their peer tables after %s), median raw gossip to 19 hosts %s, median ratio %.2f",
		len(elig), e, median(news), median(tabled), r, ratio)
}

// settleRawGossip waits until gossipsub meshes have formed: three raw
// messages in a row reach every member within 20ms (at most 200 tries).
func settleRawGossip(b *testing.B, ctx context.Context, members []*rawMember) {
	b.Helper()
	for i, fast := 0, 0; fast < 3; i++ {
		if i == 200 {
			b.Logf("raw gossip did not settle below 20ms; measuring anyway")
			return
		}
		from := i % len(members)
		want := fmt.Sprintf("warmup-%d", i)
		start := time.Now()
		if err := members[from].topic.Publish(ctx, []byte(want)); err != nil {
			b.Fatal(err)
		}
		rest := slices.Delete(slices.Clone(members), from, from+1)
		last, err := awaitRaw(ctx, rest, want)
		if err != nil {
			b.Fatal(err)
		}
		if last.Sub(start) < 20*time.Millisecond {
			fast++
		} else {
			fast = 0
		}
	}
}
