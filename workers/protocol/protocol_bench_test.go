package protocol

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/builtin"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/workertest"
)

// bareEchoID is the baseline protocol: a stream echo with no framing.
const bareEchoID = protocol.ID("/workmesh-bench/bare-echo/1.0.0")

// benchSizes are the payload sizes both echo benchmarks run with.
var benchSizes = []int{256, 64 << 10}

// echoFixture is shared by BenchmarkWorkProtocolEcho and
// BenchmarkBareStreamEcho so that both measure the same two hosts and the
// same connection. TestMain closes it.
type echoFixture struct {
	client, server host.Host
	pool           *pool.Pool
	srv            *Server
	cli            *Client
}

var (
	fixtureOnce sync.Once
	fixture     *echoFixture
	fixtureErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fixture != nil {
		fixture.close()
	}
	os.Exit(code)
}

func getEchoFixture(b *testing.B) *echoFixture {
	fixtureOnce.Do(func() { fixture, fixtureErr = newEchoFixture() })
	if fixtureErr != nil {
		b.Fatal(fixtureErr)
	}
	return fixture
}

func newEchoFixture() (*echoFixture, error) {
	f := &echoFixture{}
	var err error
	listen := libp2p.ListenAddrStrings("/ip4/127.0.0.1/udp/0/quic-v1")
	if f.client, err = libp2p.New(listen, libp2p.DisableRelay()); err != nil {
		return nil, err
	}
	if f.server, err = libp2p.New(listen, libp2p.DisableRelay()); err != nil {
		f.close()
		return nil, err
	}
	reg, err := builtin.NewRegistry()
	if err != nil {
		f.close()
		return nil, err
	}
	if f.pool, err = pool.New(reg, config.Defaults().Worker, workertest.QuietLogger()); err != nil {
		f.close()
		return nil, err
	}
	if f.srv, err = NewServer(f.server, workertest.Network, f.pool, WithLogger(workertest.QuietLogger())); err != nil {
		f.close()
		return nil, err
	}
	if f.cli, err = NewClient(f.client, workertest.Network); err != nil {
		f.close()
		return nil, err
	}
	f.server.SetStreamHandler(bareEchoID, func(s network.Stream) {
		_ = s.SetDeadline(time.Now().Add(10 * time.Second))
		data, err := io.ReadAll(io.LimitReader(s, workers.DefaultMaxPayload))
		if err != nil {
			_ = s.Reset()
			return
		}
		if _, err := s.Write(data); err != nil {
			_ = s.Reset()
			return
		}
		_ = s.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.client.Connect(ctx, peer.AddrInfo{ID: f.server.ID(), Addrs: f.server.Addrs()}); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

func (f *echoFixture) close() {
	if f.srv != nil {
		_ = f.srv.Close()
	}
	if f.pool != nil {
		_ = f.pool.Close()
	}
	if f.client != nil {
		_ = f.client.Close()
	}
	if f.server != nil {
		_ = f.server.Close()
	}
}

// bareEcho sends payload over a fresh stream and reads it back.
func (f *echoFixture) bareEcho(ctx context.Context, payload []byte) ([]byte, error) {
	s, err := f.client.NewStream(ctx, f.server.ID(), bareEchoID)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	if _, err := s.Write(payload); err != nil {
		_ = s.Reset()
		return nil, err
	}
	if err := s.CloseWrite(); err != nil {
		_ = s.Reset()
		return nil, err
	}
	out, err := io.ReadAll(s)
	if err != nil {
		_ = s.Reset()
		return nil, err
	}
	_ = s.Close()
	return out, nil
}

// measure runs op b.N times and reports the median and 90th percentile
// latency of one operation.
func measure(b *testing.B, op func() error) {
	b.Helper()
	if err := op(); err != nil { // warm up: identify, first stream
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	b.ReportMetric(us(lat[len(lat)/2]), "median-us")
	b.ReportMetric(us(lat[len(lat)*9/10]), "p90-us")
}

func BenchmarkWorkProtocolEcho(b *testing.B) {
	f := getEchoFixture(b)
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			payload := bytes.Repeat([]byte{'w'}, size)
			b.SetBytes(int64(size))
			// AcceptTimeout is set as the dispatcher will (WorkerResponseTimeout).
			req := Request{ID: "bench", Type: "echo", Payload: payload, AcceptTimeout: 250 * time.Millisecond}
			measure(b, func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				resp, err := f.cli.Do(ctx, f.server.ID(), req)
				if err != nil {
					return err
				}
				if resp.Outcome != workers.Success || len(resp.Output) != size {
					return fmt.Errorf("echo: %v %q, %d bytes", resp.Outcome, resp.Error, len(resp.Output))
				}
				return nil
			})
		})
	}
}

func BenchmarkBareStreamEcho(b *testing.B) {
	f := getEchoFixture(b)
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			payload := bytes.Repeat([]byte{'w'}, size)
			b.SetBytes(int64(size))
			measure(b, func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				out, err := f.bareEcho(ctx, payload)
				if err != nil {
					return err
				}
				if len(out) != size {
					return fmt.Errorf("bare echo: %d bytes back, want %d", len(out), size)
				}
				return nil
			})
		})
	}
}

