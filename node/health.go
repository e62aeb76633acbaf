package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/workmesh/workmesh/node/frame"
)

// HealthProtocol returns the protocol ID of the health ping in a network.
func HealthProtocol(network string) protocol.ID {
	return protocol.ID("/workmesh/" + network + "/health/1.0.0")
}

// NodeDataProtocol returns the protocol ID on which a node hands over its own
// signed NodeData and, on request, the signed records it holds of others, so
// that a node that just connected does not wait for the next announcement.
func NodeDataProtocol(network string) protocol.ID {
	return protocol.ID("/workmesh/" + network + "/nodedata/1.0.0")
}

// Message bounds and deadlines of the health and nodedata protocols.
const (
	maxRequestFrame = 256
	maxHealthFrame  = 16 << 10
	// maxUnhealthyText bounds how much of a peer's own words about its
	// health goes into an error (and so into logs).
	maxUnhealthyText = 200
	// maxSyncRecords bounds the records in one nodedata answer.
	maxSyncRecords = 1024
	// streamTimeout bounds a whole exchange when the caller's context sets
	// no earlier deadline.
	streamTimeout = 5 * time.Second
	syncTimeout   = 10 * time.Second
)

// HealthAnswer is a node's answer to a health ping: enough to tell it is
// alive, whether it has a newer record than the one held, and how busy it is.
type HealthAnswer struct {
	// Sequence is the sequence of the node's current NodeData.
	Sequence uint64 `json:"sequence"`
	// Load is the node's load now.
	Load Load `json:"load"`
	// Heads maps work type to the node's head now, for types that have one.
	Heads map[string]uint64 `json:"heads,omitempty"`
	// Error, when set, says the node is up but its worker cannot work now
	// (its upstream stopped answering, or fault injection); the ping counts
	// as failed.
	Error string `json:"error,omitempty"`
}

// ErrUnhealthy is wrapped by Ping's error when the peer answered that its
// worker cannot work now.
var ErrUnhealthy = errors.New("peer reports it cannot work")

type healthRequest struct{}

type nodedataRequest struct {
	// All asks for every fresh record the node holds, not only its own.
	All bool `json:"all"`
	// Push says that the requester's own signed record follows the request
	// in a frame of its own, for the node to enter and pass on. A node that
	// joins hands its record to the peers it bootstraps from this way,
	// without waiting for its gossip to be set up.
	Push bool `json:"push,omitempty"`
	// eager (never sent) opens the stream without waiting for identify.
	eager bool
}

// requestReadTimeout bounds the read of a health ping's or a nodedata
// request (a record pushed with it gets streamTimeout): it follows the
// stream's opening at once, in the same packets, so a peer that opens a
// stream and sends nothing holds it no longer than this. A variable for
// tests.
var requestReadTimeout = time.Second

// finish closes s after a good exchange and resets it after a failed one.
func finish(s network.Stream, err error) {
	if err != nil {
		s.Reset()
		return
	}
	s.Close()
}

func (n *Node) handleHealth(s network.Stream) {
	var err error
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
			n.log.WithField("peer", s.Conn().RemotePeer().String()).Errorf("health handler: %v", err)
		}
		finish(s, err)
	}()
	if err = s.Scope().SetService(healthService); err != nil {
		return
	}
	if err = s.SetDeadline(time.Now().Add(requestReadTimeout)); err != nil {
		return
	}
	if err = n.refuseStranger(s, "health ping"); err != nil {
		return
	}
	var req healthRequest
	if err = readJSONFrame(s, &req, maxRequestFrame); err != nil {
		n.log.WithField("peer", s.Conn().RemotePeer().String()).Debugf("health: bad request: %v", err)
		return
	}
	if err = s.SetDeadline(time.Now().Add(streamTimeout)); err != nil {
		return
	}
	ans := n.healthAnswer()
	if n.healthCheck != nil {
		if herr := n.healthCheck(s.Conn().RemotePeer()); errors.Is(herr, ErrHealthDropped) {
			err = herr
			return
		} else if herr != nil {
			ans.Error = herr.Error()
		}
	}
	err = writeJSONFrame(s, ans, maxHealthFrame)
}

