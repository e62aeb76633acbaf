package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/api"
	"github.com/workmesh/workmesh/workers/jsonrpc"
	wstack "github.com/workmesh/workmesh/workers/stack"
)

// benchLogs is an eth_getLogs result of about 512 KiB: transfer logs, as
// a node answers a query over a busy contract's blocks.
var benchLogs = func() string {
	var b strings.Builder
	b.WriteString("[")
	for i := 0; b.Len() < 512<<10; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"address":"0x00000000000000000000000000000000000000aa","topics":["0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef","0x%064x"],"data":"0x%064x","blockNumber":"0x%x","transactionHash":"0x%064x","logIndex":"0x%x","removed":false}`, i, i*7, 100+i/50, i*13, i%50)
	}
	b.WriteString("]")
	return b.String()
}()

// minimalUpstream is the least an Ethereum JSON-RPC node does: it answers
// eth_chainId, eth_blockNumber and eth_getLogs (benchLogs, whatever the
// filter), single requests only, so that what a benchmark measures above
// it is workmesh's own cost.
func minimalUpstream(tb testing.TB) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var c struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if err != nil || json.Unmarshal(body, &c) != nil || len(c.ID) == 0 {
			http.Error(w, "want one JSON-RPC request with an id", http.StatusBadRequest)
			return
		}
		var result string
		switch c.Method {
		case "eth_chainId":
			result = "0x539"
		case "eth_blockNumber":
			result = "0x64"
		case "eth_getLogs":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, c.ID, benchLogs)
			return
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"no such method"}}`, c.ID)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%q}`, c.ID, result)
	}))
	tb.Cleanup(srv.Close)
	return srv
}

// startRPCStack starts a whole node as `workmesh node start` assembles it
// (workers/stack: API server, /v1/rpc, work server, dispatcher, the
// jsonrpc type when upstream is set), with the shipped settings but
// localConcurrency (0 keeps the default), on loopback, its API on a free
// port; boot, when given, is its bootstrap peer.
func startRPCStack(tb testing.TB, upstream string, localConcurrency int, boot *wstack.Stack) *wstack.Stack {
	tb.Helper()
	cfg := config.Defaults()
	cfg.Node = testNodeConfig(tb, nodeSpec{}, nil)
	cfg.Node.API = "127.0.0.1:0"
	cfg.JSONRPC.Upstream = upstream
	if localConcurrency > 0 {
		cfg.Worker.LocalConcurrency = localConcurrency
	}
	if boot != nil {
		cfg.Node.Bootstrap = addrStrings(boot.Node())
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := wstack.Start(ctx, cfg, testLogger())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// rpcClient posts a request to one URL over kept-alive connections and
// checks the answer.
type rpcClient struct {
	c *http.Client
}

func newRPCClient(conns int) *rpcClient {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = conns
	t.Proxy = nil
	return &rpcClient{c: &http.Client{Transport: t, Timeout: 10 * time.Second}}
}

// call posts method (without params) with id and wants result back.
func (c *rpcClient) call(url string, id int, method, result string) (time.Duration, error) {
	body := []byte(`{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"` + method + `","params":[]}`)
	start := time.Now()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.c.Do(req)
	if err != nil {
		return 0, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start) // the check below is the benchmark's
	if err != nil {
		return 0, err
	}
	want := `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"result":` + result + `}`
	if resp.StatusCode != http.StatusOK || string(bytes.TrimSpace(data)) != want {
		return 0, fmt.Errorf("POST %s: HTTP %d %s, want %s", url, resp.StatusCode, workers.Truncate(string(data), 300), workers.Truncate(want, 300))
	}
	return took, nil
}

// rpcSamples are the latencies of one run's successful calls, per path,
// and the calls that failed.
type rpcSamples struct {
	direct, inNode, remote, bare []time.Duration
	calls, failed                int
	firstErr                     error
}

func (s *rpcSamples) add(o rpcSamples) {
	s.direct = append(s.direct, o.direct...)
	s.inNode = append(s.inNode, o.inNode...)
	s.remote = append(s.remote, o.remote...)
	s.bare = append(s.bare, o.bare...)
	s.calls += o.calls
	s.failed += o.failed
	if s.firstErr == nil {
		s.firstErr = o.firstErr
	}
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// rpcRig is an upstream, a worker node relaying jsonrpc to it and a
// gateway node that serves no jsonrpc, with the four ways to a block
// number BenchmarkRPCVsDirectUpstream compares.
type rpcRig struct {
	upstream, inNode, remote string
	// method is what the clients call, result its answer.
	method, result string
	bare           func() (time.Duration, error)
	// only, when set, runs that path alone (direct, node, remote or bare):
	// WMTEST_RPC_ONLY, for a profile of one path.
	only string
}

func newRPCRig(b *testing.B, localConcurrency int) *rpcRig {
	b.Helper()
	up := minimalUpstream(b)
	gw := startRPCStack(b, "", localConcurrency, nil)
	w := startRPCStack(b, up.URL, localConcurrency, gw)
	testkit.WaitFor(b, 10*time.Second, "the gateway ranks the worker alive for jsonrpc", func() error {
		for _, x := range gw.Dispatcher().Selector().Ranking(jsonrpc.Type) {
			if x.State == selection.StateAlive {
				return nil
			}
		}
		return errors.New("no alive jsonrpc candidate")
	}, gw.Node().Peers().Changed)
	serveBareEcho(w.Node().Host())
	// The bare echo carries as many bytes as the relayed request.
	payload := bytes.Repeat([]byte("x"), len(`{"jsonrpc":"2.0","id":1000000,"method":"eth_blockNumber","params":[]}`))
	r := &rpcRig{
		upstream: up.URL,
		method:   "eth_blockNumber",
		result:   `"0x64"`,
		inNode:   "http://" + w.Node().APIAddr() + api.RPCPath,
		remote:   "http://" + gw.Node().APIAddr() + api.RPCPath,
		only:     os.Getenv("WMTEST_RPC_ONLY"),
		bare: func() (time.Duration, error) {
			start := time.Now()
			err := bareEcho(context.Background(), gw.Node().Host(), w.Node().ID(), payload)
			return time.Since(start), err
		},
	}
	// Warm up connections, streams and the rating.
	if s := r.rounds(newRPCClient(1), 0, 200); s.firstErr != nil {
		b.Fatal(s.firstErr)
	}
	return r
}

// rounds runs calls rounds of the four paths, one after the other, from
// one client. A failed call is counted and left out of the latencies, as
// the load phases of the other benchmarks do: on a loaded machine a
// request may time out.
func (r *rpcRig) rounds(c *rpcClient, client, calls int) rpcSamples {
	var s rpcSamples
	for i := range calls {
		id := client*1_000_000 + i
		for _, p := range []struct {
			name string
			call func() (time.Duration, error)
			into *[]time.Duration
		}{
			{"direct", func() (time.Duration, error) { return c.call(r.upstream, id, r.method, r.result) }, &s.direct},
			{"node", func() (time.Duration, error) { return c.call(r.inNode, id, r.method, r.result) }, &s.inNode},
			{"remote", func() (time.Duration, error) { return c.call(r.remote, id, r.method, r.result) }, &s.remote},
			{"bare", r.bare, &s.bare},
		} {
			if r.only != "" && p.name != r.only {
				continue
			}
			s.calls++
			d, err := p.call()
			if err != nil {
				s.failed++
				if s.firstErr == nil {
					s.firstErr = fmt.Errorf("%s: %w", p.name, err)
				}
				continue
			}
			*p.into = append(*p.into, d)
		}
	}
	return s
}

// run has clients clients run calls rounds each at once, b.N times, after
// two untimed rounds each that open their connections, and reports the
// figures. More than 1% of the calls failing fails it.
func (r *rpcRig) run(b *testing.B, clients, calls int) {
	var (
		all rpcSamples
		mu  sync.Mutex
		wg  sync.WaitGroup
	)
	c := newRPCClient(clients)
	// Each client's first call on a path dials (and the paths behind it
	// open connections and streams for this many at once): warm up, untimed,
	// so that every path's figure is that of kept-alive connections.
	for k := range clients {
		wg.Go(func() {
			if s := r.rounds(c, k+1, 2); s.firstErr != nil {
				b.Logf("warm-up: %v", s.firstErr)
			}
		})
	}
	wg.Wait()
	b.ResetTimer()
	load := startHostLoad(b)
	for range b.N {
		for k := range clients {
			wg.Go(func() {
				s := r.rounds(c, k+1, calls)
				mu.Lock()
				defer mu.Unlock()
				all.add(s)
			})
		}
		wg.Wait()
	}
	if all.failed > 0 {
		b.Logf("%d of %d calls failed, the first: %v", all.failed, all.calls, all.firstErr)
	}
	if all.failed*100 > all.calls {
		b.Fatalf("%d of %d calls failed (more than 1%%), the first: %v", all.failed, all.calls, all.firstErr)
	}
	b.ReportMetric(float64(all.failed), "failed")
	// Other sessions on the machine take cores from these clients and
	// nodes: the 32-client figures at least double when they keep one of
	// two cores busy.
	if other, ok := load.otherCores(b); ok {
		b.ReportMetric(other, "other-load-cores")
		b.ReportMetric(float64(load.cpus), "host-cores")
	}
	p50 := func(d []time.Duration) float64 { return us(percentile(d, 50)) }
	p99 := func(d []time.Duration) float64 { return us(percentile(d, 99)) }
	direct, inNode, remote, bare := p50(all.direct), p50(all.inNode), p50(all.remote), p50(all.bare)
	b.ReportMetric(direct, "direct-p50-µs")
	b.ReportMetric(p99(all.direct), "direct-p99-µs")
	b.ReportMetric(inNode, "node-p50-µs")
	b.ReportMetric(p99(all.inNode), "node-p99-µs")
	b.ReportMetric(remote, "remote-p50-µs")
	b.ReportMetric(p99(all.remote), "remote-p99-µs")
	b.ReportMetric(bare, "bare-p50-µs")
	b.ReportMetric(inNode-direct, "node-added-p50-µs")
	b.ReportMetric(p99(all.inNode)-p99(all.direct), "node-added-p99-µs")
	b.ReportMetric(remote-direct, "remote-added-p50-µs")
	b.ReportMetric(p99(all.remote)-p99(all.direct), "remote-added-p99-µs")
	// The goal: remote-margin at most 300 µs.
	b.ReportMetric(remote-direct-bare, "remote-margin-µs")
	b.ReportMetric((remote-direct)/bare, "ratio")
}

// BenchmarkRPCVsDirectUpstream measures what a JSON-RPC call through a
// node's /v1/rpc adds over calling the upstream directly, on the paths an
// operator runs, in one run and alternating so that load on a shared
// machine hits every path alike:
//
//   - direct: the client posts eth_blockNumber to a minimal upstream on
//     loopback;
//   - node (in-node): to the worker node's /v1/rpc, whose own jsonrpc type
//     relays it to that upstream (no libp2p stream);
//   - remote: to a gateway node's /v1/rpc (the gateway serves no jsonrpc),
//     which dispatches it over the work protocol to the worker;
//   - bare: a bare libp2p new-stream echo of the request's size between the
//     gateway's and the worker's hosts, the floor of the remote path.
//
// Every client keeps its connections alive. Goal (issue 22): the remote
// path's added p50 (remote p50 - direct p50) is at most the bare p50 plus
// 0.3 ms (remote-margin-µs <= 300), with one client and with 32 at once.
//
// The nodes run the shipped settings but local-concurrency 64: a node
// that fronts an RPC upstream for many clients runs more than the default
// 4 relays at once (the relay waits on its upstream, it does not use a
// core), and with 4 the 32-client figure is the worker's queue. The
// default is measured too (local-concurrency=4). result=512KiB asks
// eth_getLogs for a 512 KiB answer instead (the bare echo keeps the
// request's size). Run it with -benchtime 1x: the number of calls is
// fixed.
func BenchmarkRPCVsDirectUpstream(b *testing.B) {
	rig := newRPCRig(b, 64)
	b.Run("clients=1", func(b *testing.B) { rig.run(b, 1, 2000) })
	b.Run("clients=32", func(b *testing.B) { rig.run(b, 32, 150) })
	b.Run("clients=32/local-concurrency=4", func(b *testing.B) { newRPCRig(b, 0).run(b, 32, 150) })
	b.Run("clients=1/result=512KiB", func(b *testing.B) {
		logs := *rig
		logs.method, logs.result = "eth_getLogs", benchLogs
		logs.run(b, 1, 60)
	})
}

// hostLoad is the machine's CPU time from /proc/stat and this process's
// at the start of a measurement.
type hostLoad struct {
	busy, total uint64 // host, in clock ticks, all CPUs
	cpus        int    // the host's CPUs that /proc/stat lists
	own         time.Duration
	at          time.Time
	ok          bool // false where /proc/stat cannot be read
}

func startHostLoad(tb testing.TB) hostLoad {
	l := hostLoad{own: cpuTime(tb), at: time.Now()}
	l.busy, l.total, l.cpus, l.ok = readProcStat()
	return l
}

// otherCores is how many cores, on average, processes other than this
// one kept busy since l was taken.
func (l hostLoad) otherCores(tb testing.TB) (float64, bool) {
	own, at := cpuTime(tb), time.Now()
	busy, total, _, ok := readProcStat()
	if !l.ok || !ok || total <= l.total || !at.After(l.at) {
		return 0, false
	}
	host := float64(busy-l.busy) / float64(total-l.total) * float64(l.cpus)
	return max(host-(own-l.own).Seconds()/at.Sub(l.at).Seconds(), 0), true
}

// readProcStat reads the busy and total time of all CPUs (the "cpu"
// line: user, nice, system, idle, iowait, irq, softirq, steal; idle and
// iowait are not busy) and the number of CPUs.
func readProcStat() (busy, total uint64, cpus int, ok bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	lines := strings.Split(string(data), "\n")
	f := strings.Fields(lines[0])
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, 0, false
	}
	for i, v := range f[1:9] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, 0, false
		}
		total += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	for _, line := range lines[1:] {
		if strings.HasPrefix(line, "cpu") {
			cpus++
		}
	}
	return busy, total, cpus, cpus > 0
}
