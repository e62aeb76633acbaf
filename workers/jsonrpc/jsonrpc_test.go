package jsonrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/workertest"
)

// fakeUpstream is a loopback JSON-RPC endpoint that counts its requests.
type fakeUpstream struct {
	*httptest.Server
	chainID string
	head    atomic.Uint64
	mu      sync.Mutex
	hits    map[string]int
	// answer, when set, answers every method but eth_chainId and
	// eth_blockNumber; it writes the whole HTTP response.
	answer func(w http.ResponseWriter, method string, id, params json.RawMessage)
}

func newFakeUpstream(t *testing.T, chainID string, head uint64) *fakeUpstream {
	t.Helper()
	f := &fakeUpstream{chainID: chainID, hits: map[string]int{}}
	f.head.Store(head)
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req Call
	if err := json.Unmarshal(body, &req); err != nil {
		// A batch: answer each with its id and method name.
		var batch []Call
		if json.Unmarshal(body, &batch) != nil {
			http.Error(w, "bad body", 400)
			return
		}
		f.count("batch")
		var out []map[string]any
		for _, c := range batch {
			if c.Method == "limited" {
				out = append(out, map[string]any{"jsonrpc": "2.0", "id": c.ID, "error": map[string]any{"code": -32005, "message": "rate limited"}})
				continue
			}
			if c.Method == "wrongid" { // an upstream that mixes up answers
				out = append(out, map[string]any{"jsonrpc": "2.0", "id": 12345, "result": c.Method})
				continue
			}
			out = append(out, map[string]any{"jsonrpc": "2.0", "id": c.ID, "result": c.Method})
		}
		json.NewEncoder(w).Encode(out)
		return
	}
	f.count(req.Method)
	switch req.Method {
	case "eth_chainId":
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%q}`, req.ID, f.chainID)
	case "eth_blockNumber":
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":"0x%x"}`, req.ID, f.head.Load())
	default:
		if f.answer != nil {
			f.answer(w, req.Method, req.ID, req.Params)
			return
		}
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":"ok"}`, req.ID)
	}
}

func (f *fakeUpstream) count(method string) {
	f.mu.Lock()
	f.hits[method]++
	f.mu.Unlock()
}

func (f *fakeUpstream) get(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits[method]
}

func newJSONRPC(t *testing.T, f *fakeUpstream, chainID string, opts ...Option) (*Relay, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	j, err := New(ctx, config.JSONRPCConfig{Upstream: f.URL + "/v3/secret-key", ChainID: chainID, HeadInterval: time.Hour}, workertest.QuietLogger(), opts...)
	if err == nil {
		t.Cleanup(j.Close)
	}
	return j, err
}

func TestNewJSONRPC_ChainID(t *testing.T) {
	f := newFakeUpstream(t, "0x539", 100)
	for _, want := range []string{"1337", "0x539", "0X539", ""} {
		j, err := newJSONRPC(t, f, want)
		if err != nil {
			t.Fatalf("chain ID %q against an upstream on 1337: %v", want, err)
		}
		if h, ok := j.Head(); !ok || h != 100 {
			t.Fatalf("head after start = %d, %v; want 100 read at start", h, ok)
		}
		if id, ok := j.ChainID(); !ok || id != 1337 {
			t.Fatalf("ChainID() = %d, %v", id, ok)
		}
	}
	before := f.get("eth_chainId")
	_, err := newJSONRPC(t, f, "1")
	if !errors.Is(err, ErrChainIDMismatch) || !strings.Contains(err.Error(), "1337") || strings.Contains(err.Error(), "secret-key") {
		t.Fatalf("chain ID 1 against an upstream on 1337: %v; want ErrChainIDMismatch naming both, without the URL's path", err)
	}
	if f.get("eth_chainId") != before+1 {
		t.Fatal("the chain ID was not asked of the upstream")
	}
	for _, bad := range []string{"0x", "abc", "-1", "0x" + strings.Repeat("f", 17)} {
		if _, err := newJSONRPC(t, f, bad); err == nil || !strings.Contains(err.Error(), "jsonrpc-chain-id") {
			t.Errorf("chain ID %q: %v, want a config error", bad, err)
		}
	}

	// An upstream that cannot be asked: refused when a chain ID must be
	// checked, served (head unknown) when not.
	down := newFakeUpstream(t, "0x1", 1)
	down.Close()
	if _, err := newJSONRPC(t, down, "1"); err == nil || !strings.Contains(err.Error(), "check the chain ID") {
		t.Fatalf("unreachable upstream with a chain ID to check: %v", err)
	}
	j, err := newJSONRPC(t, down, "")
	if err != nil {
		t.Fatalf("unreachable upstream without a chain ID to check: %v", err)
	}
	if _, ok := j.Head(); ok {
		t.Fatal("head known although the upstream never answered")
	}

	for _, cfg := range []config.JSONRPCConfig{
		{Upstream: "", HeadInterval: time.Second},
		{Upstream: "ftp://x", HeadInterval: time.Second},
		{Upstream: f.URL, HeadInterval: 0},
	} {
		if _, err := New(context.Background(), cfg, nil); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
}

func rpcBody(id int, method, params string) []byte {
	return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, method, params)
}

