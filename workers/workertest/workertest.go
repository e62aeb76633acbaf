package workertest

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/builtin"
	"github.com/workmesh/workmesh/workers/pool"
)

// FailAfter bounds every wait of a test: reaching it means the behaviour
// under test is broken (a hang), never that the test is slow.
const FailAfter = 10 * time.Second

// Network is the network name the tests' protocols run on.
const Network = "test"

// Gate is a handler whose executions the test controls: each announces
// itself on Started, then waits for Release (or, when HonourCtx is set,
// for its context, reporting the cause on Cancelled).
type Gate struct {
	Started   chan string
	Release   chan struct{}
	Cancelled chan error
	HonourCtx bool
	Runs      atomic.Int64
	openOnce  sync.Once
}

// NewGate returns a closed gate.
func NewGate(honourCtx bool) *Gate {
	return &Gate{
		Started:   make(chan string, 100),
		Release:   make(chan struct{}),
		Cancelled: make(chan error, 100),
		HonourCtx: honourCtx,
	}
}

// Open releases every execution, now and later. Tests defer it so that a
// failing test does not leave handlers blocked (and Close waiting).
func (g *Gate) Open() { g.openOnce.Do(func() { close(g.Release) }) }

// Do announces the execution and waits as the gate says.
func (g *Gate) Do(ctx context.Context, payload []byte) workers.Result {
	g.Runs.Add(1)
	g.Started <- string(payload)
	if !g.HonourCtx {
		<-g.Release
		return workers.OK(payload)
	}
	select {
	case <-g.Release:
		return workers.OK(payload)
	case <-ctx.Done():
		g.Cancelled <- context.Cause(ctx)
		return workers.Fail(workers.RetryableError, "gate cancelled: %v", context.Cause(ctx))
	}
}

// Counter is a handler that counts its runs and echoes its payload.
type Counter struct{ Runs atomic.Int64 }

// Do counts the run and returns the payload.
func (h *Counter) Do(_ context.Context, payload []byte) workers.Result {
	h.Runs.Add(1)
	return workers.OK(payload)
}

// Recv receives from ch within FailAfter, or fails the test naming what
// it waited for.
func Recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(FailAfter):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// Must fails the test on an error.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// QuietLogger discards log output (panics are logged with their stack).
func QuietLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// NewPool returns a local worker with the built-in types and handlers,
// concurrency requests at once and buffer waiting; it is closed when the
// test ends.
func NewPool(t testing.TB, concurrency, buffer int, handlers map[string]workers.Handler) *pool.Pool {
	t.Helper()
	reg, err := builtin.NewRegistry()
	Must(t, err)
	for name, h := range handlers {
		Must(t, reg.Register(name, h))
	}
	cfg := config.Defaults().Worker
	cfg.LocalConcurrency, cfg.WorkerBufferSize = concurrency, buffer
	// Peers may take every slot of a test pool: a test of the reserve for
	// the node's own clients (local-reserve) builds its pool itself.
	cfg.LocalReserve = 0
	p, err := pool.New(reg, cfg, QuietLogger())
	Must(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// NewHost starts a libp2p host listening on a random loopback QUIC port;
// it is closed when the test ends.
func NewHost(t testing.TB) host.Host {
	t.Helper()
	h, err := libp2p.New(
		libp2p.ListenAddrStrings("/ip4/127.0.0.1/udp/0/quic-v1"),
		libp2p.DisableRelay(),
	)
	if err != nil {
		t.Fatalf("new host: %v", err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// MockPair returns two linked hosts on go-libp2p's mock network, a
// transport that ignores stream deadlines.
func MockPair(t testing.TB) (host.Host, host.Host) {
	t.Helper()
	mn := mocknet.New()
	t.Cleanup(func() { _ = mn.Close() })
	a, err := mn.GenPeer()
	Must(t, err)
	b, err := mn.GenPeer()
	Must(t, err)
	Must(t, mn.LinkAll())
	return a, b
}

// Connect dials b from a directly.
func Connect(t testing.TB, a, b host.Host) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), FailAfter)
	defer cancel()
	if err := a.Connect(ctx, peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		t.Fatalf("connect: %v", err)
	}
}
