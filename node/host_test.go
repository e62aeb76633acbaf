package node

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
)

// TestHost_TCPCarriesWorkmeshProtocols: a node listening on TCP only is
// reached over TCP (TLS or Noise, yamux) and answers health pings there;
// a node listening on QUIC and TCP is reached over either.
func TestHost_TCPCarriesWorkmeshProtocols(t *testing.T) {
	cfgA := testConfig(t)
	cfgA.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}
	a := startTestNode(t, cfgA)
	cfgB := testConfig(t)
	cfgB.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	b := startTestNode(t, cfgB)

	for _, proto := range []int{ma.P_TCP, ma.P_QUIC_V1} {
		var addrs []ma.Multiaddr
		for _, addr := range a.Host().Addrs() {
			if _, err := addr.ValueForProtocol(proto); err == nil {
				addrs = append(addrs, addr)
			}
		}
		if len(addrs) == 0 {
			t.Fatalf("node A has no %s address: %v", ma.ProtocolWithCode(proto).Name, a.Host().Addrs())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		// A node has a TCP transport when it listens on TCP or
		// bootstraps through a TCP address.
		cfgC := testConfig(t)
		cfgC.Listen = cfgA.Listen
		c := startTestNode(t, cfgC)
		if err := c.Host().Connect(ctx, peer.AddrInfo{ID: a.ID(), Addrs: addrs}); err != nil {
			cancel()
			t.Fatalf("connect over %s: %v", ma.ProtocolWithCode(proto).Name, err)
		}
		if _, _, err := c.Ping(ctx, a.ID()); err != nil {
			t.Errorf("ping over %s: %v", ma.ProtocolWithCode(proto).Name, err)
		}
		cancel()
	}

	// b listens on TCP alone, and is dialed there.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Host().Connect(ctx, peer.AddrInfo{ID: b.ID(), Addrs: b.Host().Addrs()}); err != nil {
		t.Fatalf("connect to a TCP-only node: %v", err)
	}
	conns := a.Host().Network().ConnsToPeer(b.ID())
	if len(conns) == 0 {
		t.Fatal("no connection to the TCP-only node")
	}
	if _, err := conns[0].RemoteMultiaddr().ValueForProtocol(ma.P_TCP); err != nil {
		t.Errorf("connection to the TCP-only node runs over %s", conns[0].RemoteMultiaddr())
	}
	if _, _, err := a.Ping(ctx, b.ID()); err != nil {
		t.Errorf("ping a TCP-only node: %v", err)
	}
}

// TestHost_Identity: peers learn the node's user agent by identify, and
// the host serves no libp2p ping (the health protocol is workmesh's).
func TestHost_Identity(t *testing.T) {
	a := startTestNode(t, testConfig(t), WithVersion("1.2.3"))
	b := startTestNode(t, testConfig(t))
	connect(t, b, a)
	testkit.WaitFor(t, 10*time.Second, "identify of node A", func() error {
		protos, _ := b.Host().Peerstore().GetProtocols(a.ID())
		if !slices.Contains(protos, HealthProtocol(testNetwork)) {
			return fmt.Errorf("B lists A's protocols as %v", protos)
		}
		return nil
	})
	av, err := b.Host().Peerstore().Get(a.ID(), "AgentVersion")
	if err != nil || av != "workmesh/1.2.3" {
		t.Errorf("agent version %v (%v), want workmesh/1.2.3", av, err)
	}
	protos, _ := b.Host().Peerstore().GetProtocols(a.ID())
	for _, p := range protos {
		if strings.HasPrefix(string(p), "/ipfs/ping/") {
			t.Errorf("node serves libp2p ping %s", p)
		}
	}
}

