package tests

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
	"github.com/workmesh/workmesh/workers/httpwork"
	"github.com/workmesh/workmesh/workers/jsonrpc"
	"github.com/workmesh/workmesh/workers/pool"
	"github.com/workmesh/workmesh/workers/protocol"
	wstack "github.com/workmesh/workmesh/workers/stack"
)

// member is one full workmesh stack in the test process: node, local
// worker, work protocol server and dispatcher, on loopback.
type member struct {
	name   string
	node   *node.Node
	pool   *pool.Pool
	server *protocol.Server
	disp   *dispatch.Dispatcher
	cancel context.CancelFunc
	done   chan struct{}
	hits   *hitCounter
	closed atomic.Bool
}

// hitCounter counts handler runs per member name.
type hitCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func newHitCounter() *hitCounter { return &hitCounter{n: map[string]int{}} }

func (h *hitCounter) add(name string) {
	h.mu.Lock()
	h.n[name]++
	h.mu.Unlock()
}

func (h *hitCounter) get(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[name]
}

func (h *hitCounter) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := 0
	for _, n := range h.n {
		t += n
	}
	return t
}

func (h *hitCounter) reset() {
	h.mu.Lock()
	h.n = map[string]int{}
	h.mu.Unlock()
}

// memberSpec describes a member: its labels, its handlers by work type and
// the config changes it runs with.
type memberSpec struct {
	name     string
	labels   []string
	handlers map[string]workers.Handler
	cfg      func(*config.Config)
	opts     []node.Option
}

// headHandler is a work type with a head: it serves positions up to head
// (answering with its name) and is empty above it, unless emptyAtHead.
type headHandler struct {
	name        string
	head        uint64
	emptyAlways bool
	hits        *hitCounter
}

func (h headHandler) Head() (uint64, bool) { return h.head, true }

func (h headHandler) Do(_ context.Context, payload []byte) workers.Result {
	h.hits.add(h.name)
	pos, err := strconv.ParseUint(string(payload), 10, 64)
	if err != nil {
		return workers.Fail(workers.PermanentError, "position %q: %v", payload, err)
	}
	if h.emptyAlways || pos > h.head {
		return workers.Result{Outcome: workers.Empty}
	}
	return workers.OK([]byte(h.name))
}

// countingHandler wraps a handler and counts its runs under name.
func counting(name string, hits *hitCounter, h workers.Handler) workers.Handler {
	return workers.HandlerFunc(func(ctx context.Context, payload []byte) workers.Result {
		hits.add(name)
		return h.Do(ctx, payload)
	})
}

// untilDeadline is a handler, counted as name, that runs the work until its
// time is up and then says so as a killed command would: retryable.
func untilDeadline(hits *hitCounter, name string) workers.Handler {
	return counting(name, hits, workers.HandlerFunc(func(ctx context.Context, _ []byte) workers.Result {
		<-ctx.Done()
		return workers.Fail(workers.RetryableError, "%s: killed: its deadline passed", name)
	}))
}

// fixedResult is a handler that always answers with r.
func fixedResult(r workers.Result) workers.Handler {
	return workers.HandlerFunc(func(context.Context, []byte) workers.Result { return r })
}

// testDispatchConfig is the config every member starts from: loopback,
// quick polls, short timeouts.
func testDispatchConfig(t testing.TB) config.Config {
	cfg := config.Defaults()
	cfg.Node = testNodeConfig(t, nodeSpec{}, nil)
	cfg.Liveness.PollInterval = 200 * time.Millisecond
	cfg.Liveness.RedialBackoffMin = 200 * time.Millisecond
	cfg.Worker.ConnectTimeout = 500 * time.Millisecond
	cfg.Worker.WorkerTimeout = 2 * time.Second
	cfg.Worker.WorkerResponseTimeout = time.Second
	cfg.Worker.RetryDelay = 0
	return cfg
}

