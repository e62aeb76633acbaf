package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// The end-to-end run against a real local chain: ganache and ethers come
// from the npm registry (tests/e2e/package.json pins them, `npm ci --prefix
// tests/e2e` installs them; .ci/run does). Without node or the install the
// test skips, unless WMTEST_E2E=1 (as in CI), where it fails instead. The
// variable has no WORKMESH_ prefix on purpose: the binary refuses to start
// with a WORKMESH_* variable that is not a setting, and every test's node
// processes inherit the environment.
const (
	e2eDir     = "e2e"
	e2eEnv     = "WMTEST_E2E"
	e2eChainID = 1337
	// e2eMinNode is the oldest Node.js major version the client runs on
	// (global fetch, ethers v6).
	e2eMinNode = 18
)

// requireE2E returns the node executable, or skips (fails under
// WMTEST_E2E=1) when the JavaScript side cannot run here.
func requireE2E(t *testing.T) string {
	t.Helper()
	required := os.Getenv(e2eEnv) == "1"
	missing := func(format string, args ...any) string {
		msg := fmt.Sprintf(format, args...) + "; install with `npm ci --prefix tests/e2e` (Node.js " +
			strconv.Itoa(e2eMinNode) + "+ and npm needed)"
		if required {
			t.Fatalf("%s=1 but the end-to-end chain test cannot run: %s", e2eEnv, msg)
		}
		t.Skipf("skipping the end-to-end chain test: %s (set %s=1 to make this a failure)", msg, e2eEnv)
		return ""
	}
	if testing.Short() && !required {
		t.Skip("skipping the end-to-end chain test in -short mode: it builds the binary and starts ganache")
	}
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		return missing("node is not on PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, nodeBin, "--version").Output()
	if err != nil {
		return missing("node --version: %v", err)
	}
	v := strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
	major, err := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	if err != nil || major < e2eMinNode {
		return missing("node %s is too old or unreadable", strings.TrimSpace(string(out)))
	}
	// The installed packages must be the pinned ones: a stale install would
	// test something else than CI does.
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	data, err := os.ReadFile(filepath.Join(e2eDir, "package.json"))
	if err != nil {
		t.Fatalf("read the e2e package.json: %v", err)
	}
	if err := json.Unmarshal(data, &pkg); err != nil {
		t.Fatalf("e2e package.json: %v", err)
	}
	for _, name := range []string{"ganache", "ethers"} {
		want := pkg.Dependencies[name]
		if want == "" {
			t.Fatalf("tests/e2e/package.json does not pin %s", name)
		}
		var got struct {
			Version string `json:"version"`
		}
		data, err := os.ReadFile(filepath.Join(e2eDir, "node_modules", name, "package.json"))
		if err != nil {
			return missing("%s is not installed in tests/e2e/node_modules", name)
		}
		if json.Unmarshal(data, &got) != nil || got.Version != want {
			return missing("tests/e2e/node_modules has %s %q, package.json pins %q", name, got.Version, want)
		}
	}
	return nodeBin
}

// ganacheChain is a running ganache on loopback.
type ganacheChain struct {
	url     string
	log     string // its verbose log: every request it answered, with params
	done    chan struct{}
	started time.Time
	stop    func()
}

// launchGanache starts ganache on a free loopback port with chain ID 1337
// and the deterministic wallet, without waiting for it (the binary builds
// meanwhile). It is killed, with its whole process group, at cleanup.
func launchGanache(t *testing.T, nodeBin string, try int) *ganacheChain {
	t.Helper()
	cli, err := filepath.Abs(filepath.Join(e2eDir, "node_modules", "ganache", "dist", "node", "cli.js"))
	if err != nil {
		t.Fatal(err)
	}
	addr := freeLoopbackAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	g := &ganacheChain{
		url:  "http://" + addr,
		log:  filepath.Join(t.TempDir(), fmt.Sprintf("ganache-%d.log", try)),
		done: make(chan struct{}),
	}
	logFile, err := os.Create(g.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nodeBin, cli,
		"--server.host", "127.0.0.1", "--server.port", port,
		"--chain.chainId", strconv.Itoa(e2eChainID), "--wallet.deterministic",
		"--logging.verbose") // each request with its params, to count upstream hits
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	g.started = time.Now()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("start ganache: %v", err)
	}
	go func() {
		cmd.Wait()
		logFile.Close()
		close(g.done)
	}()
	var once sync.Once
	g.stop = func() {
		once.Do(func() {
			pgid := cmd.Process.Pid
			syscall.Kill(-pgid, syscall.SIGTERM)
			select {
			case <-g.done:
			case <-time.After(5 * time.Second):
				syscall.Kill(-pgid, syscall.SIGKILL)
				<-g.done
			}
			// Anything it left in its group goes too.
			syscall.Kill(-pgid, syscall.SIGKILL)
		})
	}
	t.Cleanup(g.stop)
	return g
}

