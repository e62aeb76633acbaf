package protocol

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/workertest"
)

// Streams that send all of a 1 MiB request but its last byte hold at most
// the per-peer bound of incomplete bodies; the streams beyond it are
// reset, and when the peer goes the bytes are given back.
func TestServer_IncompleteRequestsBounded(t *testing.T) {
	const perPeer = 2 << 20
	p := newPair(t, map[string]workers.Handler{}, WithIncompleteLimits(8<<20, perPeer))
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()
	const n = 6
	body := make([]byte, 1<<20)
	msg := append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body[:len(body)-1]...)
	var endedCount atomic.Int32
	streams := partialRequests(t, ctx, p, msg, n, n-2, &endedCount)
	// At most two streams fit the peer's bound; the others are reset
	// (partialRequests waits for those). (A body's memory grows as its
	// bytes come in, so two bodies half in can both find no room to grow
	// while a third holds its share: then one is left.)
	testkit.WaitFor(t, 5*time.Second, "the held bodies to be fully in", func() error {
		held := n - int(endedCount.Load())
		if got := p.server.Incomplete(); got != held*len(body) || held < 1 {
			return fmt.Errorf("%d bytes incomplete with %d streams held, want %d bytes each", got, held, len(body))
		}
		return nil
	})
	if got := p.server.Incomplete(); got > perPeer {
		t.Errorf("%d bytes incomplete, over the per-peer bound of %d", got, perPeer)
	}
	for _, s := range streams {
		_ = s.Reset()
	}
	testkit.WaitFor(t, 5*time.Second, "the bytes given back", func() error {
		if got := p.server.Incomplete(); got != 0 {
			return fmt.Errorf("%d bytes incomplete after the streams ended", got)
		}
		return nil
	})
	if st := p.server.Stats(); st.Malformed < n {
		t.Errorf("stats %+v: want the %d streams counted as malformed", st, n)
	}
}

// Bodies under libp2p's reserve threshold (64 KiB) count against the
// bounds too, from 8 KiB on: streams that claim 60 KiB and send 40 KiB
// hold at most the per-peer bound of 128 KiB, and the streams beyond it
// are reset. (Not counted before: ten such streams of one peer held 600
// KiB, and a thousand streams 60 MB, each for the read timeout.)
func TestServer_IncompleteSmallRequestsBounded(t *testing.T) {
	const perPeer, claim, sent, n = 128 << 10, 60 << 10, 40 << 10, 10
	p := newPair(t, map[string]workers.Handler{}, WithIncompleteLimits(1<<20, perPeer))
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()
	msg := append(binary.BigEndian.AppendUint32(nil, claim), make([]byte, sent)...)
	// At most two bodies of 60 KiB fit 128 KiB.
	streams := partialRequests(t, ctx, p, msg, n, n-2, nil)
	defer func() {
		for _, s := range streams {
			_ = s.Reset()
		}
	}()
	// The bodies held (one or two) are counted once their bytes are in.
	testkit.WaitFor(t, 5*time.Second, "the held bodies counted", func() error {
		if got := p.server.Incomplete(); got == 0 {
			return fmt.Errorf("%d bytes incomplete", got)
		}
		return nil
	})
	if got := p.server.Incomplete(); got > perPeer {
		t.Errorf("%d bytes incomplete, want at most the per-peer bound of %d", got, perPeer)
	}
}

// partialRequests opens n streams from p's client that each send msg, the
// start of a request, and wait for the server to end them; it returns
// once reset of them have ended with an error (failing the test when one
// ends cleanly or ctx ends first), counting every end in ended (when not
// nil).
func partialRequests(t *testing.T, ctx context.Context, p *pair, msg []byte, n, reset int, ended *atomic.Int32) []network.Stream {
	t.Helper()
	errs := make(chan error, n)
	var streams []network.Stream
	for range n {
		s, err := p.clientHost.NewStream(ctx, p.serverHost.ID(), p.server.Protocol())
		workertest.Must(t, err)
		streams = append(streams, s)
		go func() {
			_, err := s.Write(msg)
			if err == nil {
				var b [1]byte
				_, err = s.Read(b[:]) // ends when the server resets it
			}
			if ended != nil {
				ended.Add(1)
			}
			errs <- err
		}()
	}
	for range reset {
		select {
		case err := <-errs:
			if err == nil {
				t.Fatal("a stream beyond the bound ended without an error")
			}
		case <-ctx.Done():
			t.Fatalf("the streams beyond the per-peer bound were not reset; %d bytes incomplete", p.server.Incomplete())
		}
	}
	return streams
}