// startMember starts a member, bootstrapped from boot when given.
func startMember(t testing.TB, hits *hitCounter, spec memberSpec, boot *member) *member {
	t.Helper()
	cfg := testDispatchConfig(t)
	cfg.Node.Labels = spec.labels
	if spec.cfg != nil {
		spec.cfg(&cfg)
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("member %s: config: %v", spec.name, err)
	}
	reg := workers.NewRegistry()
	for name, h := range spec.handlers {
		if err := reg.Register(name, h); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Node.WorkTypes = reg.Names()
	if boot != nil {
		cfg.Node.Bootstrap = addrStrings(boot.node)
	}
	local, err := pool.New(reg, cfg.Worker, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	state := pool.NewLocalState(local)
	opts := append([]node.Option{node.WithLocalState(state), node.WithHealthCheck(state.Health)}, spec.opts...)
	n := startNode(t, cfg.Node, opts...)
	server, err := protocol.NewServer(n.Host(), n.Network(), local, protocol.WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	// Each member's random choices repeat from run to run (its name seeds
	// them) and differ from the other members', as nodes' do.
	seed := fnv.New64a()
	seed.Write([]byte(spec.name))
	// The gateway knows the traits of the types it does not serve, as
	// node start's does.
	disp, err := dispatch.New(cfg, n, local, dispatch.WithLogger(testLogger()),
		dispatch.WithSelectionOptions(selection.WithSeed(seed.Sum64())),
		dispatch.WithCatalog(workers.Catalog{jsonrpc.Type: jsonrpc.Traits, httpwork.Type: httpwork.Traits}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{name: spec.name, node: n, pool: local, server: server, disp: disp, cancel: cancel, done: make(chan struct{}), hits: hits}
	// The advertised work types follow their health, as node start's do.
	types := wstack.NewTypeHealth(reg, n.SetWorkTypes, testLogger())
	go func() {
		defer close(m.done)
		var wg sync.WaitGroup
		wg.Go(func() { types.Run(ctx) })
		_ = disp.Run(ctx)
		wg.Wait()
	}()
	t.Cleanup(m.stop)
	return m
}

// stop shuts the member down: dispatcher, server, pool, node.
func (m *member) stop() {
	if m.closed.Swap(true) {
		return
	}
	m.cancel()
	<-m.done
	m.server.Close()
	m.pool.Close()
	m.node.Close()
}

// startMesh starts a gateway and members bootstrapped from it, and waits
// until the gateway's selector ranks every member for workType.
func startMesh(t testing.TB, workType string, gateway memberSpec, others ...memberSpec) (*member, []*member) {
	t.Helper()
	hits := newHitCounter()
	gw := startMember(t, hits, gateway, nil)
	ms := make([]*member, len(others))
	for i, spec := range others {
		ms[i] = startMember(t, hits, spec, gw)
	}
	waitRanked(t, gw, workType, len(others))
	return gw, ms
}

// waitRanked waits until the gateway's selector ranks n candidates for
// workType, all alive.
func waitRanked(t testing.TB, gw *member, workType string, n int) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, fmt.Sprintf("gateway ranks %d alive candidates for %s", n, workType), func() error {
		r := gw.disp.Selector().Ranking(workType)
		alive := 0
		for _, x := range r {
			if x.State == selection.StateAlive {
				alive++
			}
		}
		if alive < n {
			return fmt.Errorf("%d alive: %+v", alive, r)
		}
		return nil
	}, gw.node.Peers().Changed)
}

// submit dispatches one request through the gateway.
func (m *member) submit(t testing.TB, req dispatch.WorkRequest) dispatch.WorkResult {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = 5 * time.Second
	}
	return m.disp.Dispatch(context.Background(), req)
}

// peerName maps peer IDs in results back to member names.
func peerName(ms ...*member) func(string) string {
	names := map[string]string{dispatch.LocalWorker: dispatch.LocalWorker}
	for _, m := range ms {
		names[m.node.ID().String()] = m.name
	}
	return func(id string) string {
		if n, ok := names[id]; ok {
			return n
		}
		return id
	}
}

func describe(res dispatch.WorkResult, name func(string) string) string {
	s := fmt.Sprintf("status %s worker %s after %s error %q attempts:", res.Status, name(res.Worker), res.Duration.Round(time.Millisecond), res.Error)
	for _, a := range res.Attempts {
		s += fmt.Sprintf(" [%s %s %.0fms %s]", name(a.Peer), a.Outcome, a.DurationMS, a.Error)
	}
	return s
}

func u64(v uint64) *uint64 { return &v }
