package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p-kad-dht/records"
	record "github.com/libp2p/go-libp2p-record"
	recpb "github.com/libp2p/go-libp2p-record/pb"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-msgio"
	"google.golang.org/protobuf/proto"
)

// putAtTimeout bounds one peer's PUT_VALUE exchange.
const putAtTimeout = 10 * time.Second

// putRecordMaxAnswer bounds the answer to a PUT_VALUE: the record sent
// back, which the node's own record bounds.
const putRecordMaxAnswer = 64 << 10

// putValue stores the node's record under key locally and with the peers
// closest to key. It is the DHT's PutValue, but for the answer check: the
// DHT's (go-libp2p-kad-dht v0.42.2, pb.ProtocolMessenger.PutValue) reads
// the record a peer sends back without checking there is one, so a peer
// answering a PUT_VALUE with an empty message crashed the node's process.
// Here such an answer is that peer's failed put.
func (d *dhtRecords) putValue(ctx context.Context, key string, value []byte) error {
	rec := record.MakePutRecord(key, value)
	if err := d.local.Put(ctx, key, rec); err != nil && !errors.Is(err, records.ErrOldRecord) {
		return fmt.Errorf("store locally: %w", err)
	}
	peers, err := d.dht.GetClosestPeers(ctx, key)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, putAtTimeout)
			defer cancel()
			if err := d.putAt(pctx, p, rec); err != nil && ctx.Err() == nil {
				d.log.WithField("peer", p.String()).Debugf("dht: put nodedata: %v", err)
			}
		})
	}
	wg.Wait()
	return nil
}

// putAt sends rec to p in a PUT_VALUE request and checks that p's answer
// holds the value it stored.
func (d *dhtRecords) putAt(ctx context.Context, p peer.ID, rec *recpb.Record) (err error) {
	s, err := d.host.NewStream(ctx, p, d.protocol)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			s.Reset()
		} else {
			s.Close()
		}
	}()
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	req := dhtpb.NewMessage(dhtpb.Message_PUT_VALUE, rec.Key, 0)
	req.Record = rec
	b, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	if err := msgio.NewVarintWriter(s).WriteMsg(b); err != nil {
		return fmt.Errorf("send PUT_VALUE: %w", err)
	}
	r := msgio.NewVarintReaderSize(s, putRecordMaxAnswer)
	ans, err := r.ReadMsg()
	if err != nil {
		return fmt.Errorf("read the answer to PUT_VALUE: %w", err)
	}
	defer r.ReleaseMsg(ans)
	var resp dhtpb.Message
	if err := proto.Unmarshal(ans, &resp); err != nil {
		return fmt.Errorf("answer to PUT_VALUE: %w", err)
	}
	if !bytes.Equal(resp.GetRecord().GetValue(), rec.GetValue()) {
		return errors.New("the answer to PUT_VALUE does not hold the record sent")
	}
	return nil
}
