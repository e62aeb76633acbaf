package workers

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/config"
)

// accessConfig returns the default access settings changed by edit.
func accessConfig(edit func(*config.AccessConfig)) config.AccessConfig {
	c := config.Defaults().Access
	if edit != nil {
		edit(&c)
	}
	return c
}

func newAccess(t testing.TB, edit func(*config.AccessConfig)) *Access {
	t.Helper()
	a, err := NewAccess(accessConfig(edit))
	must(t, err)
	return a
}

// testPeerID is a syntactically valid peer ID no host uses.
const testPeerID = "12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"

func TestNewAccess_RefusesBadSettings(t *testing.T) {
	tests := []struct {
		name string
		edit func(*config.AccessConfig)
		want string
	}{
		{"bad peer ID named", func(c *config.AccessConfig) {
			c.AcceptWorkFrom, c.AllowPeers = config.AcceptAllowlist, []string{testPeerID, "QmNotAPeer"}
		}, `access: allow-peer entry 2 "QmNotAPeer": not a peer ID`},
		{"allowlist without peers", func(c *config.AccessConfig) { c.AcceptWorkFrom = config.AcceptAllowlist },
			"access: accept-work-from allowlist with no allow-peer entry"},
		{"allow-peer under any", func(c *config.AccessConfig) { c.AllowPeers = []string{testPeerID} },
			"access: allow-peer is set (1 entries) but accept-work-from is any"},
		{"unknown mode", func(c *config.AccessConfig) { c.AcceptWorkFrom = "friends" },
			`access: accept-work-from "friends": want any or allowlist`},
		{"no streams", func(c *config.AccessConfig) { c.PeerMaxStreams = 0 }, "access: peer-max-streams 0: want at least 1"},
		{"negative rate", func(c *config.AccessConfig) { c.PeerRate = -1 }, "access: peer-rate -1: want 0 (no limit) or more"},
		{"NaN rate", func(c *config.AccessConfig) { c.PeerRate = math.NaN() }, "access: peer-rate NaN"},
		{"rate without burst", func(c *config.AccessConfig) { c.PeerRate, c.PeerBurst = 5, 0 },
			"access: peer-burst 0: want at least 1 with peer-rate 5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewAccess(accessConfig(tt.edit))
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("NewAccess = %v, want an error starting %q", err, tt.want)
			}
		})
	}
	// Unlimited rates need no burst.
	for _, r := range []float64{0, math.Inf(1)} {
		if _, err := NewAccess(accessConfig(func(c *config.AccessConfig) { c.PeerRate, c.PeerBurst = r, 0 })); err != nil {
			t.Errorf("peer-rate %g without burst: %v", r, err)
		}
	}
	a := newAccess(t, func(c *config.AccessConfig) {
		c.AcceptWorkFrom, c.AllowPeers = config.AcceptAllowlist, []string{" " + testPeerID + " "}
	})
	if !a.Allowed(mustDecode(t, testPeerID)) {
		t.Error("an allow-peer entry with spaces around it was not allowed")
	}
}

func mustDecode(t testing.TB, s string) peer.ID {
	t.Helper()
	id, err := peer.Decode(s)
	must(t, err)
	return id
}

// countingHandler counts its runs.
type countingHandler struct{ runs atomic.Int64 }

func (h *countingHandler) Do(_ context.Context, payload []byte) Result {
	h.runs.Add(1)
	return OK(payload)
}

