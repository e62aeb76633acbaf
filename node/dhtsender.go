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
// a time, and opens a new one when a reused stream fails; a request waits
// for the stream and uses it within its context.
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

// dhtStream is the stream to one peer; a request holds slot (a lock its
// caller may stop waiting for) while it uses the stream.
type dhtStream struct {
	slot chan struct{}
	s    network.Stream
	r    msgio.ReadCloser
}

var _ dhtpb.MessageSenderWithDisconnect = (*dhtSender)(nil)

func (d *dhtSender) stream(p peer.ID) *dhtStream {
	d.mu.Lock()
	defer d.mu.Unlock()
	ps := d.peers[p]
	if ps == nil {
		ps = &dhtStream{slot: make(chan struct{}, 1)}
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
	if ps == nil {
		return
	}
	select {
	case ps.slot <- struct{}{}:
		ps.reset()
		<-ps.slot
	default: // the request holding it resets it when it fails
	}
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
	select {
	case ps.slot <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-ps.slot }()
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
// dhtReadTimeout. When ctx ends first, the stream is reset (which ends a
// blocked write or read), and roundTrip returns only once that reset is
// done, so nothing of this call touches the stream after it.
func (ps *dhtStream) roundTrip(ctx context.Context, msg []byte, answer bool) (*dhtpb.Message, error) {
	s := ps.s
	ended := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(ended)
		_ = s.Reset()
	})
	resp, err := ps.send(s, msg, answer)
	if !stop() {
		<-ended // the reset ran, or is running: wait for it
		return nil, ctx.Err()
	}
	return resp, err
}

// send writes msg on s and, with answer, reads one answer, both within
// dhtReadTimeout.
func (ps *dhtStream) send(s network.Stream, msg []byte, answer bool) (*dhtpb.Message, error) {
	_ = s.SetDeadline(time.Now().Add(dhtReadTimeout))
	defer s.SetDeadline(time.Time{})
	if err := msgio.NewVarintWriter(s).WriteMsg(msg); err != nil {
		return nil, err
	}
	if !answer {
		return nil, nil
	}
	b, err := ps.r.ReadMsg()
	if err != nil {
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
