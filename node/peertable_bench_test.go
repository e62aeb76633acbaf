package node

import (
	"fmt"
	"testing"

	"github.com/workmesh/workmesh/tests/testkit"
)

// BenchmarkPeerTableOffer measures entering a newer record of a known peer
// in a table of n peers (each peer re-announces when its load changes), and
// the same with a reader of the whole table (a dispatcher's sync) after
// every 100 records.
func BenchmarkPeerTableOffer(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		for _, reads := range []bool{false, true} {
			b.Run(fmt.Sprintf("peers=%d/reads=%v", n, reads), func(b *testing.B) {
				tb, _ := newTestTable(b, testkit.NewFakeClock())
				recs := make([]*SignedNodeData, n)
				for i := range recs {
					_, id := newKey(b)
					recs[i] = &SignedNodeData{Data: NodeData{PeerID: id, Network: testNetwork, Sequence: 1}}
					if _, err := tb.Offer(recs[i], id, SourceGossip); err != nil {
						b.Fatal(err)
					}
				}
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					sd := *recs[i%n]
					sd.Data.Sequence = uint64(i + 2)
					if _, err := tb.Offer(&sd, sd.Data.PeerID, SourceGossip); err != nil {
						b.Fatal(err)
					}
					if reads && i%100 == 99 {
						if got := len(tb.Peers()); got != n {
							b.Fatalf("%d peers, want %d", got, n)
						}
					}
				}
			})
		}
	}
}
