package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// dials holds the dials of one request, so that a peer dialed ahead is not
// dialed again by its attempt: the attempt waits for the dial in progress.
// The request owns it: close stops the dials still under way and waits for
// them.
type dials struct {
	d      *Dispatcher
	parent context.Context
	wg     sync.WaitGroup // the dial goroutines
	mu     sync.Mutex
	ctx    context.Context // made at the first dial; cancelled by close
	stop   context.CancelFunc
	calls  map[string]*dialCall
}

type dialCall struct {
	done chan struct{}
	err  error
}

// close stops the dials still under way and returns when every dial has
// ended.
func (ds *dials) close() {
	ds.mu.Lock()
	if ds.stop != nil {
		ds.stop()
	}
	ds.mu.Unlock()
	ds.wg.Wait()
}

// connectedCall is the dial of a peer already connected: done, no error.
var connectedCall = func() *dialCall {
	c := &dialCall{done: make(chan struct{})}
	close(c.done)
	return c
}()

// start dials id unless a dial of it already started in this request, or
// the host is connected to it (the common case of a dial ahead: no
// goroutine, no channel).
func (ds *dials) start(id string) *dialCall {
	if ds.d.connected(id) {
		return connectedCall
	}
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if c := ds.calls[id]; c != nil {
		return c
	}
	c := &dialCall{done: make(chan struct{})}
	if ds.calls == nil {
		ds.calls = make(map[string]*dialCall)
		ds.ctx, ds.stop = context.WithCancel(ds.parent)
	}
	ds.calls[id] = c
	ds.wg.Go(func() {
		c.err = ds.d.connect(ds.ctx, id)
		close(c.done)
	})
	return c
}

// connected reports whether the host holds a connection to id, direct or
// relayed (limited).
func (d *Dispatcher) connected(id string) bool {
	c := d.node.Host().Network().Connectedness(peer.ID(id))
	return c == network.Connected || c == network.Limited
}

// wait returns the result of the request's dial of id, starting it if
// needed; waited says it did not find the peer connected at once.
func (ds *dials) wait(ctx context.Context, id string) (waited bool, _ error) {
	if ds.d.node.Host().Network().Connectedness(peer.ID(id)) == network.Connected {
		return false, nil // the common case: no dial, no goroutine
	}
	c := ds.start(id)
	select {
	case <-c.done:
		return true, c.err
	case <-ctx.Done():
		return true, ctx.Err()
	}
}

// connect makes sure there is a connection to the peer, dialing it within
// connect-timeout when there is none.
func (d *Dispatcher) connect(ctx context.Context, id string) error {
	pid := peer.ID(id)
	h := d.node.Host()
	if c := h.Network().Connectedness(pid); c == network.Connected || c == network.Limited {
		return nil // a relayed (limited) connection is judged by the attempt (OverRelay)
	}
	// The node says which of the peer's addresses may be dialed: those it
	// was observed at, or, within the newcomer budget, its record's word.
	// A newcomer dial waits for the node's budget within the connect
	// timeout too.
	cctx, cancel := context.WithTimeout(network.WithAllowLimitedConn(ctx, "workmesh dial"), d.cfg.Worker.ConnectTimeout)
	defer cancel()
	info, done, err := d.node.DialInfo(cctx, pid)
	if err != nil {
		return &dialError{timeout: d.cfg.Worker.ConnectTimeout, err: err}
	}
	start := time.Now()
	err = h.Connect(cctx, info)
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		done(context.Canceled) // given up by the caller: no word on the address
	} else {
		done(err)
	}
	if err != nil {
		return &dialError{timeout: d.cfg.Worker.ConnectTimeout, err: err}
	}
	if h.Peerstore().LatencyEWMA(pid) == 0 {
		// The dial's handshake took about one round trip (a little more):
		// until the first health ping measures it, that is the round trip
		// the waits for the peer's answers start from.
		h.Peerstore().RecordLatency(pid, time.Since(start))
	}
	return nil
}