func TestAccess_AllowlistServesListedPeerAndDeniesOthers(t *testing.T) {
	counter := &countingHandler{}
	// The pair's own client is a stranger; only allowedHost is listed.
	allowedHost := newHost(t)
	access := newAccess(t, func(c *config.AccessConfig) {
		c.AcceptWorkFrom, c.AllowPeers = config.AcceptAllowlist, []string{allowedHost.ID().String()}
	})
	p := newPair(t, map[string]Handler{"count": counter}, WithAccess(access))
	connect(t, allowedHost, p.serverHost)
	allowed, err := NewClient(allowedHost, testNetwork)
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()

	resp, err := allowed.Do(ctx, p.serverHost.ID(), Request{ID: "ok", Type: "count", Payload: []byte("x")})
	must(t, err)
	if resp.Outcome != Success || counter.runs.Load() != 1 {
		t.Fatalf("allowlisted peer: %v %q, %d runs", resp.Outcome, resp.Error, counter.runs.Load())
	}

	resp, err = p.do(t, ctx, Request{ID: "no", Type: "count", Payload: []byte("x")})
	must(t, err)
	if resp.Outcome != Denied || resp.Error != NotAllowedError || resp.ID != "no" {
		t.Errorf("other peer: %v %q (id %q), want Denied %q", resp.Outcome, resp.Error, resp.ID, NotAllowedError)
	}
	if n := counter.runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1: it ran for the denied peer", n)
	}
	for range 2 {
		recv(t, p.served, "the server to finish a stream")
	}
	if st := access.Stats(); st != (AccessStats{Denied: 1}) {
		t.Errorf("access stats = %+v, want 1 denied", st)
	}
	if st := p.server.Stats(); st.ByOutcome[Denied] != 1 || st.ByOutcome[Success] != 1 {
		t.Errorf("server counts = %+v", st.ByOutcome)
	}
	access.mu.Lock()
	defer access.mu.Unlock()
	if len(access.peers) != 0 {
		t.Errorf("access holds state for %d peers after every stream ended", len(access.peers))
	}
}

func TestAccess_PeerStreamLimitIsBusyAtOnce(t *testing.T) {
	g := newGate(true)
	defer g.open()
	access := newAccess(t, func(c *config.AccessConfig) { c.PeerMaxStreams = 2 })
	p := newPair(t, map[string]Handler{"gate": g}, WithAccess(access))
	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()

	held := make([]chan Result, 2)
	for i := range held {
		held[i] = make(chan Result, 1)
		go func() {
			r, err := p.client.Do(ctx, p.serverHost.ID(), Request{Type: "gate", Payload: []byte(fmt.Sprint(i))})
			if err != nil {
				r.Result = Fail(RetryableError, "%v", err)
			}
			held[i] <- r.Result
		}()
		recv(t, g.started, "a gate request to start")
	}

	// The limit is held: the next request is answered busy, not queued
	// (a queued one would wait for the gate and hit this short deadline).
	short, cancelShort := context.WithTimeout(ctx, failAfter/2)
	defer cancelShort()
	resp, err := p.do(t, short, Request{ID: "third", Type: "gate"})
	must(t, err)
	if resp.Outcome != Busy || !strings.Contains(resp.Error, "2 work streams open, at most 2 per peer") {
		t.Fatalf("over the stream limit: %v %q, want Busy", resp.Outcome, resp.Error)
	}
	if n := g.runs.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want 2", n)
	}

	// Another peer has limits of its own.
	other := newHost(t)
	connect(t, other, p.serverHost)
	otherClient, err := NewClient(other, testNetwork)
	must(t, err)
	resp, err = otherClient.Do(ctx, p.serverHost.ID(), Request{Type: "echo", Payload: []byte("mine")})
	must(t, err)
	if resp.Outcome != Success {
		t.Errorf("another peer while the first is at its limit: %v %q", resp.Outcome, resp.Error)
	}

	g.open()
	for _, ch := range held {
		if r := recv(t, ch, "a held request to finish"); r.Outcome != Success {
			t.Errorf("held request: %v %q", r.Outcome, r.Error)
		}
	}
	// The streams are given back once the server is done with them.
	for range 4 { // two held, the busy one, the other peer's
		recv(t, p.served, "the server to finish a stream")
	}
	resp, err = p.do(t, ctx, Request{Type: "echo", Payload: []byte("again")})
	must(t, err)
	if resp.Outcome != Success {
		t.Errorf("after the held streams ended: %v %q", resp.Outcome, resp.Error)
	}
	if st := access.Stats(); st != (AccessStats{OverStreams: 1}) {
		t.Errorf("access stats = %+v, want 1 over-streams", st)
	}
}

