package access

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/workertest"
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
	a, err := New(accessConfig(edit))
	workertest.Must(t, err)
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
			_, err := New(accessConfig(tt.edit))
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("NewAccess = %v, want an error starting %q", err, tt.want)
			}
		})
	}
	// Unlimited rates need no burst.
	for _, r := range []float64{0, math.Inf(1)} {
		if _, err := New(accessConfig(func(c *config.AccessConfig) { c.PeerRate, c.PeerBurst = r, 0 })); err != nil {
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
	workertest.Must(t, err)
	return id
}

// fakeNow is a clock the test moves.
type fakeNow struct{ t time.Time }

func (f *fakeNow) now() time.Time          { return f.t }
func (f *fakeNow) advance(d time.Duration) { f.t = f.t.Add(d) }

// acquireOK returns Success when a admits a request of p, else the
// outcome p is answered with.
func acquireOK(a *Access, p peer.ID) workers.Outcome {
	if res, ok := a.Acquire(p); !ok {
		return res.Outcome
	}
	return workers.Success
}

func TestAccess_TokenBucketRefillsAndStreamsSpendNoTokens(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1000, 0)}
	a := newAccess(t, func(c *config.AccessConfig) { c.PeerRate, c.PeerBurst, c.PeerMaxStreams = 1, 1, 1 })
	a.now = clock.now
	p := mustDecode(t, testPeerID)

	if o := acquireOK(a, p); o != workers.Success {
		t.Fatalf("first request: %v", o)
	}
	clock.advance(time.Second) // a token is back, but the one stream is taken
	if o := acquireOK(a, p); o != workers.Busy {
		t.Fatalf("second stream: %v, want Busy", o)
	}
	a.Release(p)
	// The refused stream spent no token: this one gets it.
	if o := acquireOK(a, p); o != workers.Success {
		t.Fatalf("after release: %v, want Success (a refused stream must not spend a token)", o)
	}
	a.Release(p)
	// Sequential requests cannot reset the bucket by letting the peer's
	// state be forgotten between them.
	if o := acquireOK(a, p); o != workers.Busy {
		t.Fatalf("at once after the bucket was emptied: %v, want Busy", o)
	}
	clock.advance(time.Second)
	if o := acquireOK(a, p); o != workers.Success {
		t.Fatalf("a second later: %v, want Success", o)
	}
	a.Release(p)
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
		if o := acquireOK(a, id); o != workers.Success {
			t.Fatalf("first request of %s: %v", id, o)
		}
		a.Release(id)
	}
	clock.advance(time.Second) // every bucket is full again
	for _, id := range ids[2*minSweep:] {
		acquireOK(a, id)
		a.Release(id)
	}
	if n := len(a.peers); n > 2*minSweep {
		t.Errorf("access holds %d peers, want the idle, refilled ones forgotten", n)
	}
	// Without a rate limit, a peer is forgotten when its last stream ends.
	b := newAccess(t, nil)
	b.Acquire(ids[0])
	b.Release(ids[0])
	if len(b.peers) != 0 {
		t.Errorf("no rate limit: %d peers held after their streams ended", len(b.peers))
	}
}
