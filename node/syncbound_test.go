package node

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// TestSyncOfAPeersOwnRecordTakesThatRecordOnly: any peer can have the node
// fetch its own record (a health answer naming a newer one, joining the
// gossip topic); its answer of its own record and 1,023 made-up peers'
// brought all 1,024 into the table, and ten such answers filled it. Only
// the answering peer's own record is taken.
func TestSyncOfAPeersOwnRecordTakesThatRecordOnly(t *testing.T) {
	a := startTestNode(t, testConfig(t))
	p := newPeerKey(t)
	h := bareHost(t, p)
	own := p.record(t, 1)
	var fakes [][]byte
	for range 100 {
		fakes = append(fakes, newPeerKey(t).record(t, 1))
	}
	h.SetStreamHandler(NodeDataProtocol(testNetwork), func(s network.Stream) {
		defer s.Close()
		var req nodedataRequest
		if err := readJSONFrame(s, &req, maxRequestFrame); err != nil {
			s.Reset()
			return
		}
		if req.Push {
			if _, err := readFrame(s, MaxRecordSize); err != nil {
				s.Reset()
				return
			}
		}
		for _, f := range append([][]byte{own}, fakes...) {
			if err := writeFrame(s, f); err != nil {
				return
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Connect(ctx, peer.AddrInfo{ID: a.ID(), Addrs: a.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	before := a.table.Len()
	if _, err := a.fetchNodeData(ctx, p.id, false); err != nil {
		t.Fatalf("fetch of the peer's own record: %v", err)
	}
	if _, ok := a.table.Get(p.id); !ok {
		t.Fatal("the answering peer's own record was not taken")
	}
	if got := a.table.Len() - before; got != 1 {
		t.Errorf("an answer to a fetch of the peer's own record added %d peers to the table, want 1", got)
	}
}