// TestHost_CloseReleasesEverything: a closed node gives back its UDP and
// TCP ports and stops every goroutine its host started.
func TestHost_CloseReleasesEverything(t *testing.T) {
	// One node first, so that goroutines started once per process (the
	// QUIC and DNS machinery's) are not counted against the hosts.
	startTestNode(t, testConfig(t))
	// Its relay finder and AutoNAT start their goroutines as the host's
	// first events arrive: the count is taken once it holds still.
	before := -1
	testkit.WaitFor(t, 5*time.Second, "the first node's goroutines settle", func() error {
		n := runtime.NumGoroutine()
		if n != before {
			before = n
			return fmt.Errorf("%d goroutines", n)
		}
		return nil
	})
	for range 5 {
		cfg := testConfig(t)
		cfg.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}
		n, err := New(context.Background(), cfg, WithLogger(quietLogger()))
		if err != nil {
			t.Fatal(err)
		}
		addrs := n.Host().Network().ListenAddresses()
		if err := n.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		for _, addr := range addrs {
			network, hostport := "udp", ""
			if port, err := addr.ValueForProtocol(ma.P_TCP); err == nil {
				network, hostport = "tcp", "127.0.0.1:"+port
			} else if port, err := addr.ValueForProtocol(ma.P_UDP); err == nil {
				hostport = "127.0.0.1:" + port
			}
			if network == "udp" {
				pc, err := net.ListenPacket("udp", hostport)
				if err != nil {
					t.Fatalf("UDP port of %s still held after Close: %v", addr, err)
				}
				pc.Close()
				continue
			}
			ln, err := net.Listen("tcp", hostport)
			if err != nil {
				t.Fatalf("TCP port of %s still held after Close: %v", addr, err)
			}
			ln.Close()
		}
	}
	// Goroutines end shortly after Close returns (some wind down on a
	// closed channel or socket): wait for the count to come back.
	if _, err := testkit.Poll(10*time.Second, func() error {
		if n := runtime.NumGoroutine(); n > before {
			return fmt.Errorf("%d goroutines, %d before the hosts started", n, before)
		}
		return nil
	}); err != nil {
		buf := make([]byte, 1<<20)
		t.Fatalf("the closed hosts' goroutines to end: not within 10s: %v; goroutines:\n%s", err, buf[:runtime.Stack(buf, true)])
	}
}

// TestHost_AnnounceAndNoAnnounce: announce replaces the direct addresses
// (relay addresses kept) and no-announce leaves out what it names, by
// prefix or by network.
func TestHost_AnnounceAndNoAnnounce(t *testing.T) {
	in := []ma.Multiaddr{
		ma.StringCast("/ip4/192.0.2.5/udp/4001/quic-v1"),
		ma.StringCast("/ip4/192.0.2.5/tcp/4001"),
		ma.StringCast("/ip4/10.1.2.3/tcp/4001"),
		ma.StringCast("/ip4/198.51.100.1/udp/4001/quic-v1/p2p/12D3KooWRRJCf9NM31sVK25xV7p8JnyXmbciDBx3PyWtvRXL1JeA/p2p-circuit"),
	}
	strs := func(as []ma.Multiaddr) string {
		var out []string
		for _, a := range as {
			out = append(out, a.String())
		}
		return strings.Join(out, " ")
	}
	for _, c := range []struct {
		name             string
		announce, remove []string
		want             string
	}{
		{"none", nil, nil, ""},
		{"no-announce by IP prefix and by network", nil, []string{"/ip4/192.0.2.5", "/ip4/10.0.0.0/ipcidr/8"},
			"/ip4/198.51.100.1/udp/4001/quic-v1/p2p/12D3KooWRRJCf9NM31sVK25xV7p8JnyXmbciDBx3PyWtvRXL1JeA/p2p-circuit"},
		{"announce keeps relay addresses", []string{"/ip4/203.0.113.9/udp/4001/quic-v1"}, nil,
			"/ip4/203.0.113.9/udp/4001/quic-v1 /ip4/198.51.100.1/udp/4001/quic-v1/p2p/12D3KooWRRJCf9NM31sVK25xV7p8JnyXmbciDBx3PyWtvRXL1JeA/p2p-circuit"},
		{"a prefix names whole components only", nil, []string{"/ip4/192.0.2.5/tcp/40"},
			"/ip4/192.0.2.5/udp/4001/quic-v1 /ip4/192.0.2.5/tcp/4001 /ip4/10.1.2.3/tcp/4001 /ip4/198.51.100.1/udp/4001/quic-v1/p2p/12D3KooWRRJCf9NM31sVK25xV7p8JnyXmbciDBx3PyWtvRXL1JeA/p2p-circuit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config.Defaults().Node
			cfg.Announce, cfg.NoAnnounce = c.announce, c.remove
			s, err := natSettingsOf(cfg)
			if err != nil {
				t.Fatal(err)
			}
			f := s.addrsFactory()
			if f == nil {
				if c.want != "" {
					t.Fatal("no address factory")
				}
				return
			}
			if got := strs(f(slices.Clone(in))); got != c.want {
				t.Errorf("advertised %q, want %q", got, c.want)
			}
		})
	}
	cfg := config.Defaults().Node
	cfg.NoAnnounce = []string{"/ip4/nonsense"}
	if _, err := natSettingsOf(cfg); err == nil || !strings.Contains(err.Error(), "no-announce entry 1") {
		t.Errorf("a bad no-announce entry: %v", err)
	}
}

