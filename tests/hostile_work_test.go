package tests

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
	"github.com/workmesh/workmesh/workers/protocol"
)

// Hostile workers and hostile senders of work (issue "Hostile peers"):
// peers that accept work and never answer, peers that send all of a large
// request but its last byte, peers that fill the local worker.

// stallingHandler accepts work and never answers: it ignores its context
// and returns only when the test ends (release).
func stallingHandler(release <-chan struct{}) workers.Handler {
	return workers.HandlerFunc(func(context.Context, []byte) workers.Result {
		<-release
		return workers.OK(nil)
	})
}

// TestHostileStallingWorkersCordoned: five workers that accept work and
// never answer, two honest ones, a gateway at default liveness settings
// (quick polls). Stalls count against a worker as failures that its good
// health pings do not take away: after the first 10 s at most 5 % of the
// requests pay for a stall, and the peers view says why the stallers are
// out.
func TestHostileStallingWorkersCordoned(t *testing.T) {
	const (
		stallers = 5
		timeout  = 300 * time.Millisecond
		warmUp   = 10 * time.Second
		measure  = 6 * time.Second
		maxCalls = 2000
		every    = 10 * time.Millisecond // the pace of requests
	)
	hits := newHitCounter()
	gw := startMember(t, hits, memberSpec{name: "gateway"}, nil)
	release := make(chan struct{})
	quick := workers.HandlerFunc(func(context.Context, []byte) workers.Result { return workers.OK([]byte("ok")) })
	var all []*member
	for i := range stallers {
		all = append(all, startMember(t, hits, memberSpec{name: fmt.Sprintf("staller%d", i),
			handlers: map[string]workers.Handler{"job": stallingHandler(release)}}, gw))
	}
	for i := range 2 {
		all = append(all, startMember(t, hits, memberSpec{name: fmt.Sprintf("honest%d", i),
			handlers: map[string]workers.Handler{"job": quick}}, gw))
	}
	// Runs before the members stop (cleanups run last first): the stalled
	// handlers return, so the servers can close.
	t.Cleanup(func() { close(release) })
	waitRanked(t, gw, "job", len(all))
	name := peerName(append(all, gw)...)
	isStaller := map[string]bool{}
	for _, m := range all[:stallers] {
		isStaller[m.node.ID().String()] = true
	}

	start := time.Now()
	var warm, calls, stalled, failed int
	var example string
	pace := time.NewTicker(every)
	defer pace.Stop()
	for n := 0; n < maxCalls && time.Since(start) < warmUp+measure; n++ {
		<-pace.C
		res := gw.submit(t, dispatch.WorkRequest{Type: "job", Payload: []byte(strconv.Itoa(n)), Timeout: timeout})
		// A request pays for a stall when it gave work to a staller.
		paid := false
		for _, a := range res.Attempts {
			paid = paid || isStaller[a.Peer]
		}
		if time.Since(start) < warmUp {
			if paid {
				warm++
			}
			continue
		}
		calls++
		if res.Status != apiv1.StatusOK {
			failed++
		}
		if paid {
			stalled++
			example = describe(res, name)
		}
	}
	share := float64(stalled) / float64(max(calls, 1))
	t.Logf("stalling workers: %d requests paid for a stall in the first %s; after it %d of %d (%.1f %%); %d not ok", warm, warmUp, stalled, calls, 100*share, failed)
	if calls < 50 {
		t.Fatalf("only %d requests after the first %s", calls, warmUp)
	}
	// The peers view says why the stallers are out.
	reasons := map[string]string{}
	var view []string
	for _, ps := range gw.disp.PeerStatuses() {
		reasons[ps.ID] = ps.State + ": " + ps.Reason
		view = append(view, name(ps.ID)+" "+reasons[ps.ID])
	}
	if share > 0.05 {
		t.Fatalf("after %s, %d of %d requests (%.1f %%) paid for a stall, want at most 5 %%; e.g. %s; peers: %v", warmUp, stalled, calls, 100*share, example, view)
	}
	for _, m := range all[:stallers] {
		if r := reasons[m.node.ID().String()]; !strings.Contains(r, "stalled") {
			t.Errorf("peers view of %s: %q, want it to say it stalled", m.name, r)
		}
	}
}

