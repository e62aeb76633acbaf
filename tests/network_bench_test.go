package tests

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	lpubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/node"
)

// rawTopic is a plain gossipsub topic on the same hosts, the baseline the
// NodeData path is compared with.
const rawTopic = "workmesh/bench/raw/1"

// rawTopicOption lets a node's gossipsub join rawTopic beside the network's.
var rawTopicOption = node.WithGossipTopics(rawTopic)

// rawMember receives the raw topic on one node and reports arrival times.
type rawMember struct {
	topic *lpubsub.Topic
	sub   *lpubsub.Subscription
}

func joinRaw(tb testing.TB, n *node.Node) *rawMember {
	tb.Helper()
	topic, err := n.Gossip().PubSub().Join(rawTopic)
	if err != nil {
		tb.Fatalf("join raw topic: %v", err)
	}
	sub, err := topic.Subscribe()
	if err != nil {
		tb.Fatalf("subscribe raw topic: %v", err)
	}
	tb.Cleanup(func() { sub.Cancel(); topic.Close() })
	return &rawMember{topic: topic, sub: sub}
}

// awaitAll runs wait(i) for each i below n at once; each returns nil when
// its condition holds. It returns the time the last one held, or every
// error there was.
func awaitAll(n int, wait func(i int) error) (time.Time, error) {
	var (
		mu   sync.Mutex
		last time.Time
		wg   sync.WaitGroup
		errs = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			if errs[i] = wait(i); errs[i] != nil {
				return
			}
			now := time.Now()
			mu.Lock()
			if now.After(last) {
				last = now
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return time.Time{}, err
	}
	return last, nil
}

// awaitRaw waits until every member received a message with payload want and
// returns the time the last one did.
func awaitRaw(ctx context.Context, members []*rawMember, want string) (time.Time, error) {
	return awaitAll(len(members), func(i int) error {
		for {
			msg, err := members[i].sub.Next(ctx)
			if err != nil {
				return fmt.Errorf("member %d: %w", i, err)
			}
			if string(msg.Data) == want {
				return nil
			}
		}
	})
}

// rawGossip joins n to the raw topic, publishes want there once n's gossip
// can send to a peer on it, and returns the time the message took to reach
// every member.
func rawGossip(b *testing.B, ctx context.Context, n *node.Node, members []*rawMember, want string) time.Duration {
	b.Helper()
	m := joinRaw(b, n)
	defer m.sub.Cancel()
	if err := awaitRawPeer(ctx, m, n); err != nil {
		b.Fatal(err)
	}
	pub := time.Now()
	if err := m.topic.Publish(ctx, []byte(want)); err != nil {
		b.Fatal(err)
	}
	last, err := awaitRaw(ctx, members, want)
	if err != nil {
		b.Fatal(err)
	}
	return last.Sub(pub)
}

// awaitRawPeer waits until m's gossip knows a peer on the raw topic and n's
// gossipsub has its own stream to that peer open, so that a message m
// publishes has somewhere to go: published before that stream opens, it
// would be dropped and never arrive. Neither change has an event of its own
// here, so it checks every millisecond, before the measurement starts.
func awaitRawPeer(ctx context.Context, m *rawMember, n *node.Node) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !slices.ContainsFunc(m.topic.ListPeers(), n.Gossip().HasStream) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("new node has no stream to a peer on the raw topic (peers %v): %w", m.topic.ListPeers(), ctx.Err())
		}
	}
	return nil
}

// awaitKnown waits until every table holds id and returns the time the last
// one did.
func awaitKnown(ctx context.Context, tables []*node.PeerTable, id peer.ID) (time.Time, error) {
	return awaitAll(len(tables), func(i int) error {
		for {
			ch := tables[i].Changed()
			if _, ok := tables[i].Get(id); ok {
				return nil
			}
			select {
			case <-ch:
			case <-ctx.Done():
				return fmt.Errorf("table %d: %w", i, ctx.Err())
			}
		}
	})
}

// BenchmarkNetworkJoinVsRawGossip measures, per iteration, how long a newly
// started node takes to appear in the peer tables of 19 running nodes
// (join-ms: from calling node.New, so including building the host and
// dialing the bootstrap node, to the last of the 19 tables holding its
// record), and how long a raw gossipsub message published by that node then
// takes to reach the same 19 hosts (raw-ms). Both are medians over b.N
// iterations, and join/raw is the median of the per-iteration ratios; ns/op
// covers a whole iteration and is not the figure to read.
// The goal is join/raw <= 3. Run with -benchtime 30x or so.
func BenchmarkNetworkJoinVsRawGossip(b *testing.B) {
	const others = 19
	nodes := make([]*node.Node, others)
	spec := nodeSpec{workTypes: []string{"echo"}}
	nodes[0] = startNode(b, testNodeConfig(b, spec, nil), rawTopicOption)
	boot := addrStrings(nodes[0])
	for i := 1; i < others; i++ {
		nodes[i] = startNode(b, testNodeConfig(b, spec, boot), rawTopicOption)
	}
	tables := make([]*node.PeerTable, others)
	members := make([]*rawMember, others)
	for i, n := range nodes {
		tables[i] = n.Peers()
		members[i] = joinRaw(b, n)
	}
	waitFor(b, 20*time.Second, "19 nodes list each other", func() error {
		for i, n := range nodes {
			if got := n.Peers().Len(); got != others-1 {
				return fmt.Errorf("node %d lists %d peers", i, got)
			}
		}
		return nil
	}, tables...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Meshes form at gossipsub heartbeats and every node refreshes its DHT
	// routing table half a second after joining: the network has settled
	// when three raw messages in a row reach everyone within 20ms.
	for i, fast := 0, 0; fast < 3; i++ {
		if i == 200 {
			b.Logf("raw gossip did not settle below 20ms; measuring anyway")
			break
		}
		from := i % others
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

	var joins, raws []time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cfg := testNodeConfig(b, spec, boot)
		start := time.Now()
		n, err := node.New(ctx, cfg, node.WithLogger(testLogger()), rawTopicOption)
		if err != nil {
			b.Fatal(err)
		}
		last, err := awaitKnown(ctx, tables, n.ID())
		if err != nil {
			b.Fatal(err)
		}
		joins = append(joins, last.Sub(start))

		// The raw message takes the same path: published by the new node,
		// which is connected to the bootstrap node only, flooded to it and
		// relayed through the mesh. It is published once the new node's
		// gossip knows a peer on the raw topic and has its own stream to it
		// (awaitRawPeer): the record can be in every table before the new
		// node's gossip has exchanged subscriptions.
		raws = append(raws, rawGossip(b, ctx, n, members, fmt.Sprintf("raw-%d", i)))
		n.Close()
	}
	b.StopTimer()
	// Each iteration's ratio compares the two figures under the same load
	// on the shared machine; join/raw is the median of those ratios.
	ratios := make([]float64, len(joins))
	for i := range joins {
		ratios[i] = float64(joins[i]) / float64(raws[i])
	}
	join, raw, ratio := median(joins), median(raws), median(ratios)
	b.ReportMetric(ms(join), "join-ms")
	b.ReportMetric(ms(raw), "raw-ms")
	b.ReportMetric(ratio, "join/raw")
	b.Logf("n=%d: median join %s, median raw gossip %s, median ratio %.2f", len(joins), join, raw, ratio)
}

func median[T cmp.Ordered](v []T) T {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
