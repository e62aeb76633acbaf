package node

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	"github.com/libp2p/go-libp2p/p2p/protocol/identify"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// The hole punch retry's pace: a peer that stays connected only through a
// relay is punched again punchFirstRetry after it was first seen so, then
// at twice the last delay, up to punchMaxRetry between tries.
const (
	punchFirstRetry = 20 * time.Second
	punchMaxRetry   = 10 * time.Minute
	punchTick       = 5 * time.Second
	// punchReadyAfter is how long after the hole punch service first
	// found a public address of the node's own a retry may ask it for a
	// punch (it is ready a moment after it found one).
	punchReadyAfter = time.Second
)

// punchSchedule says when a peer connected only through a relay is due a
// hole punch again. Its clock is its caller's.
type punchSchedule struct {
	first, max time.Duration
	peers      map[peer.ID]punchState
}

type punchState struct {
	next  time.Time
	delay time.Duration
}

func newPunchSchedule(first, max time.Duration) *punchSchedule {
	return &punchSchedule{first: first, max: max, peers: map[peer.ID]punchState{}}
}

// due takes the peers connected only through a relay now and returns
// those due a punch, moving their next one on. A peer seen for the first
// time is due first after now; a peer no longer among relayed is forgotten,
// so that it starts over should it be relayed again.
func (s *punchSchedule) due(now time.Time, relayed []peer.ID) []peer.ID {
	var out []peer.ID
	for _, p := range relayed {
		st, ok := s.peers[p]
		switch {
		case !ok:
			st = punchState{next: now.Add(s.first), delay: s.first}
		case !now.Before(st.next):
			out = append(out, p)
			st.delay = min(2*st.delay, s.max)
			st.next = now.Add(st.delay)
		}
		s.peers[p] = st
	}
	if len(s.peers) > len(relayed) {
		for p := range s.peers {
			if !slices.Contains(relayed, p) {
				delete(s.peers, p)
			}
		}
	}
	return out
}

// punchRetrier runs the host's hole punch service and tries a punch again
// to peers the node stays connected to only through a relay. The service
// punches once, when a relayed connection arrives, and only when it knows
// a public address of the node's own and the other side's service
// answers: a connection that came before either (just after a start), or
// whose punch failed while the path between the two was blocked, would
// stay relayed for good. Only the side that accepted the relayed
// connection punches, as the service itself does.
type punchRetrier struct {
	h     host.Host
	svc   *holepunch.Service
	nat   *natState
	ready atomic.Int64 // unix nanoseconds when the service first found a public address; 0 before
	stop  chan struct{}
	wg    sync.WaitGroup
}

// newPunchRetrier starts h's hole punch service, punching from the public
// addresses addrs returns.
func newPunchRetrier(h host.Host, ids identify.IDService, addrs func() []ma.Multiaddr, st *natState) (*punchRetrier, error) {
	r := &punchRetrier{h: h, nat: st, stop: make(chan struct{})}
	svc, err := holepunch.NewService(h, ids, func() []ma.Multiaddr {
		a := addrs()
		if len(a) > 0 && r.ready.Load() == 0 {
			r.ready.CompareAndSwap(0, time.Now().UnixNano())
		}
		return a
	}, holepunch.WithTracer(st))
	if err != nil {
		return nil, err
	}
	r.svc = svc
	return r, nil
}

// start begins the retries.
func (r *punchRetrier) start() {
	work := make(chan peer.ID, 8)
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		defer close(work)
		sched := newPunchSchedule(punchFirstRetry, punchMaxRetry)
		t := time.NewTicker(punchTick)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case now := <-t.C:
				since := r.ready.Load()
				if since == 0 || now.Sub(time.Unix(0, since)) < punchReadyAfter {
					continue
				}
				for _, p := range sched.due(now, acceptedRelayedOnly(r.h)) {
					select {
					case work <- p:
					default: // a punch to every peer queued is under way
					}
				}
			}
		}
	}()
	go func() {
		defer r.wg.Done()
		for p := range work {
			select {
			case <-r.stop:
				continue
			default:
			}
			r.nat.hpRetries.Add(1)
			// An error is the tracer's to count; a punch already under
			// way for p is one.
			_ = r.svc.DirectConnect(p)
		}
	}()
}

// Close stops the service, which ends a punch under way, then the
// retries.
func (r *punchRetrier) Close() error {
	err := r.svc.Close()
	close(r.stop)
	r.wg.Wait()
	return err
}

// acceptedRelayedOnly lists the peers h is connected to only through
// relays, at least one of them a connection the peer opened.
func acceptedRelayedOnly(h host.Host) []peer.ID {
	var out []peer.ID
	for _, p := range h.Network().Peers() {
		accepted := false
		direct := false
		for _, c := range h.Network().ConnsToPeer(p) {
			relayed := c.Stat().Limited || isRelayAddr(c.RemoteMultiaddr())
			direct = direct || !relayed
			accepted = accepted || (relayed && c.Stat().Direction == network.DirInbound)
		}
		if accepted && !direct {
			out = append(out, p)
		}
	}
	return out
}

// publicAddrs returns the addresses a hole punch offers the other side:
// the host's own (as it advertises them) and every address peers observed
// it at, the public ones of them.
func publicAddrs(own func() []ma.Multiaddr, observed func(minObservers int) []ma.Multiaddr) func() []ma.Multiaddr {
	return func() []ma.Multiaddr {
		addrs := append(slices.Clone(own()), observed(1)...)
		return slices.DeleteFunc(ma.Unique(addrs), func(a ma.Multiaddr) bool { return !manet.IsPublicAddr(a) })
	}
}
