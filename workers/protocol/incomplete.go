package protocol

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/node/frame"
)

// Defaults of the bound on incomplete requests (WithIncompleteLimits).
const (
	// DefaultIncompleteTotal bounds the bytes of request bodies a server
	// holds while they are still arriving, over all peers.
	DefaultIncompleteTotal = 32 << 20
	// DefaultIncompletePerPeer bounds them for one peer.
	DefaultIncompletePerPeer = 4 << 20

	// reclaimAfter is how many bytes of abandoned bodies (streams that
	// ended or timed out before their request was whole) make the server
	// hand the memory back to the operating system, and reclaimDelay how
	// long after the first of them it does, at most once per delay.
	reclaimAfter = 8 << 20
	reclaimDelay = time.Second
)

// ErrIncompleteLimit means a request's body could not be read further
// because the bytes of incomplete requests, the peer's or all of them,
// reached their bound: the stream is reset.
var ErrIncompleteLimit = errors.New("too many bytes of incomplete requests")

// bounds are a server's bounds of one kind over all peers and for one
// peer (WithIncompleteLimits, WithWaitingLimits).
type bounds struct{ total, perPeer int }

// newBounds checks and returns bounds of what.
func newBounds(what string, total, perPeer int) (bounds, error) {
	if total < 1 || perPeer < 1 || perPeer > total {
		return bounds{}, fmt.Errorf("%s limits %d total, %d per peer: want 1 <= per peer <= total", what, total, perPeer)
	}
	return bounds{total: total, perPeer: perPeer}, nil
}

// WithIncompleteLimits bounds the memory of request bodies a server holds
// while they are still arriving: total bytes over all peers and perPeer
// bytes for one peer (defaults DefaultIncompleteTotal and
// DefaultIncompletePerPeer). A body grows with the bytes that arrive, and
// a growth beyond either bound resets its stream; a request that is whole
// no longer counts. With the request read timeout it keeps peers that
// send all of a large request but its last byte from pinning memory. A
// server option.
func WithIncompleteLimits(total, perPeer int) Option {
	return func(c *settings) (err error) {
		c.incomplete, err = newBounds("incomplete request", total, perPeer)
		return err
	}
}

// incomplete accounts the bytes of the request bodies a server is reading,
// and hands the memory of abandoned ones back to the operating system.
type incomplete struct {
	lim bounds

	mu        sync.Mutex
	total     int
	perPeer   map[peer.ID]int
	abandoned int         // bytes of bodies abandoned since the last reclaim
	timer     *time.Timer // the pending reclaim; nil when none
	closed    bool

	pool sync.Pool // of *partial
}

func newIncomplete(lim bounds) *incomplete {
	return &incomplete{lim: lim, perPeer: map[peer.ID]int{}}
}

// partial is the memory account of one request body being read: a
// frame.Memory that takes from the server's bounds before the stream's
// resource scope.
type partial struct {
	in    *incomplete
	peer  peer.ID
	scope frame.Memory
	held  int // bytes taken from the bounds
}

// open starts the account of a body from p whose stream scope is scope.
func (in *incomplete) open(p peer.ID, scope frame.Memory) *partial {
	pt, _ := in.pool.Get().(*partial)
	if pt == nil {
		pt = &partial{in: in}
	}
	pt.peer, pt.scope, pt.held = p, scope, 0
	return pt
}

// ReserveMemory takes n bytes from the peer's and the total bound, then
// from the stream's scope.
func (pt *partial) ReserveMemory(n int, prio uint8) error {
	in := pt.in
	in.mu.Lock()
	peerHeld := in.perPeer[pt.peer]
	if in.total+n > in.lim.total || peerHeld+n > in.lim.perPeer {
		total := in.total
		in.mu.Unlock()
		return fmt.Errorf("%w: %d bytes held for this peer (bound %d), %d in all (bound %d)",
			ErrIncompleteLimit, peerHeld, in.lim.perPeer, total, in.lim.total)
	}
	in.total += n
	in.perPeer[pt.peer] = peerHeld + n
	in.mu.Unlock()
	if pt.scope != nil {
		if err := pt.scope.ReserveMemory(n, prio); err != nil {
			in.give(pt.peer, n)
			return err
		}
	}
	pt.held += n
	return nil
}

// ReleaseMemory gives n bytes back to the stream's scope; the bounds get
// theirs back at close.
func (pt *partial) ReleaseMemory(n int) {
	if pt.scope != nil {
		pt.scope.ReleaseMemory(n)
	}
}

// close ends the account: the body is whole (or abandoned, when failed),
// and no longer counts against the bounds.
func (in *incomplete) close(pt *partial, failed bool) {
	if pt.held > 0 {
		in.give(pt.peer, pt.held)
		if failed {
			in.abandon(pt.held)
		}
	}
	pt.peer, pt.scope, pt.held = "", nil, 0
	in.pool.Put(pt)
}

func (in *incomplete) give(p peer.ID, n int) {
	in.mu.Lock()
	in.total -= n
	if left := in.perPeer[p] - n; left > 0 {
		in.perPeer[p] = left
	} else {
		delete(in.perPeer, p)
	}
	in.mu.Unlock()
}

// abandon notes n bytes of a body that will never be whole. Once
// reclaimAfter of them are garbage, the server returns the freed memory
// to the operating system reclaimDelay later: the Go runtime alone gives
// it back over minutes, and a node that peers made grow should not stay
// that large.
func (in *incomplete) abandon(n int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.abandoned += n
	if in.abandoned < reclaimAfter || in.timer != nil || in.closed {
		return
	}
	in.timer = time.AfterFunc(reclaimDelay, in.reclaim)
}

func (in *incomplete) reclaim() {
	debug.FreeOSMemory()
	in.mu.Lock()
	in.abandoned, in.timer = 0, nil
	in.mu.Unlock()
}

// stop cancels a pending reclaim; the server is closing.
func (in *incomplete) stop() {
	in.mu.Lock()
	in.closed = true
	if in.timer != nil {
		in.timer.Stop()
		in.timer = nil
	}
	in.mu.Unlock()
}

// Incomplete returns the bytes of request bodies the server is reading
// now, for tests and metrics.
func (s *Server) Incomplete() int {
	s.incomplete.mu.Lock()
	defer s.incomplete.mu.Unlock()
	return s.incomplete.total
}

// readRequest reads the request frame from str, accounting its body
// against the bounds on incomplete requests. It is apart from serve and
// run so that neither's stack frame grows.
func (s *Server) readRequest(c *wstream) ([]byte, int, error) {
	pt := s.incomplete.open(c.peer, c.str.Scope())
	body, reserved, err := c.hdr.ReadBounded(c, frameLimit(s.cfg.maxPayload), pt)
	s.incomplete.close(pt, err != nil)
	return body, reserved, err
}
