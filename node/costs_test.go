package node

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"syscall"
	"testing"
	"time"

	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/workmesh/workmesh/node/authority"
	"github.com/workmesh/workmesh/node/frame"
	"github.com/workmesh/workmesh/pubsub"
	"github.com/workmesh/workmesh/tests/testkit"
)

// signedSeries returns n records of one peer with sequences 1 to n, signed
// ahead so that a benchmark times what a receiver does only.
func signedSeries(tb testing.TB, p peerKey, n int, edit ...func(*NodeData)) [][]byte {
	tb.Helper()
	recs := make([][]byte, n)
	for i := range recs {
		recs[i] = p.record(tb, uint64(i+1), edit...)
	}
	return recs
}

// gossipMessageBytes is what one record costs on a gossip stream: the RPC
// carrying it as one published message on the network's topic (no author,
// sequence number or signature: see pubsub.New), with its length prefix.
func gossipMessageBytes(record []byte) int {
	topic := pubsub.TopicName(testNetwork)
	rpc := pb.RPC{Publish: []*pb.Message{{Data: record, Topic: &topic}}}
	n := proto.Size(&rpc)
	return n + len(binary.AppendUvarint(nil, uint64(n)))
}

// processCPU is the CPU time the process has used so far.
func processCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPerMessageCosts measures what one message of the network's
// steady state costs, the inputs of a table of the costs per node at
// internet scale (bench/README.md):
//
//   - gossip-validate: the CPU to validate one gossiped record at a node
//     (size, signature, decode, the peer table's rules: gossip.verify on a
//     running node, open network), and members-validate the same in a
//     closed network (the membership certificate checked too), in
//     µs/record; record-bytes is a typical signed record, gossip-msg-bytes
//     the same as one gossip message on the wire.
//   - health-ping: one health ping and its answer between two nodes on the
//     in-memory mock network, CPU of both ends per ping (ping-cpu-µs) and
//     the bytes of the request and the answer frames (ping-bytes,
//     answer-bytes).
func BenchmarkPerMessageCosts(b *testing.B) {
	b.Run("gossip-validate", func(b *testing.B) {
		hosts := linkedMockHosts(b, 1)
		n := startTestNode(b, testConfig(b), WithHost(hosts[0]))
		p, from := newPeerKey(b), newPeerKey(b)
		recs := signedSeries(b, p, b.N)
		b.ResetTimer()
		for i := range b.N {
			if _, err := n.gossip.verify(from.id, recs[i]); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/record")
		b.ReportMetric(float64(len(recs[0])), "record-bytes")
		b.ReportMetric(float64(gossipMessageBytes(recs[0])), "gossip-msg-bytes")
	})
	b.Run("members-validate", func(b *testing.B) {
		clock := testkit.NewFakeClock()
		auth, err := authority.Generate()
		if err != nil {
			b.Fatal(err)
		}
		members, err := NewMembers(auth.Public(), testNetwork)
		if err != nil {
			b.Fatal(err)
		}
		_, self := newKey(b)
		tb := NewPeerTable(PeerTableConfig{Self: self, Network: testNetwork, TTL: testTTL, Clock: clock, Logger: quietLogger(), Members: members})
		p := newPeerKey(b)
		c, err := auth.Admit(testNetwork, p.id, []string{"zone-a"}, clock.Now().Add(-time.Minute), clock.Now().Add(time.Hour))
		if err != nil {
			b.Fatal(err)
		}
		cert := c.Encode()
		recs := signedSeries(b, p, b.N, func(nd *NodeData) { nd.Cert, nd.Labels = cert, []string{"zone-a"} })
		b.ResetTimer()
		for i := range b.N {
			sd, err := OpenNodeData(recs[i], testNetwork)
			if err != nil {
				b.Fatal(err)
			}
			if ok, err := tb.Offer(sd, "", SourceGossip); !ok || err != nil {
				b.Fatalf("offer: %t %v", ok, err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/record")
		b.ReportMetric(float64(len(recs[0])), "record-bytes")
		b.ReportMetric(float64(gossipMessageBytes(recs[0])), "gossip-msg-bytes")
	})
	b.Run("health-ping", func(b *testing.B) {
		hosts := linkedMockHosts(b, 2)
		cfgA := testConfig(b)
		cfgA.WorkTypes = []string{"echo"}
		a := startTestNode(b, cfgA, WithHost(hosts[0]), WithLocalState(stubState{}))
		bn := startTestNode(b, testConfig(b), WithHost(hosts[1]))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := bn.Host().Connect(ctx, peer.AddrInfo{ID: a.ID(), Addrs: a.Host().Addrs()}); err != nil {
			b.Fatal(err)
		}
		ans := a.healthAnswer()
		req, _ := json.Marshal(healthRequest{})
		body, _ := json.Marshal(ans)
		cpu0 := processCPU(b)
		b.ResetTimer()
		for b.Loop() {
			if _, _, err := bn.Ping(ctx, a.ID()); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "ping-cpu-µs")
		b.ReportMetric(float64(frame.HeaderLen+len(req)), "ping-bytes")
		b.ReportMetric(float64(frame.HeaderLen+len(body)), "answer-bytes")
	})
}