// TestHost_GaterKeepsPublicHostsOffPrivateAddrs: a host with no private
// address of its own dials no private address (and counts what it left
// out); loopback, public and relay addresses it dials; a host on a private
// network dials private addresses too.
func TestHost_GaterKeepsPublicHostsOffPrivateAddrs(t *testing.T) {
	var skipped atomic.Uint64
	public := &addrGater{skipped: &skipped}
	onLAN := &addrGater{onPrivateNet: true, skipped: &skipped}
	for _, c := range []struct {
		addr          string
		public, onLAN bool
	}{
		{"/ip4/192.168.1.7/udp/4001/quic-v1", false, true},
		{"/ip4/10.0.0.1/tcp/4001", false, true},
		{"/ip4/127.0.0.1/tcp/4001", true, true},
		{"/ip4/8.8.8.8/tcp/4001", true, true},
		{"/ip4/8.8.8.8/udp/4001/quic-v1/p2p/12D3KooWRRJCf9NM31sVK25xV7p8JnyXmbciDBx3PyWtvRXL1JeA/p2p-circuit", true, true},
	} {
		a := ma.StringCast(c.addr)
		if got := public.InterceptAddrDial("", a); got != c.public {
			t.Errorf("public host dials %s: %v, want %v", c.addr, got, c.public)
		}
		if got := onLAN.InterceptAddrDial("", a); got != c.onLAN {
			t.Errorf("host on a LAN dials %s: %v, want %v", c.addr, got, c.onLAN)
		}
	}
	if got := skipped.Load(); got != 2 {
		t.Errorf("dials skipped: %d, want 2", got)
	}
}

// TestHost_ReachabilityAndConnection: a node told its reachability reports
// it; two nodes on loopback are none to each other, then direct.
func TestHost_ReachabilityAndConnection(t *testing.T) {
	cfgA := testConfig(t)
	cfgA.Reachability = config.ReachabilityPublic
	a := startTestNode(t, cfgA)
	cfgB := testConfig(t)
	cfgB.Reachability = config.ReachabilityPrivate
	b := startTestNode(t, cfgB)
	for n, want := range map[*Node]string{a: "public", b: "private"} {
		testkit.WaitFor(t, 5*time.Second, "reachability "+want, func() error {
			if got := n.Reachability(); got != want {
				return fmt.Errorf("reachability %s", got)
			}
			return nil
		})
	}
	if got := a.Connection(b.ID()); got != ConnNone {
		t.Errorf("before a dial: %s, want none", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.Host().Connect(ctx, peer.AddrInfo{ID: a.ID(), Addrs: a.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	if got := a.Connection(b.ID()); got != ConnDirect {
		t.Errorf("after a dial: %s, want direct", got)
	}
	if ctx, err := a.OverRelay(ctx, b.ID(), 1<<20); err != nil || ctx == nil {
		t.Errorf("work over a direct connection is never refused: %v", err)
	}
}