func TestAccess_PeerRateLimitIsBusy(t *testing.T) {
	// A bucket of 2 that refills once in 1000s: the third request in a
	// row is over the rate.
	access := newAccess(t, func(c *config.AccessConfig) { c.PeerRate, c.PeerBurst = 0.001, 2 })
	p := newPair(t, nil, WithAccess(access))
	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()
	for i := range 3 {
		resp, err := p.do(t, ctx, Request{Type: "echo", Payload: []byte("x")})
		must(t, err)
		want := Success
		if i == 2 {
			want = Busy
		}
		if resp.Outcome != want {
			t.Fatalf("request %d: %v %q, want %v", i+1, resp.Outcome, resp.Error, want)
		}
		if i == 2 && !strings.Contains(resp.Error, "more than 0.001 requests per second (burst 2)") {
			t.Errorf("busy message %q does not say which limit", resp.Error)
		}
	}
	if st := access.Stats(); st != (AccessStats{OverRate: 1}) {
		t.Errorf("access stats = %+v, want 1 over-rate", st)
	}
}

// fakeNow is a clock the test moves.
type fakeNow struct{ t time.Time }

func (f *fakeNow) now() time.Time          { return f.t }
func (f *fakeNow) advance(d time.Duration) { f.t = f.t.Add(d) }

// acquireOK returns Success when a admits a request of p, else the
// outcome p is answered with.
func acquireOK(a *Access, p peer.ID) Outcome {
	if res, ok := a.acquire(p); !ok {
		return res.Outcome
	}
	return Success
}

func TestAccess_TokenBucketRefillsAndStreamsSpendNoTokens(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1000, 0)}
	a := newAccess(t, func(c *config.AccessConfig) { c.PeerRate, c.PeerBurst, c.PeerMaxStreams = 1, 1, 1 })
	a.now = clock.now
	p := mustDecode(t, testPeerID)

	if o := acquireOK(a, p); o != Success {
		t.Fatalf("first request: %v", o)
	}
	clock.advance(time.Second) // a token is back, but the one stream is taken
	if o := acquireOK(a, p); o != Busy {
		t.Fatalf("second stream: %v, want Busy", o)
	}
	a.release(p)
	// The refused stream spent no token: this one gets it.
	if o := acquireOK(a, p); o != Success {
		t.Fatalf("after release: %v, want Success (a refused stream must not spend a token)", o)
	}
	a.release(p)
	// Sequential requests cannot reset the bucket by letting the peer's
	// state be forgotten between them.
	if o := acquireOK(a, p); o != Busy {
		t.Fatalf("at once after the bucket was emptied: %v, want Busy", o)
	}
	clock.advance(time.Second)
	if o := acquireOK(a, p); o != Success {
		t.Fatalf("a second later: %v, want Success", o)
	}
	a.release(p)
	if st := a.Stats(); st != (AccessStats{OverStreams: 1, OverRate: 1}) {
		t.Errorf("stats = %+v", st)
	}
}

func TestAccess_StateIsBoundedByBusyPeers(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1000, 0)}
	a := newAccess(t, func(c *config.AccessConfig) { c.PeerRate, c.PeerBurst = 10, 1 })
	a.now = clock.now
	ids := make([]peer.ID, 3*minSweep)
	for i := range ids {
		ids[i] = peer.ID(fmt.Sprintf("peer-%d", i)) // only a map key here
	}
	for _, id := range ids[:2*minSweep] {
		if o := acquireOK(a, id); o != Success {
			t.Fatalf("first request of %s: %v", id, o)
		}
		a.release(id)
	}
	clock.advance(time.Second) // every bucket is full again
	for _, id := range ids[2*minSweep:] {
		acquireOK(a, id)
		a.release(id)
	}
	if n := len(a.peers); n > 2*minSweep {
		t.Errorf("access holds %d peers, want the idle, refilled ones forgotten", n)
	}
	// Without a rate limit, a peer is forgotten when its last stream ends.
	b := newAccess(t, nil)
	b.acquire(ids[0])
	b.release(ids[0])
	if len(b.peers) != 0 {
		t.Errorf("no rate limit: %d peers held after their streams ended", len(b.peers))
	}
}