// awaitGanache waits until g answers eth_chainId with 1337. The port was
// free when chosen but another process may have taken it before ganache
// listened, so a ganache that exits is started again on a new port (three
// tries in all).
func awaitGanache(t *testing.T, nodeBin string, g *ganacheChain) *ganacheChain {
	t.Helper()
	for try := 1; ; try++ {
		err := g.ready()
		if err == nil {
			t.Logf("ganache %s ready %s after its start", g.url, time.Since(g.started).Round(time.Millisecond))
			return g
		}
		g.stop()
		if try == 3 {
			t.Fatalf("ganache did not start: %v", err)
		}
		t.Logf("ganache start %d: %v", try, err)
		g = launchGanache(t, nodeBin, try+1)
	}
}

// ready polls eth_chainId for up to a minute from the start (the binary
// builds meanwhile, and CI runs other test packages at the same time).
func (g *ganacheChain) ready() error {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var got string
		err := e2eRPC(ctx, g.url, `{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}`, &got)
		cancel()
		if err == nil {
			if got != fmt.Sprintf("0x%x", e2eChainID) {
				return fmt.Errorf("ganache reports chain ID %s, want %#x", got, e2eChainID)
			}
			return nil
		}
		select {
		case <-g.done:
			return fmt.Errorf("ganache exited before answering: %v\n%s", err, e2eFileTail(g.log, 2000))
		case <-time.After(100 * time.Millisecond): // polling an external process
		}
		if time.Since(g.started) > time.Minute {
			return fmt.Errorf("ganache does not answer eth_chainId within a minute: %v\n%s", err, e2eFileTail(g.log, 2000))
		}
	}
}

// calls returns the params of every request for method ganache logged
// (its --logging.verbose output: "   >  method: [" and then the params,
// one line each, until "   > ]").
func (g *ganacheChain) calls(t *testing.T, method string) [][]string {
	t.Helper()
	data, err := os.ReadFile(g.log)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	var cur []string
	in := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, ">") {
			in = false
			continue
		}
		line = strings.TrimSpace(strings.TrimPrefix(line, ">"))
		switch {
		case line == method+": []":
			out = append(out, nil)
		case line == method+": [":
			in, cur = true, nil
		case in && line == "]":
			out = append(out, cur)
			in = false
		case in:
			cur = append(cur, strings.TrimSuffix(line, ","))
		}
	}
	return out
}

// tail returns the last n bytes of a file, for failure messages.
func e2eFileTail(path string, n int) string {
	data, _ := os.ReadFile(path)
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return string(data)
}

// rawRPC posts one JSON-RPC request and decodes its result into out.
func e2eRPC(ctx context.Context, url, body string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var r rpcReply
	data, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("HTTP %d %q: %v", resp.StatusCode, data, err)
	}
	if r.Error != nil {
		return fmt.Errorf("JSON-RPC error: %s", r)
	}
	return json.Unmarshal(r.Result, out)
}

// getJSON fetches a node API path and decodes the answer.
func e2eGetJSON(t *testing.T, api, path string, out any) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	data, err := e2eGet(ctx, "http://"+api+path)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(data), out)
}

func e2eGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: HTTP %d %s", url, resp.StatusCode, data)
	}
	return string(data), err
}

// metricSum adds up the samples of a Prometheus metric whose labels include
// all of want, read from a node's /metrics.
func e2eMetric(t *testing.T, api, name string, want map[string]string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	text, err := e2eGet(ctx, "http://"+api+"/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", api, err)
	}
	var sum float64
	for line := range strings.SplitSeq(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		match := true
		for k, v := range want {
			if !strings.Contains(line, k+`="`+v+`"`) {
				match = false
			}
		}
		if !match {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += f
	}
	return sum
}