// TestHostileLocalWorkerReservedForOwnClients: two peers send 60 long
// requests each to a gateway whose local worker runs 4 and queues 8; the
// gateway's own clients are still served, from the share local-reserve
// keeps for them. With no reserve the same load leaves them with "local
// worker busy", as measured before the reserve.
func TestHostileLocalWorkerReservedForOwnClients(t *testing.T) {
	for _, c := range []struct {
		reserve float64
		served  bool
	}{{0, false}, {0.25, true}} {
		t.Run(fmt.Sprintf("local-reserve %g", c.reserve), func(t *testing.T) {
			release := make(chan struct{})
			hold := workers.HandlerFunc(func(ctx context.Context, p []byte) workers.Result {
				if string(p) == "quick" {
					return workers.OK([]byte("served"))
				}
				select {
				case <-release:
				case <-ctx.Done():
				}
				return workers.OK(nil)
			})
			gw := startMember(t, newHitCounter(), memberSpec{name: "gateway", handlers: map[string]workers.Handler{"hold": hold},
				cfg: func(c2 *config.Config) {
					c2.Worker.LocalConcurrency, c2.Worker.WorkerBufferSize, c2.Worker.LocalReserve = 4, 8, c.reserve
				}}, nil)
			t.Cleanup(func() { close(release) })
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel() // ends the peers' requests before waiting for them
			for range 2 {
				h := hostileHost(t)
				connectTo(t, ctx, h, gw)
				client, err := protocol.NewClient(h, gw.node.Network())
				if err != nil {
					t.Fatal(err)
				}
				for i := range 60 {
					wg.Go(func() {
						_, _ = client.Do(ctx, gw.node.ID(), protocol.Request{ID: fmt.Sprint(i), Type: "hold", Payload: []byte("long")})
					})
				}
			}
			// The peers have filled what they may take.
			runMax, queueMax := 4, 8
			if c.reserve > 0 {
				run, places := gw.pool.Reserved()
				runMax, queueMax = 4-run, 8-places
			}
			testkit.WaitFor(t, 10*time.Second, "the peers to fill the local worker", func() error {
				if st := gw.pool.Stats(); st.InFlight < runMax || st.Queued < queueMax {
					return fmt.Errorf("%+v, want %d running and %d queued", st, runMax, queueMax)
				}
				return nil
			})
			st := gw.pool.Stats()
			res := gw.submit(t, dispatch.WorkRequest{Type: "hold", Payload: []byte("quick"), Timeout: 5 * time.Second})
			t.Logf("local-reserve %g: peers hold %d running, %d queued; own client: %s %q", c.reserve, st.InFlight, st.Queued, res.Status, res.Error)
			if c.served && (res.Status != apiv1.StatusOK || string(res.Output) != "served") {
				t.Fatalf("own client while peers saturate the local worker: %s %q", res.Status, res.Error)
			}
			if !c.served && !strings.Contains(res.Error, "local worker busy") {
				t.Fatalf("without a reserve the own client got %s %q; want local worker busy (the measurement this guards)", res.Status, res.Error)
			}
		})
	}
}