func TestJSONRPC_Outcomes(t *testing.T) {
	f := newFakeUpstream(t, "0x1", 100)
	f.answer = func(w http.ResponseWriter, method string, id, params json.RawMessage) {
		reply := func(status int, body string) {
			w.WriteHeader(status)
			io.WriteString(w, body)
		}
		rpcErr := func(code int, msg string) string {
			return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%q}}`, id, code, msg)
		}
		switch method {
		case "eth_getBlockByNumber", "eth_getTransactionReceipt":
			reply(200, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":null}`, id))
		case "eth_getBalance":
			reply(200, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":"0x10"}`, id))
		case "not_found":
			reply(200, rpcErr(-32601, "the method not_found does not exist/is not available"))
		case "not_supported":
			reply(200, rpcErr(-32004, "method not supported"))
		case "limited":
			reply(200, rpcErr(-32005, "daily request count exceeded"))
		case "http429":
			reply(429, "slow down")
		case "server_error":
			reply(200, rpcErr(-32000, "header not found"))
		case "internal_error":
			reply(200, rpcErr(-32603, "internal"))
		case "http500":
			reply(500, "oops")
		case "http502_params":
			reply(502, rpcErr(-32602, "invalid argument 0"))
		case "invalid_params":
			reply(200, rpcErr(-32602, "invalid argument 0: hex string without 0x prefix"))
		case "revert":
			reply(200, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"code":3,"message":"execution reverted","data":"0x08c379a0"}}`, id))
		case "html":
			reply(200, "<html>maintenance</html>")
		case "other_id":
			reply(200, `{"jsonrpc":"2.0","id":999,"result":"0x1"}`)
		case "huge":
			reply(200, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":"%s"}`, id, strings.Repeat("a", 2048)))
		case "slow":
			time.Sleep(300 * time.Millisecond)
			reply(200, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":"late"}`, id))
		default:
			reply(200, rpcErr(-32601, "unknown to the fake"))
		}
	}
	j, err := newJSONRPC(t, f, "", WithMaxResponse(1024))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method, params string
		want           workers.Outcome
		code           int // the JSON-RPC error code the message must carry, 0: none
	}{
		{"eth_getBalance", `["0xabc", "0x5"]`, workers.Success, 0},
		{"eth_getBlockByNumber", `["0x65", false]`, workers.Empty, 0},
		{"eth_getTransactionReceipt", `["0xab"]`, workers.Success, 0}, // null is "not mined yet", not a miss
		{"not_found", `[]`, workers.Unsupported, -32601},
		{"not_supported", `[]`, workers.Unsupported, -32004},
		{"limited", `[]`, workers.Busy, -32005},
		{"http429", `[]`, workers.Busy, 0},
		{"server_error", `[]`, workers.RetryableError, -32000},
		{"internal_error", `[]`, workers.RetryableError, -32603},
		{"http500", `[]`, workers.RetryableError, 0},
		{"http502_params", `[]`, workers.PermanentError, -32602},
		{"invalid_params", `[]`, workers.PermanentError, -32602},
		{"revert", `[]`, workers.PermanentError, 3},
		{"html", `[]`, workers.RetryableError, 0},
		{"other_id", `[]`, workers.RetryableError, 0},
		{"huge", `[]`, workers.PermanentError, 0},
	} {
		r := j.Do(context.Background(), rpcBody(7, c.method, c.params))
		if r.Outcome != c.want {
			t.Errorf("%s: outcome %s (%s), want %s", c.method, r.Outcome, r.Error, c.want)
			continue
		}
		e, isRPC := ParseRPCError(r.Error)
		switch {
		case c.code != 0 && (!isRPC || e.Code != c.code):
			t.Errorf("%s: error %q, want the upstream's JSON-RPC error %d", c.method, r.Error, c.code)
		case c.code == 0 && isRPC:
			t.Errorf("%s: error %q is a JSON-RPC error object, want a plain message", c.method, r.Error)
		case strings.Contains(r.Error, "secret-key"):
			t.Errorf("%s: error %q shows the upstream URL's path", c.method, r.Error)
		}
		if c.want == workers.Success && !strings.Contains(string(r.Output), `"id":7`) {
			t.Errorf("%s: output %s, want the upstream's response", c.method, r.Output)
		}
	}
	if e, _ := ParseRPCError(j.Do(context.Background(), rpcBody(1, "revert", `[]`)).Error); string(e.Data) != `"0x08c379a0"` {
		t.Errorf("revert data %s, want it passed on", e.Data)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if r := j.Do(ctx, rpcBody(1, "slow", `[]`)); r.Outcome != workers.RetryableError || !strings.Contains(r.Error, "no answer") {
		t.Errorf("slow upstream: outcome %s (%s), want retryable", r.Outcome, r.Error)
	}

	hits := f.get("eth_getBalance")
	for payload, code := range map[string]int{
		`not json`:                       RPCParseError,
		`[]`:                             RPCInvalidRequest,
		`[1]`:                            RPCInvalidRequest,
		`"x"`:                            RPCInvalidRequest,
		`{"jsonrpc":"1.0","method":"a"}`: RPCInvalidRequest,
		`{"jsonrpc":"2.0"}`:              RPCInvalidRequest,
		`{"jsonrpc":"2.0","method":1}`:   RPCInvalidRequest,
		`{"jsonrpc":"2.0","method":"a","params":1}`: RPCInvalidRequest,
		`{"jsonrpc":"2.0","method":"a","id":{}}`:    RPCInvalidRequest,
	} {
		r := j.Do(context.Background(), []byte(payload))
		e, ok := ParseRPCError(r.Error)
		if r.Outcome != workers.PermanentError || !ok || e.Code != code {
			t.Errorf("payload %s: outcome %s (%s), want a permanent error %d", payload, r.Outcome, r.Error, code)
		}
	}
	if f.get("eth_getBalance") != hits || f.get("a") != 0 {
		t.Error("an invalid payload reached the upstream")
	}
}

