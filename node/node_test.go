package node

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
)

// testConfig is a node config on loopback with a random port and no API.
func testConfig(t testing.TB) config.NodeConfig {
	cfg := config.Defaults().Node
	cfg.Network = testNetwork
	cfg.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.API = ""
	cfg.DataDir = t.TempDir()
	return cfg
}

func startTestNode(t testing.TB, cfg config.NodeConfig, opts ...Option) *Node {
	t.Helper()
	opts = append([]Option{WithLogger(quietLogger())}, opts...)
	n, err := New(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func connect(t testing.TB, from, to *Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := from.Host().Connect(ctx, peer.AddrInfo{ID: to.ID(), Addrs: to.Host().Addrs()}); err != nil {
		t.Fatalf("connect: %v", err)
	}
}

type stubState struct{}

func (stubState) Capacity() Capacity       { return Capacity{MaxConcurrent: 4, QueueSize: 10} }
func (stubState) Load() Load               { return Load{InFlight: 2, Queued: 1} }
func (stubState) Heads() map[string]uint64 { return map[string]uint64{"blocks": 1234} }

func TestIdentityCreatedOnceAndReused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	k1, err := LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("identity file mode %v, want 0600", st.Mode().Perm())
	}
	k2, err := LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !k1.Equals(k2) {
		t.Error("second start made a new identity")
	}
	if err := os.WriteFile(filepath.Join(dir, IdentityFile), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateIdentity(dir); err == nil {
		t.Error("a corrupt identity file was accepted (or silently replaced)")
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	cases := []struct {
		name string
		edit func(*config.NodeConfig)
		want string
	}{
		{"bootstrap does not parse", func(c *config.NodeConfig) { c.Bootstrap = []string{"/ip4/1.2.3.4/udp/nope"} }, `"/ip4/1.2.3.4/udp/nope"`},
		{"bootstrap without peer ID", func(c *config.NodeConfig) { c.Bootstrap = []string{"/ip4/127.0.0.1/udp/4001/quic-v1"} }, "/p2p/"},
		{"ttl not above announce interval", func(c *config.NodeConfig) { c.RecordTTL = c.AnnounceInterval }, "record-ttl"},
		{"network with a slash", func(c *config.NodeConfig) { c.Network = "a/b" }, "network"},
		{"listen does not parse", func(c *config.NodeConfig) { c.Listen = []string{"udp:4001"} }, `"udp:4001"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			tc.edit(&cfg)
			n, err := New(context.Background(), cfg, WithLogger(quietLogger()))
			if err == nil {
				n.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s", err, tc.want)
			}
		})
	}
}

func TestHealthPing(t *testing.T) {
	a := startTestNode(t, testConfig(t), WithLocalState(stubState{}))
	b := startTestNode(t, testConfig(t))
	connect(t, b, a)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rtt, ans, err := b.Ping(ctx, a.ID())
	if err != nil {
		t.Fatal(err)
	}
	if rtt <= 0 || rtt > 5*time.Second {
		t.Errorf("rtt %s", rtt)
	}
	if want := a.NodeData().Data.Sequence; ans.Sequence != want {
		t.Errorf("sequence %d, want %d", ans.Sequence, want)
	}
	if ans.Load != (Load{InFlight: 2, Queued: 1}) || ans.Heads["blocks"] != 1234 {
		t.Errorf("answer %+v", ans)
	}
}

func TestHealthRefusesOversizedRequest(t *testing.T) {
	a := startTestNode(t, testConfig(t))
	b := startTestNode(t, testConfig(t))
	connect(t, b, a)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := b.Host().NewStream(ctx, a.ID(), HealthProtocol(testNetwork))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Reset()
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], 1<<20)
	if _, err := s.Write(hdr[:]); err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	b2, err := io.ReadAll(s)
	if err == nil {
		t.Fatalf("server answered an oversized request with %q and closed cleanly; want a reset", b2)
	}
}

func TestNodeDataSyncHandsOverTable(t *testing.T) {
	a := startTestNode(t, testConfig(t))
	b := startTestNode(t, testConfig(t))
	// A holds a record of C, a peer B has never been connected to.
	c := newPeerKey(t)
	if _, err := a.Peers().Submit(c.record(t, 1), "", SourceGossip); err != nil {
		t.Fatal(err)
	}
	connect(t, b, a)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.fetchNodeData(ctx, a.ID(), true); err != nil {
		t.Fatal(err)
	}
	// A sends its whole table to B once per record-ttl: B's own sync of
	// its first peers (membership) may have asked first, and may still be
	// taking the answer in when this one, which then carries A's record
	// only, returns.
	testkit.WaitFor(t, 5*time.Second, "B learns A and C from A", func() error {
		for _, id := range []peer.ID{a.ID(), c.id} {
			if _, ok := b.Peers().Get(id); !ok {
				return fmt.Errorf("B did not learn %s from A", id)
			}
		}
		return nil
	})
}

func TestAPI(t *testing.T) {
	cfg := testConfig(t)
	cfg.API = "127.0.0.1:0"
	cfg.WorkTypes = []string{"echo", "sha256"}
	cfg.Labels = []string{"zone-a"}
	extra := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "extra") })
	n := startTestNode(t, cfg, WithAPIHandler("GET /v1/extra", extra))
	base := "http://" + n.APIAddr()

	get := func(path string, v any) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
	}
	var info InfoView
	get("/v1/info", &info)
	if info.PeerID != n.ID().String() || info.Network != testNetwork || len(info.Addrs) == 0 {
		t.Errorf("info %+v", info)
	}
	for _, a := range info.Addrs {
		if !strings.HasSuffix(a, "/p2p/"+n.ID().String()) {
			t.Errorf("addr %s has no /p2p suffix", a)
		}
	}
	if strings.Join(info.WorkTypes, ",") != "echo,sha256" || strings.Join(info.Labels, ",") != "zone-a" {
		t.Errorf("info work types %v labels %v", info.WorkTypes, info.Labels)
	}

	p := newPeerKey(t)
	if _, err := n.Peers().Submit(p.record(t, 9), "", SourceGossip); err != nil {
		t.Fatal(err)
	}
	var peers []PeerView
	get("/v1/peers", &peers)
	if len(peers) != 1 || peers[0].ID != p.id.String() || peers[0].Sequence != 9 || peers[0].Heads["blocks"] != 42 {
		t.Errorf("peers %+v", peers)
	}

	resp, err := http.Get(base + "/v1/extra")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "extra" {
		t.Errorf("mounted handler answered %q", body)
	}
	if err := n.HandleAPI("GET /v1/info", extra); err == nil {
		t.Error("mounting over /v1/info was not refused")
	}
	if err := n.HandleAPI("POST /v1/work", extra); err != nil {
		t.Errorf("mounting a new handler: %v", err)
	}
}

func TestSetWorkTypesResigns(t *testing.T) {
	n := startTestNode(t, testConfig(t))
	before := n.NodeData().Data.Sequence
	if err := n.SetWorkTypes([]string{"new-type"}); err != nil {
		t.Fatal(err)
	}
	after := n.NodeData().Data
	if after.Sequence <= before || !after.Serves("new-type") || after.Serves("echo") {
		t.Errorf("after SetWorkTypes: %+v (sequence before %d)", after, before)
	}
	if err := n.SetWorkTypes([]string{"dup", "dup"}); err == nil {
		t.Error("duplicate work types accepted")
	}
	if !n.NodeData().Data.Serves("new-type") {
		t.Error("a refused change altered the record")
	}
}
