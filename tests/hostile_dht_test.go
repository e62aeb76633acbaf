package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-msgio"
	ma "github.com/multiformats/go-multiaddr"
	"google.golang.org/protobuf/proto"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// hostileDHTPeer is a host that speaks the network's DHT protocol and
// answers every request with the same made-up peers, each at addr: the
// closer peers of a FIND_NODE, GET_VALUE or GET_PROVIDERS answer are the
// answering peer's word, under any peer ID.
type hostileDHTPeer struct {
	id       peer.ID
	answered atomic.Int64
}

func newHostileDHTPeer(t *testing.T, ctx context.Context, netName string, target peer.AddrInfo, addr string, fakes int) *hostileDHTPeer {
	t.Helper()
	key, id := newIdentity(t)
	h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings(loopbackQUIC))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	a := ma.StringCast(addr)
	var closer []*dhtpb.Message_Peer
	for _, f := range fakePeers(t, fakes) {
		closer = append(closer, &dhtpb.Message_Peer{Id: []byte(f.id), Addrs: [][]byte{a.Bytes()}})
	}
	hp := &hostileDHTPeer{id: id}
	h.SetStreamHandler(protocol.ID("/workmesh/"+netName+"/kad/1.0.0"), func(s network.Stream) {
		defer s.Close()
		r := msgio.NewVarintReaderSize(s, network.MessageSizeMax)
		w := msgio.NewVarintWriter(s)
		for {
			b, err := r.ReadMsg()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					s.Reset()
				}
				return
			}
			var req dhtpb.Message
			err = proto.Unmarshal(b, &req)
			r.ReleaseMsg(b)
			if err != nil {
				s.Reset()
				return
			}
			resp := &dhtpb.Message{Type: req.Type, Key: req.Key, CloserPeers: closer}
			out, err := proto.Marshal(resp)
			if err != nil {
				t.Error(err)
				return
			}
			if err := w.WriteMsg(out); err != nil {
				return
			}
			hp.answered.Add(1)
		}
	})
	if err := h.Connect(ctx, target); err != nil {
		t.Fatal(err)
	}
	return hp
}

// TestHostileDHTAnswersDoNotAimDials: a DHT peer answers every query of a
// gateway with 20 made-up peers at an address it chose (a UDP socket of
// the test on 127.0.0.77), and the gateway looks 10 records up in the DHT,
// each lookup asking it. The DHT puts the addresses its answers carry into
// the host's peerstore and dials them; the host's dial guard refuses them
// as it refuses a record's: with no newcomer budget (newcomer-dials 0) the
// address gets no packet at all, with a budget of 4 at most what 4 dials
// send. Honest work is served throughout.
func TestHostileDHTAnswersDoNotAimDials(t *testing.T) {
	for _, tc := range []struct {
		name  string
		dials int
	}{{"no budget", 0}, {"budget of 4", 4}} {
		t.Run(tc.name, func(t *testing.T) {
			victim := newUDPVictim(t)
			gw, _ := echoMesh(t, func(c *config.Config) {
				c.Node.NewcomerDials = tc.dials
				c.Node.NewcomerDialInterval = time.Hour // the budget does not grow within the test
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			target := peer.AddrInfo{ID: gw.node.ID(), Addrs: gw.node.Host().Addrs()}
			attacker := newHostileDHTPeer(t, ctx, gw.node.Network(), target, victim.addr(), 20)
			testkit.WaitFor(t, 10*time.Second, "the gateway's DHT routing table holds the attacker", func() error {
				if !gw.node.InRoutingTable(attacker.id) {
					return errors.New("not yet")
				}
				return nil
			})
			before := attacker.answered.Load()
			for i := range 10 {
				_, id := newIdentity(t)
				lctx, lcancel := context.WithTimeout(ctx, 3*time.Second)
				_, err := gw.node.Lookup(lctx, id)
				lcancel()
				if err == nil {
					t.Fatalf("lookup %d of a record nobody stored succeeded", i)
				}
			}
			if n := attacker.answered.Load() - before; n < 10 {
				t.Fatalf("the attacker answered %d requests of 10 lookups, want every lookup to ask it", n)
			}
			for i := range 20 {
				res := gw.submit(t, dispatch.WorkRequest{Type: "echo", Payload: []byte(fmt.Sprint(i))})
				if res.Status != "ok" {
					t.Fatalf("request %d: %+v", i, res)
				}
			}
			// Every dial the lookups started has ended (a dial that gets
			// no answer gives up within go-libp2p's 10s dial timeout).
			got := victim.settled(t, 3*time.Second, 30*time.Second)
			gated := gw.node.NATStats().DialsGated
			t.Logf("newcomer-dials %d: %d datagrams to %s, %d addresses gated, %d answers", tc.dials, got, victim.addr(), gated, attacker.answered.Load()-before)
			if tc.dials == 0 && got != 0 {
				t.Errorf("%d datagrams reached the address the attacker named, want 0", got)
			}
			// A QUIC dial that gets no answer sends its Initial again and
			// again until it gives up (two datagrams each time: the
			// ClientHello is larger than one; 24 a dial seen here); 40 a
			// dial is generous. Without the guard: 1,684 datagrams.
			if limit := int64(tc.dials * 40); tc.dials > 0 && got > limit {
				t.Errorf("%d datagrams with a budget of %d dials, want at most %d", got, tc.dials, limit)
			}
			if gated == 0 {
				t.Error("no address gated: the attacker's answers were not dialed at all, so nothing was tested")
			}
		})
	}
}