func TestJSONRPC_Batch(t *testing.T) {
	f := newFakeUpstream(t, "0x1", 100)
	j, err := newJSONRPC(t, f, "", WithMaxBatch(3))
	if err != nil {
		t.Fatal(err)
	}
	r := j.Do(context.Background(), []byte(`[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":2,"method":"b"}]`))
	var out []Response
	if r.Outcome != workers.Success || json.Unmarshal(r.Output, &out) != nil || len(out) != 2 || string(out[1].Result) != `"b"` {
		t.Fatalf("batch: outcome %s (%s), output %s", r.Outcome, r.Error, r.Output)
	}
	r = j.Do(context.Background(), []byte(`[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":2,"method":"limited"}]`))
	if e, ok := ParseRPCError(r.Error); r.Outcome != workers.Busy || !ok || e.Code != RPCLimitExceeded {
		t.Fatalf("batch with a rate-limited element: outcome %s (%s), want busy", r.Outcome, r.Error)
	}
	// Every answer must be to a request of the batch, each request's once
	// (in any order), as a single request's id must match.
	r = j.Do(context.Background(), []byte(`[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":2,"method":"wrongid"}]`))
	if r.Outcome != workers.RetryableError || !strings.Contains(r.Error, "answered id 12345") {
		t.Fatalf("batch answered with an id it did not ask: outcome %s (%s), want retryable naming the id", r.Outcome, r.Error)
	}
	r = j.Do(context.Background(), []byte(`[{"jsonrpc":"2.0","id":2,"method":"b"},{"jsonrpc":"2.0","id":1,"method":"a"}]`))
	if r.Outcome != workers.Success {
		t.Fatalf("batch answered in its order: outcome %s (%s)", r.Outcome, r.Error)
	}
	// A notification in a batch gets no answer, so two answers are right.
	r = j.Do(context.Background(), []byte(`[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":2,"method":"b"}]`))
	if r.Outcome != workers.RetryableError || !strings.Contains(r.Error, "3 responses to a batch of 2") {
		t.Fatalf("batch answered with one response per request, notification included: outcome %s (%s)", r.Outcome, r.Error)
	}
	if r := j.Do(context.Background(), []byte(`[{"jsonrpc":"2.0","method":"n"}]`)); r.Outcome != workers.Success || len(r.Output) != 0 {
		t.Fatalf("batch of notifications: outcome %s (%s) output %q, want success without output", r.Outcome, r.Error, r.Output)
	}
	before := f.get("batch")
	r = j.Do(context.Background(), []byte(`[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":2,"method":"a"},{"jsonrpc":"2.0","id":3,"method":"a"},{"jsonrpc":"2.0","id":4,"method":"a"}]`))
	if r.Outcome != workers.PermanentError || !strings.Contains(r.Error, "more than 3") || f.get("batch") != before {
		t.Fatalf("batch over the limit: outcome %s (%s)", r.Outcome, r.Error)
	}
	r = j.Do(context.Background(), []byte(`[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":2}]`))
	if r.Outcome != workers.PermanentError || !strings.Contains(r.Error, "batch element 1") {
		t.Fatalf("batch with an invalid element: outcome %s (%s)", r.Outcome, r.Error)
	}
}

