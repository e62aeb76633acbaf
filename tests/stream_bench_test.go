package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// bareStreamEchoProtocol is the baseline of a work exchange on a stream
// that stays open: one length-prefixed message there and back per round
// trip, on a stream opened once.
const bareStreamEchoProtocol = "/workmesh-bench/echo-stream/1.0.0"

// bareStreamMax bounds one bare stream echo message.
const bareStreamMax = 2 << 20

// serveBareStreamEcho answers bareStreamEchoProtocol on h: each stream
// carries echoes one after the other until the client closes it.
func serveBareStreamEcho(h host.Host) {
	h.SetStreamHandler(bareStreamEchoProtocol, func(s network.Stream) {
		var buf []byte
		for {
			var hdr [4]byte
			if _, err := io.ReadFull(s, hdr[:]); err != nil {
				if err == io.EOF {
					s.Close()
				} else {
					s.Reset()
				}
				return
			}
			n := int(binary.BigEndian.Uint32(hdr[:]))
			if n > bareStreamMax {
				s.Reset()
				return
			}
			if cap(buf) < 4+n {
				buf = make([]byte, 4+n)
			}
			buf = buf[:4+n]
			copy(buf, hdr[:])
			if _, err := io.ReadFull(s, buf[4:]); err != nil {
				s.Reset()
				return
			}
			if _, err := s.Write(buf); err != nil {
				s.Reset()
				return
			}
		}
	})
}

// bareStream is the client end of one long-lived bareStreamEchoProtocol
// stream, used by one caller at a time.
type bareStream struct {
	s        network.Stream
	out, in  []byte
	openedAt time.Time
}

func openBareStream(ctx context.Context, h host.Host, to peer.ID) (*bareStream, error) {
	s, err := h.NewStream(ctx, to, bareStreamEchoProtocol)
	if err != nil {
		return nil, err
	}
	return &bareStream{s: s, openedAt: time.Now()}, nil
}

// echo sends payload and checks the answer.
func (b *bareStream) echo(payload []byte) error {
	b.out = binary.BigEndian.AppendUint32(b.out[:0], uint32(len(payload)))
	b.out = append(b.out, payload...)
	if _, err := b.s.Write(b.out); err != nil {
		return err
	}
	var hdr [4]byte
	if _, err := io.ReadFull(b.s, hdr[:]); err != nil {
		return err
	}
	n := int(binary.BigEndian.Uint32(hdr[:]))
	if n != len(payload) {
		return fmt.Errorf("bare stream echo: %d bytes back, sent %d", n, len(payload))
	}
	if cap(b.in) < n {
		b.in = make([]byte, n)
	}
	_, err := io.ReadFull(b.s, b.in[:n])
	return err
}

func (b *bareStream) close() { _ = b.s.Close() }

// bareStreams keeps one long-lived stream per caller and worker.
type bareStreams struct {
	h     host.Host
	mu    sync.Mutex
	byKey map[[2]int]*bareStream
}

func newBareStreams(h host.Host) *bareStreams {
	return &bareStreams{h: h, byKey: map[[2]int]*bareStream{}}
}

// get returns caller's stream to worker w (index i), opening it once.
func (bs *bareStreams) get(ctx context.Context, caller, i int, w peer.ID) (*bareStream, error) {
	bs.mu.Lock()
	s := bs.byKey[[2]int{caller, i}]
	bs.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s, err := openBareStream(ctx, bs.h, w)
	if err != nil {
		return nil, err
	}
	bs.mu.Lock()
	bs.byKey[[2]int{caller, i}] = s
	bs.mu.Unlock()
	return s, nil
}

// drop forgets and resets a stream that failed.
func (bs *bareStreams) drop(caller, i int) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if s := bs.byKey[[2]int{caller, i}]; s != nil {
		_ = s.s.Reset()
		delete(bs.byKey, [2]int{caller, i})
	}
}

func (bs *bareStreams) closeAll() {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for k, s := range bs.byKey {
		s.close()
		delete(bs.byKey, k)
	}
}

// BenchmarkPayloadEchoVsLongLivedStream compares, per payload size, an
// echo through the full dispatch path with a bare echo of the same
// payload on a long-lived stream between the same two hosts, alternating
// the two. Reported per size: workmesh-us and baseline-us (medians) and
// ratio (median of the paired ratios). Goal at 1 MiB: at most 1.3.
// A scenario: run with -benchtime 1x.
func BenchmarkPayloadEchoVsLongLivedStream(b *testing.B) {
	hits := newHitCounter()
	gw := startMember(b, hits, memberSpec{name: "gateway"}, nil)
	w := startMember(b, hits, memberSpec{name: "worker", handlers: map[string]workers.Handler{"echo": echoHandler()}}, gw)
	waitRanked(b, gw, "echo", 1)
	serveBareStreamEcho(w.node.Host())
	ctx := context.Background()
	bs, err := openBareStream(ctx, gw.node.Host(), w.node.ID())
	if err != nil {
		b.Fatal(err)
	}
	defer bs.close()
	worker := w.node.ID().String()
	for _, size := range []struct {
		name   string
		n      int
		rounds int
	}{
		{"64B", 64, 600},
		{"4KiB", 4 << 10, 600},
		{"64KiB", 64 << 10, 300},
		{"1MiB", 1 << 20, 60},
	} {
		payload := bytes.Repeat([]byte("x"), size.n)
		bare := func() time.Duration {
			start := time.Now()
			if err := bs.echo(payload); err != nil {
				b.Fatal(err)
			}
			return time.Since(start)
		}
		disp := func() time.Duration {
			start := time.Now()
			res := gw.disp.Dispatch(ctx, dispatch.WorkRequest{Type: "echo", Payload: payload, Timeout: 10 * time.Second})
			took := time.Since(start)
			if res.Status != apiv1.StatusOK || res.Worker != worker || len(res.Output) != len(payload) {
				b.Fatalf("dispatch of %s: %s", size.name, describe(res, peerName(gw, w)))
			}
			return took
		}
		b.Run("size="+size.name, func(b *testing.B) {
			for range max(size.rounds/10, 5) { // warm up: windows, pooled streams, buffers
				bare()
				disp()
			}
			var bareTimes, dispTimes []time.Duration
			var ratios []float64
			for b.Loop() {
				for i := range size.rounds {
					var tb, td time.Duration
					if i%2 == 0 {
						tb, td = bare(), disp()
					} else {
						td, tb = disp(), bare()
					}
					bareTimes, dispTimes = append(bareTimes, tb), append(dispTimes, td)
					ratios = append(ratios, float64(td)/float64(tb))
				}
			}
			mb, md := median(bareTimes), median(dispTimes)
			reportFigure(b, float64(md.Nanoseconds())/1e3, float64(mb.Nanoseconds())/1e3, "us", median(ratios))
			b.Logf("%s: dispatch %s, bare long-lived stream %s (medians of %d), ratio %.2f", size.name, md, mb, len(dispTimes), median(ratios))
		})
	}
}