func (n *Node) healthAnswer() HealthAnswer {
	cur := n.current()
	return HealthAnswer{Sequence: cur.Data.Sequence, Load: n.records.state.Load(), Heads: n.records.state.Heads()}
}

// Ping sends one health ping to p and returns the round-trip time and the
// answer. It dials p if needed, within ctx; without a deadline in ctx the
// exchange is bounded by five seconds.
func (n *Node) Ping(ctx context.Context, p peer.ID) (time.Duration, HealthAnswer, error) {
	ctx, cancel := withDefaultTimeout(ctx, streamTimeout)
	defer cancel()
	start := time.Now()
	// A ping may go over a relayed connection (it is tiny): a peer behind
	// a NAT no hole punch gets through is alive there.
	s, err := n.host.NewStream(network.WithAllowLimitedConn(ctx, "health ping"), p, HealthProtocol(n.cfg.Network))
	if err != nil {
		return 0, HealthAnswer{}, fmt.Errorf("health ping %s: open stream: %w", p, err)
	}
	// The stream deadline below bounds the exchange on QUIC and TCP; the
	// reset bounds it where a transport ignores deadlines (the in-memory
	// mock network), so that a ping never outlives its context.
	defer context.AfterFunc(ctx, func() { s.Reset() })()
	var ans HealthAnswer
	err = func() error {
		if err := s.Scope().SetService(healthService); err != nil {
			return err
		}
		dl, _ := ctx.Deadline()
		if err := s.SetDeadline(dl); err != nil {
			return err
		}
		if err := writeJSONFrame(s, healthRequest{}, maxRequestFrame); err != nil {
			return err
		}
		if err := s.CloseWrite(); err != nil {
			return err
		}
		return readJSONFrame(s, &ans, maxHealthFrame)
	}()
	finish(s, err)
	if err != nil {
		return 0, HealthAnswer{}, fmt.Errorf("health ping %s: %w", p, err)
	}
	rtt := time.Since(start)
	n.heard(ctx, p, ans.Sequence)
	if ans.Error != "" {
		msg := ans.Error
		if len(msg) > maxUnhealthyText {
			msg = msg[:maxUnhealthyText] + "..."
		}
		return rtt, ans, fmt.Errorf("health ping %s: %w: %q", p, ErrUnhealthy, msg)
	}
	return rtt, ans, nil
}

// heard keeps a peer that answered a health ping known: the record held
// stays fresh while the peer keeps naming its sequence (PeerTable.Heard),
// and a newer sequence, an announcement this node missed, is fetched from
// the peer by fetchLoop, off the ping's way.
func (n *Node) heard(_ context.Context, p peer.ID, seq uint64) {
	if seq == 0 || !n.table.Heard(p, seq) {
		return
	}
	n.fetchMu.Lock()
	defer n.fetchMu.Unlock()
	if n.fetching[p] {
		return
	}
	select {
	case n.fetchQ <- p:
		n.fetching[p] = true
	default: // full: the next answer asks again
	}
}

// fetchQueue bounds the peers waiting for fetchLoop.
const fetchQueue = 64

// fetchLoop fetches the records health answers named newer than the ones
// held, one at a time, until ctx ends.
func (n *Node) fetchLoop(ctx context.Context) {
	for {
		var p peer.ID
		select {
		case <-ctx.Done():
			return
		case p = <-n.fetchQ:
		}
		// A peer behind a NAT may be reached through a relay only (its
		// health answers come that way): one record fits a relayed
		// connection's limits, and gossip does not cross such a
		// connection, so this fetch may use it.
		fctx := network.WithAllowLimitedConn(ctx, "workmesh record fetch")
		if _, err := n.fetchNodeData(fctx, p, false); err != nil && ctx.Err() == nil {
			n.log.WithField("peer", p.String()).Debugf("fetch the newer record a health answer named: %v", err)
		}
		n.fetchMu.Lock()
		delete(n.fetching, p)
		n.fetchMu.Unlock()
	}
}