func TestJSONRPC_RunFollowsHead(t *testing.T) {
	f := newFakeUpstream(t, "0x1", 100)
	heads := make(chan uint64, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	j, err := New(ctx, config.JSONRPCConfig{Upstream: f.URL, HeadInterval: 5 * time.Millisecond}, workertest.QuietLogger(),
		WithHeadChange(func(h uint64) {
			select {
			case heads <- h:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	if h := <-heads; h != 100 {
		t.Fatalf("first head %d, want 100", h)
	}
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx) }()
	f.head.Store(105)
	for h := uint64(0); h != 105; {
		select {
		case h = <-heads:
		case <-ctx.Done():
			t.Fatal("no head change to 105 reported")
		}
	}
	if h, _ := j.Head(); h != 105 {
		t.Fatalf("Head() = %d after the upstream moved to 105", h)
	}
	j.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	if err := j.TypeHealth(); err != nil {
		t.Fatalf("TypeHealth() = %v with an answering upstream", err)
	}
	// A failing upstream keeps the last head, and makes the type unhealthy.
	f.Close()
	j.pollHead(ctx)
	if h, ok := j.Head(); !ok || h != 105 {
		t.Fatalf("after a failed poll Head() = %d, %v; want the last head 105", h, ok)
	}
	if err := j.TypeHealth(); err == nil || !strings.Contains(err.Error(), "head poll failed (1 in a row)") {
		t.Fatalf("TypeHealth() = %v after a failed head poll", err)
	}
	// While out, the type refuses its work (the node has withdrawn it; a
	// request that was already on its way goes to the next worker).
	if r := j.Do(ctx, []byte(`{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}`)); r.Outcome != workers.Unsupported ||
		!strings.Contains(r.Error, "jsonrpc is out on this worker") {
		t.Fatalf("Do while out: %s %q, want unsupported", r.Outcome, r.Error)
	}
	if err := j.Run(ctx); !errors.Is(err, ErrJSONRPCClosed) {
		t.Fatalf("Run after Close: %v", err)
	}
}

// TestJSONRPC_OnlyTheMethodsListedAreRelayed: with the default
// jsonrpc-methods (eth_*, net_*, web3_*) a call of another namespace
// (admin_, personal_, debug_), alone or in a batch, is answered method not
// found, unsupported (another worker may relay it), and never reaches the
// upstream; a listed name or namespace is relayed, and "*" relays all.
func TestJSONRPC_OnlyTheMethodsListedAreRelayed(t *testing.T) {
	f := newFakeUpstream(t, "0x1", 100)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	relay := func(methods []string) *Relay {
		j, err := New(ctx, config.JSONRPCConfig{Upstream: f.URL, HeadInterval: time.Hour, Methods: methods}, workertest.QuietLogger())
		workertest.Must(t, err)
		t.Cleanup(j.Close)
		return j
	}
	j := relay(config.DefaultJSONRPCMethods)
	for _, payload := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"admin_addPeer","params":["enode://x"]}`,
		`{"jsonrpc":"2.0","id":1,"method":"personal_unlockAccount","params":[]}`,
		`[{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber"},{"jsonrpc":"2.0","id":2,"method":"debug_setHead","params":["0x0"]}]`,
		`{"jsonrpc":"2.0","id":1,"method":"eth"}`,
	} {
		r := j.Do(ctx, []byte(payload))
		e, ok := ParseRPCError(r.Error)
		if r.Outcome != workers.Unsupported || !ok || e.Code != RPCMethodNotFound || !strings.Contains(e.Message, "not relayed by this worker (jsonrpc-methods)") {
			t.Errorf("%s: outcome %s (%s), want unsupported, method not found", payload, r.Outcome, r.Error)
		}
	}
	// A second method member, in another case or escaped, which Go's
	// decoder would take for the one checked, while an upstream with a
	// case-sensitive decoder runs the first: refused as invalid.
	for _, payload := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"admin_addPeer","params":["enode://x"],"Method":"web3_clientVersion"}`,
		`{"jsonrpc":"2.0","id":1,"METHOD":"web3_clientVersion","method":"admin_addPeer"}`,
		`{"jsonrpc":"2.0","id":1,"method":"admin_addPeer","\u006dethod":"web3_clientVersion"}`,
		`{"jsonrpc":"2.0","id":1,"method":"admin_addPeer","method":"web3_clientVersion"}`,
		`{"jsonrpc":"2.0","id":1,"Method":"web3_clientVersion"}`,
	} {
		r := j.Do(ctx, []byte(payload))
		e, ok := ParseRPCError(r.Error)
		if r.Outcome != workers.PermanentError || !ok || e.Code != RPCInvalidRequest || !strings.Contains(e.Message, "at most once, written in lower case") {
			t.Errorf("%s: outcome %s (%s), want invalid request", payload, r.Outcome, r.Error)
		}
	}
	for _, m := range []string{"admin_addPeer", "personal_unlockAccount", "debug_setHead", "eth", "batch", "web3_clientVersion"} {
		if n := f.get(m); n != 0 {
			t.Errorf("%s reached the upstream %d times", m, n)
		}
	}
	if r := j.Do(ctx, []byte(`{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber"}`)); r.Outcome != workers.Success {
		t.Errorf("eth_blockNumber under the default: outcome %s (%s)", r.Outcome, r.Error)
	}
	if r := relay([]string{"eth_blockNumber", "debug_*"}).Do(ctx, []byte(`{"jsonrpc":"2.0","id":1,"method":"debug_setHead","params":["0x0"]}`)); r.Outcome == workers.Unsupported {
		t.Errorf("debug_setHead with debug_* listed: %s (%s), want it relayed", r.Outcome, r.Error)
	}
	if r := relay([]string{"*"}).Do(ctx, []byte(`{"jsonrpc":"2.0","id":1,"method":"admin_peers"}`)); r.Outcome == workers.Unsupported {
		t.Errorf("admin_peers with * listed: %s (%s), want it relayed", r.Outcome, r.Error)
	}
	if f.get("debug_setHead") != 1 || f.get("admin_peers") != 1 {
		t.Errorf("the listed methods reached the upstream %d and %d times, want once each", f.get("debug_setHead"), f.get("admin_peers"))
	}
}
