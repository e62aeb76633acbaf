package tests

import (
	"context"
	"encoding/binary"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	lpprotocol "github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/protocol"
)

// TestHostileIdleWorkStreamsLeaveRoomForWork: identities that open work
// streams, send one small request on each, read the answer and keep the
// stream open, as many as the worker's host allows inbound work streams
// and 256 more, do not keep anyone from sending work: the worker (the
// binary, default settings) closes the streams that have waited longest
// beyond its bounds, and an honest client's requests, on its kept stream
// and from a new identity, are served while the streams are held. (Before
// the bound, six identities held the 1,259 work streams the host allowed
// here for the idle timeout of 90s, and every honest request was refused
// at the stream limits.)
func TestHostileIdleWorkStreamsLeaveRoomForWork(t *testing.T) {
	bin := buildBinary(t)
	worker := startNodeProcess(t, bin)
	addr, err := ma.NewMultiaddr(worker.join)
	if err != nil {
		t.Fatal(err)
	}
	info, err := peer.AddrInfoFromP2pAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	netName := config.Defaults().Node.Network
	// What the worker's host allows, on this machine: an in-process node
	// has the same limits.
	probe := startMember(t, newHitCounter(), memberSpec{name: "probe"}, nil)
	budget := node.WorkStreamBudget(probe.node.Host(), probe.node.Network())
	if budget <= 0 {
		t.Fatalf("work stream budget %d", budget)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	honest := hostileHost(t)
	if err := honest.Connect(ctx, *info); err != nil {
		t.Fatal(err)
	}
	cl, err := protocol.NewClient(honest, netName)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(c *protocol.Client, id string) error {
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		defer rcancel()
		resp, err := c.Do(rctx, info.ID, protocol.Request{ID: id, Type: "sha256", Payload: []byte(id)})
		if err == nil && resp.Outcome != workers.Success {
			t.Fatalf("request %s: %v %q", id, resp.Outcome, resp.Error)
		}
		return err
	}
	if err := ask(cl, "before"); err != nil {
		t.Fatalf("before the streams are held: %v", err)
	}

	const perIdentity = 200 // within a QUIC connection's 256 streams
	identities := (budget+256)/perIdentity + 1
	pid := protocol.ProtocolID(netName)
	var opened, refused atomic.Int64
	var mu sync.Mutex
	var held []network.Stream
	var wg sync.WaitGroup
	for range identities {
		h := unlimitedHost(t)
		if err := h.Connect(ctx, *info); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for range perIdentity {
				s, err := openAndAsk(ctx, h, info.ID, pid)
				if err != nil {
					refused.Add(1)
					continue
				}
				opened.Add(1)
				mu.Lock()
				held = append(held, s)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	defer func() {
		for _, s := range held {
			_ = s.Reset()
		}
	}()
	t.Logf("budget of %d inbound work streams; %d identities opened %d streams, asked once on each and kept them (%d refused)",
		budget, identities, opened.Load(), refused.Load())
	for _, id := range []string{"held-1", "held-2", "held-3", "held-4", "held-5"} {
		if err := ask(cl, id); err != nil {
			t.Fatalf("honest request %s while the streams are held: %v", id, err)
		}
	}
	fresh := hostileHost(t)
	if err := fresh.Connect(ctx, *info); err != nil {
		t.Fatal(err)
	}
	cl2, err := protocol.NewClient(fresh, netName)
	if err != nil {
		t.Fatal(err)
	}
	if err := ask(cl2, "fresh"); err != nil {
		t.Fatalf("a new identity's request while the streams are held: %v", err)
	}
	// The worker took every stream, and closed the ones waiting longest:
	// the streams held were more than its host allows at once.
	if n := opened.Load(); n <= int64(budget) {
		t.Errorf("%d streams opened, want more than the budget of %d (the attack was weaker than meant)", n, budget)
	}
}

// openAndAsk opens a work stream to to, sends one small request, reads
// the whole answer and returns the stream, left open.
func openAndAsk(ctx context.Context, h host.Host, to peer.ID, pid protocolID) (network.Stream, error) {
	octx, ocancel := context.WithTimeout(ctx, 2*time.Second)
	defer ocancel()
	s, err := h.NewStream(octx, to, pid)
	if err != nil {
		return nil, err
	}
	if _, err := s.Write(rawWorkRequest("x", "sha256", []byte("x"))); err != nil {
		_ = s.Reset()
		return nil, err
	}
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [4]byte
	if _, err := io.ReadFull(s, hdr[:]); err != nil {
		_ = s.Reset()
		return nil, err
	}
	if _, err := io.ReadFull(s, make([]byte, binary.BigEndian.Uint32(hdr[:]))); err != nil {
		_ = s.Reset()
		return nil, err
	}
	_ = s.SetReadDeadline(time.Time{})
	return s, nil
}

// rawWorkRequest is one work request frame as the protocol encodes it: no
// timeout, no accept timeout, then id, type and payload.
func rawWorkRequest(id, typ string, payload []byte) []byte {
	body := []byte{0x01}
	body = binary.AppendUvarint(body, 0)
	body = binary.AppendUvarint(body, 0)
	body = binary.AppendUvarint(body, uint64(len(id)))
	body = append(body, id...)
	body = binary.AppendUvarint(body, uint64(len(typ)))
	body = append(body, typ...)
	body = append(body, payload...)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

type protocolID = lpprotocol.ID

// unlimitedHost is a loopback host with no resource limits of its own: an
// attacker sets its own host's limits.
func unlimitedHost(t testing.TB) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings(loopbackQUIC), libp2p.DisableRelay(),
		libp2p.ResourceManager(&network.NullResourceManager{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}
