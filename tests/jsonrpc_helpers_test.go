package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/api"
	"github.com/workmesh/workmesh/workers/jsonrpc"
)

// chainUpstream is a fake Ethereum JSON-RPC node on loopback. It counts
// the requests relayed to it (everything but the chain ID and head polls)
// in hits under its name, and answers with its name so a test can tell
// who served.
type chainUpstream struct {
	name    string
	srv     *httptest.Server
	chainID uint64
	head    uint64
	hits    *hitCounter
	polls   atomic.Int64
	relayed atomic.Int64

	// nullBlocks: answers null for every block (a node that lacks them).
	nullBlocks bool
	// stateFrom: state below this block is pruned ("missing trie node",
	// as a full node answers); 0 keeps all state (an archive node).
	stateFrom uint64
	// failEvery: every failEvery-th relayed request fails with HTTP 500.
	failEvery int64
	// delay is added to every relayed request, as a real node takes time.
	delay time.Duration
	// greyPolls: while set, a head poll fails with HTTP 500 with
	// probability 2/3, drawn from a seeded sequence (not every third: the
	// node's health answer is sampled by pings on a period of their own,
	// and a fixed pattern could alias with it so that every ping saw a
	// good poll).
	// 500 (an upstream that turned grey: its node's health pings fail).
	greyPolls atomic.Bool
	// downPolls: while set, every head poll fails with HTTP 500.
	downPolls atomic.Bool
	headPolls atomic.Int64
	greyMu    sync.Mutex
	greyRand  *rand.Rand
}