// hostileHost is a bare libp2p host on loopback, closed when the test ends.
func hostileHost(t testing.TB) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings(loopbackQUIC), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// connectTo connects h to the member m.
func connectTo(t testing.TB, ctx context.Context, h host.Host, m *member) {
	t.Helper()
	if err := h.Connect(ctx, peer.AddrInfo{ID: m.node.ID(), Addrs: m.node.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
}

// rssOf returns the resident set size of process pid, from /proc.
func rssOf(t testing.TB, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// TestHostileHeldRequestsReclaimed: ten identities open eight streams each
// to a gateway process and send all of a 1 MiB request but its last byte.
// The bytes of incomplete requests are bounded, so the gateway grows by
// little, and 10 s after the streams end its RSS is back within 20 MB of
// its quiet value.
func TestHostileHeldRequestsReclaimed(t *testing.T) {
	const (
		identities = 10
		streams    = 8
		body       = 1 << 20
	)
	bin := buildBinary(t)
	gw := startNodeProcess(t, bin)
	pid := gw.cmd.Process.Pid
	addr, err := ma.NewMultiaddr(gw.join)
	if err != nil {
		t.Fatal(err)
	}
	info, err := peer.AddrInfoFromP2pAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	hosts := make([]host.Host, identities)
	for i := range hosts {
		hosts[i] = hostileHost(t)
		if err := hosts[i].Connect(ctx, *info); err != nil {
			t.Fatal(err)
		}
	}
	quiet := rssOf(t, pid)
	msg := binary.BigEndian.AppendUint32(nil, body)
	msg = append(msg, make([]byte, body-1)...)
	pid0 := protocol.ProtocolID(config.Defaults().Node.Network)
	var wg, writes sync.WaitGroup
	var mu sync.Mutex
	sent := 0
	for _, h := range hosts {
		for range streams {
			writes.Add(1)
			wg.Go(func() {
				s, err := h.NewStream(ctx, info.ID, pid0)
				if err != nil {
					writes.Done()
					return
				}
				_, err = s.Write(msg)
				if err == nil {
					mu.Lock()
					sent++
					mu.Unlock()
				}
				writes.Done()
				// Held: the last byte never comes. The stream ends when
				// the gateway resets it or the host closes.
				var b [1]byte
				_, _ = s.Read(b[:])
			})
		}
	}
	// The hold: every write has been taken (whole, or cut by a reset).
	written := make(chan struct{})
	go func() { writes.Wait(); close(written) }()
	select {
	case <-written:
	case <-ctx.Done():
		t.Fatal("the hostile writes did not end")
	}
	// What the hold costs: RSS sampled over two seconds of it.
	var held, holding int64
	sample := time.NewTicker(200 * time.Millisecond)
	for range 10 {
		<-sample.C
		holding = rssOf(t, pid)
		held = max(held, holding)
	}
	sample.Stop()
	for _, h := range hosts {
		_ = h.Close() // the hold ends
	}
	wg.Wait()
	ended := time.Now()
	var after int64
	_, err = testkit.Poll(10*time.Second, func() error {
		after = rssOf(t, pid)
		if after > quiet+20<<20 {
			return fmt.Errorf("RSS %.1f MiB, quiet %.1f MiB", mib(uint64(after)), mib(uint64(quiet)))
		}
		return nil
	})
	t.Logf("held requests: %d of %d streams sent 1 MiB - 1 byte; gateway RSS quiet %.1f MiB, at most %.1f MiB during the hold (%.1f MiB 2 s in), %.1f MiB %s after the hold ended",
		sent, identities*streams, mib(uint64(quiet)), mib(uint64(held)), mib(uint64(holding)), mib(uint64(after)), time.Since(ended).Round(100*time.Millisecond))
	if err != nil {
		t.Fatalf("10 s after the hold: %v; want within 20 MB of quiet", err)
	}
}

// A worker that stalls every other request it accepts and refuses the
// others at once as busy is cordoned as a staller: a refusal shows that
// nothing ran, so it forgives no stall (only an answer to work does). The
// gateway's other worker serves the requests meanwhile.
func TestHostileStallerForgivenByNoRefusal(t *testing.T) {
	hits := newHitCounter()
	release := make(chan struct{})
	var calls atomic.Int32
	stallOrBusy := workers.HandlerFunc(func(context.Context, []byte) workers.Result {
		if calls.Add(1)%2 == 0 {
			return workers.Fail(workers.Busy, "busy")
		}
		<-release
		return workers.OK(nil)
	})
	gw := startMember(t, hits, memberSpec{name: "gateway"}, nil)
	bad := startMember(t, hits, memberSpec{name: "bad", handlers: map[string]workers.Handler{"job": stallOrBusy}}, gw)
	t.Cleanup(func() { close(release) })
	waitRanked(t, gw, "job", 1)
	name := peerName(gw, bad)
	id := string(bad.node.ID())
	for i := 0; i < 12 && gw.disp.Selector().Liveness().State(id) == selection.StateAlive; i++ {
		res := gw.submit(t, dispatch.WorkRequest{Type: "job", Payload: []byte(strconv.Itoa(i)), Timeout: 300 * time.Millisecond})
		t.Logf("request %d: %s", i, describe(res, name))
	}
	if st, why := gw.disp.Selector().Liveness().State(id), gw.disp.Selector().Liveness().Reason(id); st != selection.StateUnreachable || !strings.Contains(why, "stalled") {
		t.Fatalf("a worker stalling every other request and refusing the rest: %s (%q), want cordoned for stalls", st, why)
	}
}
