package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
	"github.com/workmesh/workmesh/workers/jsonrpc"
)

// rpcMesh starts a gateway serving jsonrpc from its own upstream ("local",
// so a local fallback is counted) and two full and two archive members,
// each with its own upstream, and returns the gateway's /v1/rpc URL.
func rpcMesh(t *testing.T, gwCfg func(*config.Config), full, archive func(*chainUpstream)) (string, *member, *hitCounter) {
	t.Helper()
	hits := newHitCounter()
	local := newChainUpstream(t, "local", hits, nil)
	gw := startMember(t, hits, jsonrpcSpec(t, "gateway", nil, local, gwCfg), nil)
	for _, m := range []struct {
		name, label string
		setup       func(*chainUpstream)
	}{{"full1", "full", full}, {"full2", "full", full}, {"archive1", "archive", archive}, {"archive2", "archive", archive}} {
		u := newChainUpstream(t, m.name, hits, m.setup)
		startMember(t, hits, jsonrpcSpec(t, m.name, []string{m.label}, u, nil), gw)
	}
	waitRanked(t, gw, jsonrpc.Type, 4)
	return rpcEndpointOf(t, gw), gw, hits
}

// A client polls the block after the tip: every upstream answers null.
// The block is above every advertised head, so the null is the answer:
// one upstream hit per request, no sweep of the full group, no escape to
// the archive group or the local upstream.
func TestJSONRPC_NullBeyondHeadOneUpstreamHit(t *testing.T) {
	url, _, hits := rpcMesh(t, withHedge(time.Millisecond, fullArchive), nil, nil)
	const requests = 20
	for i := range requests {
		before := hits.total()
		r := rpcOne(t, url, req(i, "eth_getBlockByNumber", "0x65", false)) // head 100 + 1
		if r.Error != nil || string(r.Result) != "null" {
			t.Fatalf("request %d: %s; want result null (block 101 is above every head)", i, r)
		}
		if n := hits.total() - before; n > 1 {
			t.Fatalf("request %d: %d upstream hits, want at most 1", i, n)
		}
	}
	if n := hits.get("archive1") + hits.get("archive2"); n != 0 {
		t.Fatalf("archive group hit %d times for blocks above every head, want 0", n)
	}
	if n := hits.get("local"); n != 0 {
		t.Fatalf("local upstream hit %d times for blocks above every head, want 0", n)
	}
	if n := hits.get("full1") + hits.get("full2"); n != requests {
		t.Fatalf("full nodes hit %d times for %d requests, want exactly one each", n, requests)
	}
	// At the head the block is there, served by the full group.
	if r := rpcOne(t, url, req(99, "eth_getBlockByNumber", "0x64", false)); !strings.HasPrefix(r.servedBy(), "full") {
		t.Fatalf("block 100: %s; want it from a full node", r)
	}
}

// The full nodes answer null for a block at the head (they lack it); the
// null is a miss there, so the request goes on to the archive group.
func TestJSONRPC_NullAtHeadEscapesToArchive(t *testing.T) {
	url, _, hits := rpcMesh(t, fullArchive, func(u *chainUpstream) { u.nullBlocks = true }, nil)
	r := rpcOne(t, url, req(1, "eth_getBlockByNumber", "0x64", false))
	if r.Error != nil || !strings.HasPrefix(r.servedBy(), "archive") {
		t.Fatalf("block 100 with the full nodes lacking it: %s; want it from an archive node", r)
	}
	if hits.get("full1") != 1 || hits.get("full2") != 1 {
		t.Fatalf("full hits %d and %d, want one each before escaping", hits.get("full1"), hits.get("full2"))
	}
	if n := hits.get("archive1") + hits.get("archive2"); n != 1 {
		t.Fatalf("archive hits %d, want 1", n)
	}
	if hits.get("local") != 0 {
		t.Fatal("the local upstream was asked although an archive node had the block")
	}
}