func (n *Node) handleNodeData(s network.Stream) {
	var err error
	from := s.Conn().RemotePeer()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
			n.log.WithField("peer", from.String()).Errorf("nodedata handler: %v", err)
		}
		finish(s, err)
	}()
	if err = s.Scope().SetService(nodedataService); err != nil {
		return
	}
	if err = s.SetDeadline(time.Now().Add(requestReadTimeout)); err != nil {
		return
	}
	in := &countingReader{r: s}
	var req nodedataRequest
	if err = readJSONFrame(in, &req, maxRequestFrame); err != nil {
		n.log.WithField("peer", from.String()).Debugf("nodedata: bad request: %v", err)
		return
	}
	if req.Push {
		// The pushed record (up to MaxRecordSize) may take a slow or lossy
		// link longer than the request's second.
		if err = s.SetDeadline(time.Now().Add(streamTimeout)); err != nil {
			return
		}
		if err = n.takePush(in, from); err != nil {
			return
		}
	}
	if err = s.SetDeadline(time.Now().Add(syncTimeout)); err != nil {
		return
	}
	if err = n.refuseStranger(s, "nodedata"); err != nil {
		return
	}
	// What the answer may cost (see syncAmplification, syncBudget): a peer
	// the table holds a fresh record of draws on its byte budget; any
	// other gets at most syncAmplification times what it sent.
	_, member := n.table.Get(from)
	credit := syncAmplification * in.n
	send := func(b []byte) bool {
		cost := len(b) + frameOverhead
		if member {
			return n.syncBudget.AllowN(from, cost)
		}
		if cost > credit {
			return false
		}
		credit -= cost
		return true
	}
	own := n.current().Envelope
	if !send(own) {
		err = fmt.Errorf("nodedata: answer to %s beyond its budget (%d bytes asked for with %d sent)", from, len(own), in.n)
		n.log.WithField("peer", from.String()).Debug(err)
		return
	}
	if err = writeFrame(s, own); err != nil || !req.All {
		return
	}
	if !member || !n.fullSyncs.Allow(from) {
		// The whole table only to a peer the node knows, and once per
		// record-ttl: what changes after, gossip brings.
		return
	}
	sent := 1
	if sent, err = n.sendRevocations(s, send, sent); err != nil {
		return
	}
	for _, p := range n.table.Peers() {
		if sent >= maxSyncRecords {
			break
		}
		if p.Data.PeerID == from {
			continue // it knows itself best
		}
		if !send(p.Envelope) {
			break // the rest when its budget has grown again
		}
		if err = writeFrame(s, p.Envelope); err != nil {
			return
		}
		sent++
	}
}

// Bounds on nodedata answers, so that a request cannot make the node send
// much more than it cost: a peer the node holds a fresh record of (a
// member: it pushed its record, or it was announced) is answered from a
// byte budget of its own, syncBudgetBurst at once and syncBudgetRate more
// a second; the node's full table (a newcomer's first syncs) fits a few
// hundred records, and is sent to one peer at most once per record-ttl. Any other peer is answered with at most
// syncAmplification times the bytes it sent in the exchange, and never with
// the whole table.
const (
	syncAmplification = 10
	syncBudgetBurst   = 256 << 10
	syncBudgetRate    = 4 << 10
	// frameOverhead is what a frame costs beyond its bytes (its length).
	frameOverhead = frame.HeaderLen
)

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n += k
	return k, err
}

// takePush reads the record a peer pushed after its request and enters it.
// Only the peer's own record may be pushed. When the table held no fresh
// record of the peer, the record is also published on gossip at once: that
// sends it to every topic peer this node is connected to in one hop, where
// the newcomer's own announcement would have to wait for its gossip streams
// and then travel through a mesh it is not part of yet.
func (n *Node) takePush(s io.Reader, from peer.ID) error {
	b, err := readFrame(s, MaxRecordSize)
	if err != nil {
		if errors.Is(err, ErrFrameTooLarge) {
			n.table.RejectVia(SourceSync, RejectOversized, from, err)
		}
		return fmt.Errorf("pushed record: %w", err)
	}
	if id, ok := envelopeSigner(b); ok && id == from && n.table.Holds(id, b) {
		// The record held, byte for byte: every sync and fetch a peer
		// makes carries its record, mostly one this node already holds,
		// and checking it again cost a signature check per exchange (of
		// 200 nodes forming on mocknet, 2.2s of the network's 35s of CPU).
		return nil
	}
	sd, err := OpenNodeData(b, n.cfg.Network)
	if err != nil {
		n.table.RejectVia(SourceSync, ReasonOf(err), from, err)
		return err
	}
	if sd.Data.PeerID != from {
		err := reject(RejectForged, fmt.Errorf("record of %s pushed by %s", sd.Data.PeerID, from))
		n.table.RejectVia(SourceSync, RejectForged, from, err)
		return err
	}
	_, known := n.table.Get(from)
	if ok, _ := n.gossip.enter(sd, from, SourceSync); ok && !known {
		n.gossip.relay(n.ctx, sd)
	}
	return nil // an older or the same record again is no reason to fail the exchange
}

