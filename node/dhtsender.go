package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-msgio"
	"google.golang.org/protobuf/proto"
)

// dhtReadTimeout bounds the wait for one answer, as the DHT's own sender
// does.
const dhtReadTimeout = 10 * time.Second

// errBadPutAnswer is a peer's answer to PUT_VALUE that does not hold the
// record sent.
var errBadPutAnswer = errors.New("the answer to PUT_VALUE does not hold the record sent")

// dhtSender sends the DHT's requests (dht.WithCustomMessageSender) and
// checks each answer before the DHT reads it. The DHT's own sender
// (go-libp2p-kad-dht v0.42.2) hands the DHT any answer that parses, and the
// DHT reads the record of an answer to PUT_VALUE without checking there is
// one: a peer answering the node's record put, or the record corrections a
// lookup sends after it (GetValue), with an empty message crashed the
// node's process (a nil pointer in a goroutine of the DHT). Here such an
// answer is that peer's error.
//
// Like the DHT's sender it keeps one stream per peer, one request on it at
// a time, and opens a new one when a reused stream fails.
type dhtSender struct {
	h      host.Host
	protos []protocol.ID

	mu    sync.Mutex
	peers map[peer.ID]*dhtStream

	// refused counts the answers refused by check.
	refused atomic.Uint64
}

func newDHTSender(h host.Host, protos []protocol.ID) *dhtSender {
	return &dhtSender{h: h, protos: protos, peers: make(map[peer.ID]*dhtStream)}
}

// dhtStream is the stream to one peer; mu holds it for one request.
type dhtStream struct {
	mu sync.Mutex
	s  network.Stream
	r  msgio.ReadCloser
}

var _ dhtpb.MessageSenderWithDisconnect = (*dhtSender)(nil)

func (d *dhtSender) stream(p peer.ID) *dhtStream {
	d.mu.Lock()
	defer d.mu.Unlock()
	ps := d.peers[p]
	if ps == nil {
		ps = &dhtStream{}
		d.peers[p] = ps
	}
	return ps
}

// OnDisconnect forgets the peer's stream (the connection took it along).
func (d *dhtSender) OnDisconnect(_ context.Context, p peer.ID) {
	d.mu.Lock()
	ps := d.peers[p]
	delete(d.peers, p)
	d.mu.Unlock()
	if ps != nil && ps.mu.TryLock() {
		ps.reset()
		ps.mu.Unlock()
	} // else the request holding it resets it when it fails
}

// SendMessage sends pmes, which gets no answer.
func (d *dhtSender) SendMessage(ctx context.Context, p peer.ID, pmes *dhtpb.Message) error {
	_, err := d.exchange(ctx, p, pmes, false)
	return err
}

// SendRequest sends pmes and returns the peer's answer, once check found
// nothing wrong with it.
func (d *dhtSender) SendRequest(ctx context.Context, p peer.ID, pmes *dhtpb.Message) (*dhtpb.Message, error) {
	resp, err := d.exchange(ctx, p, pmes, true)
	if err != nil {
		return nil, err
	}
	if err := checkDHTAnswer(pmes, resp); err != nil {
		d.refused.Add(1)
		return nil, fmt.Errorf("dht answer of %s: %w", p, err)
	}
	return resp, nil
}

// checkDHTAnswer reports what is wrong with resp as the answer to req, of
// what the DHT reads unchecked.
func checkDHTAnswer(req, resp *dhtpb.Message) error {
	if req.GetType() == dhtpb.Message_PUT_VALUE && (resp.GetRecord() == nil || !bytes.Equal(resp.GetRecord().GetValue(), req.GetRecord().GetValue())) {
		return errBadPutAnswer
	}
	return nil
}

// exchange writes pmes on the peer's stream and, with answer, reads the
// answer; a reused stream that fails is replaced by a new one once.
func (d *dhtSender) exchange(ctx context.Context, p peer.ID, pmes *dhtpb.Message, answer bool) (*dhtpb.Message, error) {
	b, err := proto.Marshal(pmes)
	if err != nil {
		return nil, err
	}
	ps := d.stream(p)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for {
		reused := ps.s != nil
		if !reused {
			s, err := d.h.NewStream(ctx, p, d.protos...)
			if err != nil {
				return nil, err
			}
			ps.s, ps.r = s, msgio.NewVarintReaderSize(s, network.MessageSizeMax)
		}
		resp, err := ps.roundTrip(ctx, b, answer)
		if err == nil {
			return resp, nil
		}
		ps.reset()
		if !reused || ctx.Err() != nil {
			return nil, err
		}
	}
}

// roundTrip writes one message and reads one answer within ctx and
// dhtReadTimeout.
func (ps *dhtStream) roundTrip(ctx context.Context, msg []byte, answer bool) (*dhtpb.Message, error) {
	if err := msgio.NewVarintWriter(ps.s).WriteMsg(msg); err != nil {
		return nil, err
	}
	if !answer {
		return nil, nil
	}
	deadline := time.Now().Add(dhtReadTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = ps.s.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = ps.s.SetReadDeadline(time.Now()) })
	b, err := ps.r.ReadMsg()
	stopped := stop()
	_ = ps.s.SetReadDeadline(time.Time{})
	if err != nil {
		if !stopped {
			return nil, ctx.Err()
		}
		return nil, err
	}
	defer ps.r.ReleaseMsg(b)
	resp := new(dhtpb.Message)
	if err := proto.Unmarshal(b, resp); err != nil {
		return nil, fmt.Errorf("dht answer: %w", err)
	}
	return resp, nil
}

func (ps *dhtStream) reset() {
	if ps.s != nil {
		ps.s.Reset()
	}
	ps.s, ps.r = nil, nil
}