// BenchmarkEchoInterleaved alternates one work-protocol echo and one bare
// stream echo per iteration, so that both see the same machine load (the
// separate benchmarks drift apart when anything else runs), and reports
// both medians and their ratio: the figure the 1.25x goal is about.
func BenchmarkEchoInterleaved(b *testing.B) {
	f := getEchoFixture(b)
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			payload := bytes.Repeat([]byte{'w'}, size)
			req := Request{ID: "bench", Type: "echo", Payload: payload, AcceptTimeout: 250 * time.Millisecond}
			work := func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				resp, err := f.cli.Do(ctx, f.server.ID(), req)
				if err == nil && (resp.Outcome != workers.Success || len(resp.Output) != size) {
					err = fmt.Errorf("echo: %v %q", resp.Outcome, resp.Error)
				}
				return err
			}
			bare := func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				out, err := f.bareEcho(ctx, payload)
				if err == nil && len(out) != size {
					err = fmt.Errorf("bare echo: %d bytes back", len(out))
				}
				return err
			}
			for _, op := range []func() error{work, bare} { // warm up
				if err := op(); err != nil {
					b.Fatal(err)
				}
			}
			workLat := make([]time.Duration, 0, b.N)
			bareLat := make([]time.Duration, 0, b.N)
			timed := func(op func() error, lat *[]time.Duration) {
				start := time.Now()
				if err := op(); err != nil {
					b.Fatal(err)
				}
				*lat = append(*lat, time.Since(start))
			}
			b.ResetTimer()
			for i := range b.N {
				if i%2 == 0 { // alternate which goes first
					timed(work, &workLat)
					timed(bare, &bareLat)
				} else {
					timed(bare, &bareLat)
					timed(work, &workLat)
				}
			}
			b.StopTimer()
			slices.Sort(workLat)
			slices.Sort(bareLat)
			w, r := workLat[len(workLat)/2], bareLat[len(bareLat)/2]
			b.ReportMetric(float64(w.Nanoseconds())/1e3, "work-median-us")
			b.ReportMetric(float64(r.Nanoseconds())/1e3, "bare-median-us")
			b.ReportMetric(float64(w)/float64(r), "ratio")
		})
	}
}

// longEchoID is a bare echo on a stream that stays open: 4-byte length,
// then the bytes, there and back, one message after the other.
const longEchoID = "/workmesh-bench/long-echo/1.0.0"

// serveLongEcho answers longEchoID on h.
func serveLongEcho(h host.Host) {
	h.SetStreamHandler(longEchoID, func(s network.Stream) {
		var buf []byte
		for {
			var hdr [4]byte
			if _, err := io.ReadFull(s, hdr[:]); err != nil {
				_ = s.Close()
				return
			}
			n := int(binary.BigEndian.Uint32(hdr[:]))
			if n > workers.DefaultMaxPayload {
				_ = s.Reset()
				return
			}
			buf = append(append(buf[:0], hdr[:]...), make([]byte, n)...)
			if _, err := io.ReadFull(s, buf[4:]); err != nil {
				_ = s.Reset()
				return
			}
			if _, err := s.Write(buf); err != nil {
				_ = s.Reset()
				return
			}
		}
	})
}

// BenchmarkEchoVsLongLivedStream alternates one work-protocol echo and one
// bare echo on a long-lived stream per iteration, on the fixture's two
// hosts: what the protocol adds over a stream that is already open.
func BenchmarkEchoVsLongLivedStream(b *testing.B) {
	f := getEchoFixture(b)
	serveLongEcho(f.server)
	ctx := context.Background()
	s, err := f.client.NewStream(ctx, f.server.ID(), longEchoID)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			payload := bytes.Repeat([]byte{'w'}, size)
			req := Request{ID: "bench", Type: "echo", Payload: payload, AcceptTimeout: 250 * time.Millisecond}
			work := func() error {
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				resp, err := f.cli.Do(ctx, f.server.ID(), req)
				if err == nil && (resp.Outcome != workers.Success || len(resp.Output) != size) {
					err = fmt.Errorf("echo: %v %q", resp.Outcome, resp.Error)
				}
				return err
			}
			out := binary.BigEndian.AppendUint32(nil, uint32(size))
			out = append(out, payload...)
			in := make([]byte, len(out))
			long := func() error {
				if _, err := s.Write(out); err != nil {
					return err
				}
				_, err := io.ReadFull(s, in)
				return err
			}
			for range 20 { // warm up
				if err := work(); err != nil {
					b.Fatal(err)
				}
				if err := long(); err != nil {
					b.Fatal(err)
				}
			}
			var workLat, longLat []time.Duration
			var ratios []float64
			timed := func(op func() error) time.Duration {
				start := time.Now()
				if err := op(); err != nil {
					b.Fatal(err)
				}
				return time.Since(start)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				var w, l time.Duration
				if i%2 == 0 {
					w, l = timed(work), timed(long)
				} else {
					l, w = timed(long), timed(work)
				}
				workLat, longLat = append(workLat, w), append(longLat, l)
				ratios = append(ratios, float64(w)/float64(l))
			}
			b.StopTimer()
			slices.Sort(workLat)
			slices.Sort(longLat)
			slices.Sort(ratios)
			w, l := workLat[len(workLat)/2], longLat[len(longLat)/2]
			b.ReportMetric(float64(w.Nanoseconds())/1e3, "work-median-us")
			b.ReportMetric(float64(l.Nanoseconds())/1e3, "long-median-us")
			b.ReportMetric(ratios[len(ratios)/2], "ratio")
		})
	}
}