// e2eResult is what tests/e2e/client.mjs prints.
type e2eResult struct {
	Error          string `json:"error"`
	Step           string `json:"step"`
	ChainID        string `json:"chainId"`
	StartBlock     uint64 `json:"startBlock"`
	ReceiverBefore string `json:"receiverBefore"`
	ReceiverAfter  string `json:"receiverAfter"`
	Value          string `json:"value"`
	Sender         string `json:"sender"`
	TxHash         string `json:"txHash"`
	Receipt        struct {
		Status      int    `json:"status"`
		BlockNumber uint64 `json:"blockNumber"`
		Hash        string `json:"hash"`
		From        string `json:"from"`
		To          string `json:"to"`
	} `json:"receipt"`
	MinedBlock struct {
		Number       uint64   `json:"number"`
		Transactions []string `json:"transactions"`
	} `json:"minedBlock"`
	EthersBatch struct {
		GenesisNumber    *uint64 `json:"genesisNumber"`
		BalanceAtGenesis string  `json:"balanceAtGenesis"`
		SenderNonce      uint64  `json:"senderNonce"`
	} `json:"ethersBatch"`
	RawBatch struct {
		Status int        `json:"status"`
		Body   []rpcReply `json:"body"`
	} `json:"rawBatch"`
	Head         uint64  `json:"head"`
	AtHeadNumber *uint64 `json:"atHeadNumber"`
	BeyondHead   struct {
		Number uint64          `json:"number"`
		Hex    string          `json:"hex"`
		Block  json.RawMessage `json:"block"`
	} `json:"beyondHead"`
}

const (
	e2eSender   = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"
	e2eReceiver = "0xFFcf8FDEE72ac11b5c542428B35EEF5769C409f0"
)

