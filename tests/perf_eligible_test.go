package tests

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
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
// 2s poll-interval, so a few may still fall in either part). ratio is the
// median of the per-iteration ratios. Goal: at most 3.
//
// A peer is not alive before its first good poll, so a dispatcher must
// also connect to the new node and hear it answer, which no gossip
// message does. floor is the raw message's time plus that: 19 hosts
// dialing a new bare libp2p host at once and each exchanging one stream
// round trip with it (coldFirstExchanges), and floor-ratio is eligible
// over floor, per iteration.
// node-new-ms (node.New returning) and in-tables-ms (the last of the 19
// peer tables holding the record) break the eligible time down.
func BenchmarkPerfEligibleVsRawGossip(b *testing.B) {
	const others, iterations = 19, 40
	hits := newHitCounter()
	gws := make([]*member, others)
	gws[0] = startMember(b, hits, memberSpec{name: "m0", cfg: productionSettings, opts: []node.Option{rawTopicOption}}, nil)
	for i := 1; i < others; i++ {
		gws[i] = startMember(b, hits, memberSpec{name: fmt.Sprintf("m%d", i), cfg: productionSettings, opts: []node.Option{rawTopicOption}}, gws[0])
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
	var elig, tabled, news, raws, floors []time.Duration
	var ratios, floorRatios []float64
	for b.Loop() {
		for i := range iterations {
			cfg := testNodeConfig(b, spec, boot)
			start := time.Now()
			n, err := node.New(ctx, cfg, node.WithLogger(testLogger()), rawTopicOption)
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
			cold := coldFirstExchanges(b, ctx, gws)
			floors = append(floors, raw+cold)
			floorRatios = append(floorRatios, float64(last.Sub(start))/float64(raw+cold))
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
	b.ReportMetric(ms(median(floors)), "floor-ms")
	b.ReportMetric(median(floorRatios), "floor-ratio")
	b.ReportMetric(ms(median(tabled)), "in-tables-ms")
	b.ReportMetric(ms(median(news)), "node-new-ms")
	b.Logf("n=%d: median eligible at 19 dispatchers %s (node.New returned after %s, in their peer tables after %s), median raw gossip to 19 hosts %s, median ratio %.2f; raw gossip then 19 first exchanges %s, median ratio %.2f",
		len(elig), e, median(news), median(tabled), r, ratio, median(floors), median(floorRatios))
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

// coldFirstExchanges measures what a first poll of a new peer costs at
// its least: the hosts of gws dial a new bare libp2p host at once, each
// opens a stream to it and has one byte echoed; it returns the time
// until the last has its echo.
func coldFirstExchanges(b *testing.B, ctx context.Context, gws []*member) time.Duration {
	b.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings(loopbackQUIC), libp2p.DisableRelay())
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	serveBareEcho(h)
	target := peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()}
	start := time.Now()
	last, err := awaitAll(len(gws), func(i int) error {
		gh := gws[i].node.Host()
		if err := gh.Connect(ctx, target); err != nil {
			return err
		}
		s, err := gh.NewStream(ctx, target.ID, bareEchoProtocol)
		if err != nil {
			return err
		}
		defer s.Close()
		if _, err := s.Write([]byte{1}); err != nil {
			return err
		}
		if err := s.CloseWrite(); err != nil {
			return err
		}
		var got [1]byte
		_, err = io.ReadFull(s, got[:])
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, g := range gws {
		_ = g.node.Host().Network().ClosePeer(target.ID)
	}
	return last.Sub(start)
}