// Full nodes first; the archive group only for what the full nodes cannot
// serve (state they pruned), as in the label-balancing seed. A batch gets
// each of its requests routed on its own, answered in order.
func TestJSONRPC_FullFirstArchiveWhenFullCannotServe(t *testing.T) {
	pruned := func(u *chainUpstream) { u.stateFrom = 90 }
	url, _, hits := rpcMesh(t, fullArchive, pruned, nil)
	const addr = "0x00000000000000000000000000000000000000aa"
	for i := range 10 {
		r := rpcOne(t, url, req(i, "eth_getBalance", addr, "latest"))
		if r.Error != nil || !strings.HasPrefix(r.servedBy(), "full") {
			t.Fatalf("request %d, latest state: %s; want a full node", i, r)
		}
	}
	if n := hits.get("archive1") + hits.get("archive2"); n != 0 {
		t.Fatalf("archive group hit %d times while the full nodes served everything", n)
	}
	r := rpcOne(t, url, req(10, "eth_getBalance", addr, "0x10"))
	if r.Error != nil || !strings.HasPrefix(r.servedBy(), "archive") {
		t.Fatalf("state at block 16, pruned on full nodes: %s; want an archive node", r)
	}
	if n := hits.get("archive1") + hits.get("archive2"); n != 1 {
		t.Fatalf("archive hits %d for one old-state request, want 1", n)
	}

	hits.reset()
	var batch []rpcReply
	rpcPost(t, url, []rpcRequest{
		req(1, "eth_getBalance", addr, "latest"),
		req(2, "eth_getBalance", addr, "0x10"),
		req(3, "eth_getBlockByNumber", "0x65", false),
		req(4, "eth_noSuchMethod"),
	}, &batch)
	if len(batch) != 4 {
		t.Fatalf("batch of 4 answered with %d", len(batch))
	}
	for i, r := range batch {
		if string(r.ID) != string(rune('1'+i)) {
			t.Fatalf("batch answer %d has id %s, want the requests' order", i, r.ID)
		}
	}
	if !strings.HasPrefix(batch[0].servedBy(), "full") || !strings.HasPrefix(batch[1].servedBy(), "archive") ||
		string(batch[2].Result) != "null" || batch[3].Error == nil || batch[3].Error.Code != -32601 {
		t.Fatalf("batch answers: %v; want full, archive, null, method not found", batch)
	}
}

// A grey upstream fails every second request. Its node stays up (it
// answers health pings) so liveness keeps it, but the failures cost it its
// rating: although it is the faster one, after a few requests it gets no
// more work, and the client never sees its failures (each is retried on
// the good node).
func TestJSONRPC_GreyUpstreamStopsGettingWork(t *testing.T) {
	hits := newHitCounter()
	gwCfg := func(c *config.Config) {
		c.Worker.MaxRemoteWorkers = 2
		c.Worker.MaxRetries = 1
	}
	gw := startMember(t, hits, memberSpec{name: "gateway", cfg: gwCfg}, nil)
	// The grey upstream is the faster one: on latency alone it would get
	// all the work, so only its failures can take it away.
	good := newChainUpstream(t, "good", hits, func(u *chainUpstream) { u.delay = 8 * time.Millisecond })
	grey := newChainUpstream(t, "grey", hits, func(u *chainUpstream) { u.delay = 4 * time.Millisecond; u.failEvery = 2 })
	startMember(t, hits, jsonrpcSpec(t, "good", nil, good, nil), gw)
	startMember(t, hits, jsonrpcSpec(t, "grey", nil, grey, nil), gw)
	waitRanked(t, gw, jsonrpc.Type, 2)
	url := rpcEndpointOf(t, gw)
	sel := gw.disp.Selector()

	const warmup, measured = 10, 30
	for i := range warmup + measured {
		if i == warmup {
			hits.reset()
		}
		r := rpcOne(t, url, req(i, "eth_getBalance", "0xaa", "latest"))
		if r.Error != nil {
			t.Fatalf("request %d: %s; the grey node's failures must be retried, not returned", i, r)
		}
		sel.Refresh() // the dispatcher refreshes the ranking on a tick; do it now
	}
	if n := hits.get("grey"); n > 1 {
		t.Fatalf("the grey upstream still got %d of the last %d requests, want at most 1", n, measured)
	}
	if n := hits.get("good"); n < measured {
		t.Fatalf("the good upstream served %d of the last %d requests", n, measured)
	}
	t.Logf("grey upstream: %d hits in total, %d after the first %d requests", grey.relayed.Load(), hits.get("grey"), warmup)
}