// TestE2EChain runs a standard Ethereum client (ethers) against a workmesh
// node's /v1/rpc, with a real chain (ganache) behind two workmesh nodes:
// gateway A and worker B, both relaying to ganache. A dispatches to B
// first (remote before local), so the client's requests cross the network.
func TestE2EChain(t *testing.T) {
	nodeBin := requireE2E(t)
	pending := launchGanache(t, nodeBin, 1)
	bin := buildBinary(t) // while ganache starts
	chain := awaitGanache(t, nodeBin, pending)

	upstream := []string{"--jsonrpc-upstream", chain.url, "--jsonrpc-chain-id", strconv.Itoa(e2eChainID),
		"--jsonrpc-head-interval", "200ms"}
	a := startNodeProcess(t, bin, append([]string{"--work-types", "echo"}, upstream...)...)
	b := startNodeProcess(t, bin, append([]string{"--work-types", "jsonrpc", "--bootstrap", a.join}, upstream...)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway A %s stderr (tail):\n%s", a.peerID, e2eTail(a.stderr.String(), 4000))
			t.Logf("worker B %s stderr (tail):\n%s", b.peerID, e2eTail(b.stderr.String(), 4000))
			t.Logf("ganache log (tail):\n%s", e2eFileTail(chain.log, 4000))
		}
	})
	waitJSONRPCWorker(t, a, b)

	rpcURL := "http://" + a.api + "/v1/rpc"
	res := runE2EClient(t, nodeBin, rpcURL)

	t.Run("chain ID", func(t *testing.T) {
		if res.ChainID != strconv.Itoa(e2eChainID) {
			t.Errorf("getNetwork: chain ID %s, want %d", res.ChainID, e2eChainID)
		}
	})
	t.Run("signed transfer mined and seen in the balance", func(t *testing.T) {
		if res.Receipt.Status != 1 || res.Receipt.Hash != res.TxHash || res.Receipt.BlockNumber <= res.StartBlock {
			t.Errorf("receipt %+v for tx %s (start block %d), want status 1 in a later block", res.Receipt, res.TxHash, res.StartBlock)
		}
		if !strings.EqualFold(res.Receipt.From, e2eSender) || !strings.EqualFold(res.Receipt.To, e2eReceiver) {
			t.Errorf("receipt from %s to %s, want %s to %s", res.Receipt.From, res.Receipt.To, e2eSender, e2eReceiver)
		}
		if res.MinedBlock.Number != res.Receipt.BlockNumber || !slices.Contains(res.MinedBlock.Transactions, res.TxHash) {
			t.Errorf("block %d holds %v, want block %d with %s", res.MinedBlock.Number, res.MinedBlock.Transactions, res.Receipt.BlockNumber, res.TxHash)
		}
		before, ok1 := new(big.Int).SetString(res.ReceiverBefore, 10)
		after, ok2 := new(big.Int).SetString(res.ReceiverAfter, 10)
		value, ok3 := new(big.Int).SetString(res.Value, 10)
		if !ok1 || !ok2 || !ok3 || value.Sign() <= 0 {
			t.Fatalf("balances %q -> %q, value %q: not numbers", res.ReceiverBefore, res.ReceiverAfter, res.Value)
		}
		if gained := new(big.Int).Sub(after, before); gained.Cmp(value) != 0 {
			t.Errorf("receiver balance %s -> %s: gained %s wei, want %s", before, after, gained, value)
		}
	})
	t.Run("ethers batch", func(t *testing.T) {
		eb := res.EthersBatch
		if eb.GenesisNumber == nil || *eb.GenesisNumber != 0 || eb.BalanceAtGenesis != res.ReceiverBefore || eb.SenderNonce != 1 {
			t.Errorf("batch answers %+v (genesis number, receiver balance at block 0, sender nonce), want 0, %s, 1", eb, res.ReceiverBefore)
		}
	})
	t.Run("raw batch in order with an error", func(t *testing.T) {
		rb := res.RawBatch
		if rb.Status != http.StatusOK || len(rb.Body) != 4 {
			t.Fatalf("HTTP %d with %d answers %v, want 200 and 4", rb.Status, len(rb.Body), rb.Body)
		}
		wantIDs := []string{"11", `"b"`, "13", "14"}
		for i, r := range rb.Body {
			if string(r.ID) != wantIDs[i] {
				t.Errorf("answer %d has id %s, want %s (answers in request order)", i, r.ID, wantIDs[i])
			}
		}
		var chainID, balance string
		if json.Unmarshal(rb.Body[0].Result, &chainID); chainID != fmt.Sprintf("0x%x", e2eChainID) {
			t.Errorf("eth_chainId in a batch: %s", rb.Body[0])
		}
		if json.Unmarshal(rb.Body[1].Result, &balance); balance == "" {
			t.Errorf("eth_getBalance in a batch: %s", rb.Body[1])
		} else if got, ok := new(big.Int).SetString(strings.TrimPrefix(balance, "0x"), 16); !ok || got.String() != res.ReceiverAfter {
			t.Errorf("eth_getBalance in a batch: %s, want %s", balance, res.ReceiverAfter)
		}
		// ganache answers an unknown method with code -32700 (not -32601);
		// workmesh hands the upstream's error to the client as it is. (The
		// method is in the eth_ namespace, which jsonrpc-methods relays by
		// default; one of another namespace goes nowhere near ganache.)
		if e := rb.Body[2].Error; e == nil || !strings.Contains(e.Message, "eth_noSuchMethod") {
			t.Errorf("unknown method in a batch: %s, want ganache's error naming it", rb.Body[2])
		}
		var tx struct {
			Hash string `json:"hash"`
		}
		if json.Unmarshal(rb.Body[3].Result, &tx); tx.Hash != res.TxHash {
			t.Errorf("eth_getTransactionByHash in a batch: %s, want %s", rb.Body[3], res.TxHash)
		}
	})
	t.Run("beyond the head: null with one upstream hit", func(t *testing.T) {
		if res.AtHeadNumber == nil || *res.AtHeadNumber != res.Head {
			t.Errorf("getBlock(head %d): number %v, want the block", res.Head, res.AtHeadNumber)
		}
		if bh := res.BeyondHead; bh.Number != res.Head+1 || string(bh.Block) != "null" {
			t.Errorf("getBlock(head+1 = %d): %s, want null", bh.Number, bh.Block)
		}
		var hits int
		for _, params := range chain.calls(t, "eth_getBlockByNumber") {
			if len(params) > 0 && params[0] == `"`+res.BeyondHead.Hex+`"` {
				hits++
			}
		}
		if hits != 1 {
			t.Errorf("ganache answered eth_getBlockByNumber(%s) %d times, want 1 (the beyond-head rule)", res.BeyondHead.Hex, hits)
		}
		if n := e2eMetric(t, a.api, "workmesh_beyond_head_total", map[string]string{"work_type": "jsonrpc"}); n < 1 {
			t.Errorf("gateway workmesh_beyond_head_total{work_type=jsonrpc} = %v, want at least 1", n)
		}
	})
	t.Run("the transaction reached the chain once", func(t *testing.T) {
		// eth_sendRawTransaction is not idempotent: one relay, no retry.
		if sends := chain.calls(t, "eth_sendRawTransaction"); len(sends) != 1 {
			t.Errorf("ganache received eth_sendRawTransaction %d times, want 1", len(sends))
		}
	})
	t.Run("served remotely by B", func(t *testing.T) {
		remote := e2eMetric(t, a.api, "workmesh_attempts_total", map[string]string{"peer": b.peerID, "outcome": "success"})
		remote += e2eMetric(t, a.api, "workmesh_attempts_total", map[string]string{"peer": b.peerID, "outcome": "empty"})
		local := e2eMetric(t, a.api, "workmesh_attempts_total", map[string]string{"peer": "local"})
		failed := e2eMetric(t, a.api, "workmesh_attempts_total", nil) - remote - local
		served := e2eMetric(t, b.api, "workmesh_served_total", nil)
		requests := e2eMetric(t, a.api, "workmesh_requests_total", map[string]string{"work_type": "jsonrpc"})
		fallbacks := e2eMetric(t, a.api, "workmesh_fallbacks_total", map[string]string{"work_type": "jsonrpc"})
		t.Logf("gateway: %v jsonrpc requests, %v attempts decided by B with a result, %v that ended otherwise (the unknown method), %v local, %v fallbacks; B served %v",
			requests, remote, failed, local, fallbacks, served)
		if remote < 1 || served < remote {
			t.Errorf("B decided %v attempts of the gateway and served %v requests, want at least 1 of each", remote, served)
		}
		// B is alive and its upstream is the same chain: nothing should
		// fall back to the gateway's own worker.
		if local != 0 || fallbacks != 0 {
			t.Errorf("%v attempts and %v fallbacks on the gateway's local worker, want none", local, fallbacks)
		}
	})
	t.Run("chain ID mismatch refused at start", func(t *testing.T) {
		start := time.Now()
		r := runCLI(t, bin, nil, "node", "start", "--listen", loopbackQUIC, "--api", "127.0.0.1:0",
			"--data-dir", t.TempDir(), "--jsonrpc-upstream", chain.url, "--jsonrpc-chain-id", "1")
		if r.code == 0 {
			t.Fatalf("node start with --jsonrpc-chain-id 1 in front of chain %d exited 0\nstdout %s\nstderr %s", e2eChainID, r.stdout, r.stderr)
		}
		if !strings.Contains(r.stderr, "1337") || !strings.Contains(r.stderr, "jsonrpc-chain-id is 1:") {
			t.Errorf("exit code %d, stderr %q: want both chain IDs named (1337 and 1)", r.code, r.stderr)
		}
		if strings.Contains(r.stdout, "ready") {
			t.Errorf("the refused node printed ready: %s", r.stdout)
		}
		t.Logf("refused in %s with exit code %d: %s", time.Since(start).Round(time.Millisecond), r.code, strings.TrimSpace(r.stderr))
	})
}