func newChainUpstream(t testing.TB, name string, hits *hitCounter, setup func(*chainUpstream)) *chainUpstream {
	t.Helper()
	u := &chainUpstream{name: name, chainID: 1337, head: 100, hits: hits}
	if setup != nil {
		setup(u)
	}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

// greyDraw returns the next number of the grey sequence, in [0, 1).
func (u *chainUpstream) greyDraw() float64 {
	u.greyMu.Lock()
	defer u.greyMu.Unlock()
	if u.greyRand == nil {
		u.greyRand = rand.New(rand.NewPCG(7, 11))
	}
	return u.greyRand.Float64()
}

type fakeCall struct {
	ID     json.RawMessage   `json:"id"`
	Method string            `json:"method"`
	Params []json.RawMessage `json:"params"`
}

func (u *chainUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var c fakeCall
	if err := json.Unmarshal(body, &c); err != nil {
		http.Error(w, "fake upstream takes single requests only", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	result := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, c.ID, b)
	}
	rpcErr := func(code int, msg string) {
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%q}}`, c.ID, code, msg)
	}
	switch c.Method {
	case "eth_chainId":
		u.polls.Add(1)
		result(fmt.Sprintf("0x%x", u.chainID))
		return
	case "eth_blockNumber":
		u.polls.Add(1)
		if u.headPolls.Add(1); u.downPolls.Load() || u.greyPolls.Load() && u.greyDraw() < 2.0/3 {
			http.Error(w, "upstream overloaded", http.StatusInternalServerError)
			return
		}
		result(fmt.Sprintf("0x%x", u.head))
		return
	}
	u.hits.add(u.name)
	n := u.relayed.Add(1)
	if u.delay > 0 {
		time.Sleep(u.delay)
	}
	if u.failEvery > 0 && n%u.failEvery == 0 {
		http.Error(w, "upstream overloaded", http.StatusInternalServerError)
		return
	}
	param := func(i int) string {
		if i >= len(c.Params) {
			return "latest"
		}
		var s string
		json.Unmarshal(c.Params[i], &s)
		return s
	}
	block := func(tag string) (uint64, bool) {
		if tag == "latest" {
			return u.head, true
		}
		n, err := strconv.ParseUint(strings.TrimPrefix(tag, "0x"), 16, 64)
		return n, err == nil
	}
	switch c.Method {
	case "eth_getBlockByNumber":
		n, ok := block(param(0))
		if !ok || n > u.head || u.nullBlocks {
			result(nil)
			return
		}
		result(map[string]string{"number": fmt.Sprintf("0x%x", n), "servedBy": u.name})
	case "eth_getBalance":
		n, ok := block(param(1))
		switch {
		case !ok || n > u.head:
			rpcErr(-32000, "header not found")
		case n < u.stateFrom:
			rpcErr(-32000, fmt.Sprintf("missing trie node (block %d is pruned)", n))
		default:
			result(u.name)
		}
	case "eth_sendRawTransaction":
		result(u.name) // as if it were the transaction's hash
	default:
		rpcErr(-32601, "the method "+c.Method+" does not exist/is not available")
	}
}

// jsonrpcSpec is a member serving jsonrpc from upstream u.
func jsonrpcSpec(t testing.TB, name string, labels []string, u *chainUpstream, cfg func(*config.Config)) memberSpec {
	t.Helper()
	return memberSpec{name: name, labels: labels, cfg: cfg, handlers: map[string]workers.Handler{
		jsonrpc.Type: startJSONRPC(t, u, ""),
	}}
}

// startJSONRPC starts the jsonrpc work type in front of u, with its head
// poller, stopped at cleanup.
func startJSONRPC(t testing.TB, u *chainUpstream, chainID string) *jsonrpc.Relay {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	j, err := jsonrpc.New(ctx, config.JSONRPCConfig{Upstream: u.srv.URL, ChainID: chainID, HeadInterval: 50 * time.Millisecond}, testLogger())
	if err != nil {
		t.Fatalf("jsonrpc for %s: %v", u.name, err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = j.Run(context.Background()) }()
	t.Cleanup(func() { j.Close(); <-done })
	return j
}

// rpcEndpointOf serves POST /v1/rpc in front of the member's dispatcher
// and returns its URL.
func rpcEndpointOf(t testing.TB, m *member) string {
	t.Helper()
	h, err := api.NewRPC(m.disp.Dispatch, api.WithTimeout(5*time.Second), api.WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + api.RPCPath
}

// rpcReply is a JSON-RPC response as a client reads it.
type rpcReply struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

func (r rpcReply) String() string {
	if r.Error != nil {
		return fmt.Sprintf("id %s error %d %q %s", r.ID, r.Error.Code, r.Error.Message, r.Error.Data)
	}
	return fmt.Sprintf("id %s result %s", r.ID, r.Result)
}

// servedBy reads the name of the upstream that answered.
func (r rpcReply) servedBy() string {
	var s string
	if json.Unmarshal(r.Result, &s) == nil {
		return s
	}
	var b struct {
		ServedBy string `json:"servedBy"`
	}
	json.Unmarshal(r.Result, &b)
	return b.ServedBy
}

// rpcRequest is one request of a client.
type rpcRequest struct {
	JSONRPC string `json:"jsonrpc"`
	ID      int    `json:"id"`
	Method  string `json:"method"`
	Params  []any  `json:"params"`
}

func req(id int, method string, params ...any) rpcRequest {
	return rpcRequest{JSONRPC: "2.0", ID: id, Method: method, Params: params}
}

// rpcPost posts v (a request or a batch) and decodes the answer into out.
func rpcPost(t testing.TB, url string, v, out any) {
	t.Helper()
	body, _ := json.Marshal(v)
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: HTTP %d %s", body, resp.StatusCode, data)
	}
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatalf("POST %s: answer %s: %v", body, data, err)
	}
}

func rpcOne(t testing.TB, url string, r rpcRequest) rpcReply {
	t.Helper()
	var out rpcReply
	rpcPost(t, url, r, &out)
	return out
}

// fullArchive is label balancing full > archive, with a budget large
// enough that only the rules stop a sweep (as in the label-balancing seed).
func fullArchive(c *config.Config) {
	include := true
	c.LabelBalancing = &config.LabelBalancingConfig{Order: []string{"full", "archive"}, IncludeDefault: &include}
	c.Worker.MaxRetries = 5
	c.Worker.MaxRemoteWorkers = 5
}