// An upstream whose head polls fail takes the jsonrpc type out of its
// node's record, not the node: health is per work type. The node answers
// its health pings, so the gateway's liveness (which would eject a node
// after three failed pings) keeps it alive, and it goes on serving its
// other type; no RPC request reaches its upstream while the type is out,
// and the type is advertised again once the upstream answers.
func TestJSONRPC_DownUpstreamWithdrawsOnlyItsType(t *testing.T) {
	hits := newHitCounter()
	const poll, threshold = 100 * time.Millisecond, 3
	gwCfg := ejectingGateway(poll, threshold, func(c *config.Config) { c.Worker.MaxRetries = 1 })
	gw := startMember(t, hits, memberSpec{name: "gateway", cfg: gwCfg}, nil)
	good := newChainUpstream(t, "good", hits, nil)
	down := newChainUpstream(t, "down", hits, nil)
	startMember(t, hits, jsonrpcSpec(t, "good", nil, good, nil), gw)
	spec := jsonrpcSpec(t, "down", nil, down, nil)
	spec.handlers["echo"] = workers.HandlerFunc(func(_ context.Context, p []byte) workers.Result { return workers.OK(p) })
	downNode := startMember(t, hits, spec, gw)
	waitRanked(t, gw, jsonrpc.Type, 2)
	live := gw.disp.Selector().Liveness()
	id := downNode.node.ID()
	advertises := func(workType string, want bool) func() error {
		return func() error {
			rec, ok := gw.node.Peers().Get(id)
			if !ok {
				return errors.New("not in the gateway's peer table")
			}
			if rec.Data.Serves(workType) != want {
				return fmt.Errorf("its record serves %s: %v (%+v)", workType, !want, rec.Data.WorkTypes)
			}
			return nil
		}
	}

	down.downPolls.Store(true)
	took := testkit.WaitFor(t, 60*poll, "the node withdraws jsonrpc after its upstream went down", advertises(jsonrpc.Type, false), gw.node.Peers().Changed)
	t.Logf("jsonrpc withdrawn %s after the upstream went down", took.Round(time.Millisecond))
	if err := advertises("echo", true)(); err != nil {
		t.Fatalf("the node's other type: %v", err)
	}

	url := rpcEndpointOf(t, gw)
	hits.reset()
	const n = 30
	for i := range n {
		if r := rpcOne(t, url, req(i, "eth_getBalance", "0xaa", "latest")); r.Error != nil {
			t.Fatalf("request %d: %s", i, r)
		}
		if i%10 == 0 {
			res := gw.submit(t, dispatch.WorkRequest{ID: fmt.Sprintf("echo-%d", i), Type: "echo", Payload: []byte("still here")})
			if res.Status != apiv1.StatusOK || res.Worker != id.String() || string(res.Output) != "still here" {
				t.Fatalf("echo on the node whose jsonrpc is out: %+v", res)
			}
		}
	}
	if got := hits.get("down"); got != 0 {
		t.Fatalf("the down upstream got %d of %d requests while its type was out", got, n)
	}
	if got := hits.get("good"); got != n {
		t.Fatalf("the good upstream served %d of %d", got, n)
	}
	// Long past three poll periods: liveness still has the node.
	if st := live.State(string(id)); st != selection.StateAlive {
		t.Fatalf("the node is %s: a type that is out took the whole node out", st)
	}

	down.downPolls.Store(false)
	testkit.WaitFor(t, 60*poll, "jsonrpc advertised again once the upstream answers", advertises(jsonrpc.Type, true), gw.node.Peers().Changed)
}

