package node

import (
	"errors"
	"testing"

	"github.com/libp2p/go-libp2p/core/network"
	ma "github.com/multiformats/go-multiaddr"
)

// TestConnLimitsPerIPBindInboundOnly: the connections the node dials to
// one IP (a relay's, all its relayed connections included) keep no limit
// per IP; those it accepts from one IP keep go-libp2p's: a burst of 16 new
// ones, 8 open at once.
func TestConnLimitsPerIPBindInboundOnly(t *testing.T) {
	rm, err := newResourceManager(testNetwork)
	if err != nil {
		t.Fatal(err)
	}
	defer rm.Close()
	relay := "/ip4/198.51.100.7/udp/4001/quic-v1/p2p/" + newPeerKey(t).id.String() + "/p2p-circuit"
	var open []network.ConnManagementScope
	defer func() {
		for _, s := range open {
			s.Done()
		}
	}()
	for i := range 40 {
		for _, a := range []string{"/ip4/198.51.100.7/udp/4001/quic-v1", relay} {
			s, err := rm.OpenConnection(network.DirOutbound, false, ma.StringCast(a))
			if err != nil {
				t.Fatalf("dial %d to %s: %v", i+1, a, err)
			}
			open = append(open, s)
		}
	}
	from := ma.StringCast("/ip4/198.51.100.8/udp/4001/quic-v1")
	var in []network.ConnManagementScope
	for i := range 9 {
		s, err := rm.OpenConnection(network.DirInbound, false, from)
		if i < 8 && err != nil {
			t.Fatalf("inbound connection %d from one IP: %v", i+1, err)
		}
		if i == 8 {
			if err == nil {
				t.Fatal("a ninth inbound connection open at once from one IP accepted")
			}
			break
		}
		in = append(in, s)
	}
	for _, s := range in {
		s.Done()
	}
	burst := ma.StringCast("/ip4/198.51.100.9/udp/4001/quic-v1")
	for i := range 17 {
		s, err := rm.OpenConnection(network.DirInbound, false, burst)
		if i < 16 {
			if err != nil {
				t.Fatalf("inbound connection %d of a burst from one IP: %v", i+1, err)
			}
			s.Done()
			continue
		}
		if !errors.Is(err, errInboundRate) {
			t.Fatalf("a 17th new inbound connection at once from one IP: %v, want %v", err, errInboundRate)
		}
	}
}
