package tests

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/selection"
)

// memSample is the process's memory after a full collection.
type memSample struct {
	heap uint64 // bytes of live heap objects
	rss  uint64 // resident set size in bytes, from /proc/self/statm
}

func sampleMemory(tb testing.TB) memSample {
	tb.Helper()
	runtime.GC()
	debug.FreeOSMemory() // a second collection, and freed pages go back to the OS
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	raw, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		tb.Fatalf("statm: %v", err)
	}
	f := strings.Fields(string(raw))
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		tb.Fatalf("statm %q: %v", raw, err)
	}
	return memSample{heap: ms.HeapAlloc, rss: pages * uint64(os.Getpagesize())}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// BenchmarkPerfMemoryThousandPeers measures the resident memory of one full
// member (node, worker, server, running dispatcher, shipped settings)
// tracking 1,000 peers against the same member tracking none, in one
// process: 1,000 NodeData records signed with fresh keys are entered into
// its peer table (as a sync from a peer would), the dispatcher takes them
// into its selector and starts polling them, and the process is measured
// after a full collection. The peers' addresses are a loopback UDP port
// that swallows every packet, so their polls time out as a dead peer's
// would. Connections are not part of the figure: there are none to make.
// The records are made before the first measurement and entered as copies,
// so the difference is what the node holds. Goal: at most 16 MiB more.
func BenchmarkPerfMemoryThousandPeers(b *testing.B) {
	const peers = 1000
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	addr := fmt.Sprintf("/ip4/127.0.0.1/udp/%d/quic-v1", pc.LocalAddr().(*net.UDPAddr).Port)

	m := startMember(b, newHitCounter(), memberSpec{name: "tracker", cfg: productionSettings}, nil)
	records := make([][]byte, peers)
	for i := range records {
		key, id := newIdentity(b)
		head := uint64(1000 + i)
		nd := node.NodeData{
			PeerID: id, Addrs: []string{addr}, Version: "bench", Network: m.node.Network(),
			WorkTypes: []node.WorkType{{Name: "echo"}, {Name: "sha256"}, {Name: "block", Head: &head}},
			Labels:    []string{[]string{"full", "archive", "fast"}[i%3]},
			Capacity:  node.Capacity{MaxConcurrent: 4, QueueSize: 100},
			StartTime: time.Now(), Sequence: 1,
		}
		if records[i], err = node.SignNodeData(nd, key); err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond) // the member's start-up work settles
	var before, after memSample
	for b.Loop() {
		before = sampleMemory(b)
		from := m.node.ID() // as if relayed by a peer; the signature is what counts
		for _, rec := range records {
			if _, err := m.node.Peers().Submit(bytes.Clone(rec), from, node.SourceSync); err != nil {
				b.Fatal(err)
			}
		}
		waitFor(b, 10*time.Second, "the selector ranks 1,000 peers", func() error {
			if got := len(m.disp.Selector().Ranking("echo")); got < peers {
				return fmt.Errorf("%d ranked", got)
			}
			return nil
		})
		// Polls run: a few seconds of them, at the shipped poll-interval.
		time.Sleep(3 * time.Second)
		after = sampleMemory(b)
	}
	counts := m.disp.Selector().Liveness().Counts()
	dr, dh := mib(after.rss)-mib(before.rss), mib(after.heap)-mib(before.heap)
	reportFigure(b, mib(after.rss), mib(before.rss), "MiB", mib(after.rss)/mib(before.rss))
	b.ReportMetric(dr, "delta-MiB")
	b.ReportMetric(dh, "heap-delta-MiB")
	b.Logf("%d peers: RSS %.1f -> %.1f MiB (+%.1f), live heap %.1f -> %.1f MiB (+%.1f); table %d, liveness %v",
		peers, mib(before.rss), mib(after.rss), dr, mib(before.heap), mib(after.heap), dh,
		m.node.Peers().Len(), map[string]int{"alive": counts[selection.StateAlive], "unreachable": counts[selection.StateUnreachable], "probing": counts[selection.StateProbing]})
}