// With hedging on, a read stuck on a slow worker is sent to a second one
// after hedge-delay and the quicker answer wins; a transaction is never
// sent twice, however slow its worker.
func TestJSONRPC_ReadsHedgedWritesNot(t *testing.T) {
	hits := newHitCounter()
	const slowness, hedgeDelay = 400 * time.Millisecond, 20 * time.Millisecond
	gwCfg := func(c *config.Config) {
		include := false
		// The slow worker's group comes first, so it is always the first pick.
		c.LabelBalancing = &config.LabelBalancingConfig{Order: []string{"slow", "fast"}, IncludeDefault: &include}
		c.Hedge.MaxCount, c.Hedge.Delay = 1, hedgeDelay
		c.Worker.MaxRemoteWorkers = 2
	}
	gw := startMember(t, hits, memberSpec{name: "gateway", cfg: gwCfg}, nil)
	slow := newChainUpstream(t, "slow", hits, func(u *chainUpstream) { u.delay = slowness })
	fast := newChainUpstream(t, "fast", hits, nil)
	startMember(t, hits, jsonrpcSpec(t, "slow", []string{"slow"}, slow, nil), gw)
	startMember(t, hits, jsonrpcSpec(t, "fast", []string{"fast"}, fast, nil), gw)
	waitRanked(t, gw, jsonrpc.Type, 2)
	url := rpcEndpointOf(t, gw)

	for i := range 3 {
		hits.reset()
		start := time.Now()
		r := rpcOne(t, url, req(i, "eth_getBalance", "0xaa", "latest"))
		took := time.Since(start)
		if r.Error != nil || string(r.Result) != `"fast"` {
			t.Fatalf("read %d: %s; want the hedge's answer from fast", i, r)
		}
		if took >= slowness {
			t.Fatalf("read %d took %s: the hedge did not win against the %s worker", i, took, slowness)
		}
		if s, f := hits.get("slow"), hits.get("fast"); s != 1 || f != 1 {
			t.Fatalf("read %d: upstream hits slow %d, fast %d; want one each (first pick and hedge)", i, s, f)
		}
	}
	hits.reset()
	r := rpcOne(t, url, req(9, "eth_sendRawTransaction", "0x00"))
	if r.Error != nil || string(r.Result) != `"slow"` {
		t.Fatalf("transaction: %s; want it sent once, to the first pick", r)
	}
	if s, f := hits.get("slow"), hits.get("fast"); s != 1 || f != 0 {
		t.Fatalf("transaction: upstream hits slow %d, fast %d; want it sent to slow only", s, f)
	}
}

// A node whose upstream serves another chain refuses to start its jsonrpc
// work type, so it never advertises or serves it.
func TestJSONRPC_ChainIDMismatchRefusedAtStart(t *testing.T) {
	hits := newHitCounter()
	u := newChainUpstream(t, "other-chain", hits, func(u *chainUpstream) { u.chainID = 5 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, want := range []string{"1337", "0x539"} {
		_, err := jsonrpc.New(ctx, config.JSONRPCConfig{Upstream: u.srv.URL, ChainID: want, HeadInterval: time.Second}, testLogger())
		if !errors.Is(err, jsonrpc.ErrChainIDMismatch) {
			t.Fatalf("chain ID %s against an upstream on 5: %v; want ErrChainIDMismatch", want, err)
		}
	}
	if n := u.polls.Load(); n != 2 || hits.total() != 0 {
		t.Fatalf("upstream saw %d polls and %d relayed requests; want only the two chain ID checks", n, hits.total())
	}
	j, err := jsonrpc.New(ctx, config.JSONRPCConfig{Upstream: u.srv.URL, ChainID: "5", HeadInterval: time.Second}, testLogger())
	if err != nil {
		t.Fatalf("matching chain ID refused: %v", err)
	}
	j.Close()
}