func e2eTail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// waitJSONRPCWorker waits until gateway a lists b with its jsonrpc head and
// its dispatcher would send jsonrpc work to b first.
func waitJSONRPCWorker(t *testing.T, a, b *nodeProcess) {
	t.Helper()
	if _, err := testkit.Poll(20*time.Second, func() error {
		var peers []struct {
			ID    string            `json:"id"`
			Heads map[string]uint64 `json:"heads"`
		}
		var plan struct {
			Order []struct {
				Peer string `json:"peer"`
			} `json:"order"`
		}
		err := e2eGetJSON(t, a.api, "/v1/peers", &peers)
		if err == nil {
			err = e2eGetJSON(t, a.api, "/v1/plan?type=jsonrpc", &plan)
		}
		if err != nil {
			return err
		}
		hasHead := slices.ContainsFunc(peers, func(p struct {
			ID    string            `json:"id"`
			Heads map[string]uint64 `json:"heads"`
		}) bool {
			_, ok := p.Heads["jsonrpc"]
			return p.ID == b.peerID && ok
		})
		if hasHead && len(plan.Order) > 0 && plan.Order[0].Peer == b.peerID {
			return nil
		}
		return fmt.Errorf("peers %+v, plan order %+v", peers, plan.Order)
	}); err != nil {
		t.Fatalf("gateway does not rank B %s for jsonrpc with a head within 20s: %v\ngateway stderr:\n%s", b.peerID, err, e2eTail(a.stderr.String(), 4000))
	}
}

// runE2EClient runs tests/e2e/client.mjs against rpcURL, within a minute.
func runE2EClient(t *testing.T, nodeBin, rpcURL string) e2eResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, filepath.Join(e2eDir, "client.mjs"), rpcURL)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("ethers client ran in %s", time.Since(start).Round(time.Millisecond))
	var res e2eResult
	if jerr := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &res); jerr != nil {
		t.Fatalf("ethers client: %v; output %q: %v\nstderr %s", err, stdout.String(), jerr, stderr.String())
	}
	if res.Error != "" || err != nil {
		t.Fatalf("ethers client failed at step %q: %s (%v)\nstderr %s", res.Step, res.Error, err, stderr.String())
	}
	t.Logf("ethers client: chain %s, transfer %s mined in block %d, head %d", res.ChainID, res.TxHash, res.Receipt.BlockNumber, res.Head)
	return res
}