// pushNodeData hands p this node's own record (see nodedataRequest.Push)
// and enters p's record, which comes back in the answer.
func (n *Node) pushNodeData(ctx context.Context, p peer.ID) error {
	_, err := n.exchangeNodeData(ctx, p, nodedataRequest{Push: true})
	return err
}

// pushEarly is pushNodeData over the connection a joining node just made,
// before identify has run (see newStreamEager).
func (n *Node) pushEarly(ctx context.Context, p peer.ID) error {
	_, err := n.exchangeNodeData(ctx, p, nodedataRequest{Push: true, eager: true})
	return err
}

// fetchNodeData asks p for its own record (and, with all, every record it
// holds) and offers each one to the peer table. It returns the number of
// records that changed the table. The request carries this node's own
// record (Push): p answers with its table only a peer whose record it
// holds, and only a few times the bytes asked with to one it does not.
func (n *Node) fetchNodeData(ctx context.Context, p peer.ID, all bool) (int, error) {
	return n.exchangeNodeData(ctx, p, nodedataRequest{All: all, Push: true})
}

// exchangeNodeData sends req to p (with this node's own record after it
// when req.Push is set) and offers each record of the answer to the peer
// table. It returns the number of records that changed the table.
func (n *Node) exchangeNodeData(ctx context.Context, p peer.ID, req nodedataRequest) (int, error) {
	ctx, cancel := withDefaultTimeout(ctx, syncTimeout)
	defer cancel()
	open := n.host.NewStream
	if req.eager {
		open = func(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
			return newStreamEager(ctx, n.host.Host, p, pids[0])
		}
	}
	s, err := open(ctx, p, NodeDataProtocol(n.cfg.Network))
	if err != nil {
		return 0, fmt.Errorf("nodedata from %s: open stream: %w", p, err)
	}
	// As in Ping: the deadline bounds the exchange, and the reset bounds it
	// where the transport ignores deadlines.
	defer context.AfterFunc(ctx, func() { s.Reset() })()
	changed := 0
	err = func() error {
		if err := s.Scope().SetService(nodedataService); err != nil {
			return err
		}
		dl, _ := ctx.Deadline()
		if err := s.SetDeadline(dl); err != nil {
			return err
		}
		if err := writeJSONFrame(s, req, maxRequestFrame); err != nil {
			return err
		}
		if req.Push {
			if err := writeFrame(s, n.current().Envelope); err != nil {
				return err
			}
		}
		if err := s.CloseWrite(); err != nil {
			return err
		}
		for i := 0; ; i++ {
			b, err := readFrame(s, MaxRecordSize)
			if errors.Is(err, io.EOF) && i > 0 {
				return nil
			}
			if errors.Is(err, ErrFrameTooLarge) {
				n.table.RejectVia(SourceSync, RejectOversized, p, err)
			}
			if err != nil {
				return err
			}
			if i >= maxSyncRecords {
				return fmt.Errorf("more than %d records", maxSyncRecords)
			}
			if n.takeSynced(b, p, req.All) {
				changed++
			}
		}
	}()
	finish(s, err)
	if err != nil {
		return changed, fmt.Errorf("nodedata from %s: %w", p, err)
	}
	return changed, nil
}

// withDefaultTimeout bounds ctx by d unless it already has a deadline.
func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
