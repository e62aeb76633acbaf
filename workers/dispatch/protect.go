package dispatch

import (
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/node"
)

// A dispatcher polls every worker it knows, over a connection each, and
// the host's connection manager closes the least useful connections past
// node.ConnHighWater. In a network of a couple of hundred workers that is
// the dispatcher's own: without a word from it, the manager would keep
// closing connections to the workers its requests go to, and each would
// cost a cold connect again. So the dispatcher protects its connections to
// the workers that lead its ranking: the first protectPerType of every
// work type, at most protectMax in all (a share of the low water mark, so
// that the manager keeps room for everything else). The others' polls
// dial again when their connection was trimmed.
const (
	protectTag     = "workmesh-dispatch"
	protectPerType = 16
	protectMax     = node.ConnLowWater / 2
)

// protectLeading brings the connection manager's protection of this
// dispatcher's leading workers up to date with the ranking.
func (d *Dispatcher) protectLeading() {
	cm := d.node.Host().ConnManager()
	self := d.node.ID()
	lead := d.sel.Leading(protectPerType, protectMax)
	next := make(map[peer.ID]bool, len(lead))
	for _, id := range lead {
		p := peer.ID(id)
		if p == self {
			continue
		}
		next[p] = true
		if !d.protected[p] {
			cm.Protect(p, protectTag)
		}
	}
	for p := range d.protected {
		if !next[p] {
			cm.Unprotect(p, protectTag)
		}
	}
	d.protected = next
}

// unprotectAll lifts every protection this dispatcher placed.
func (d *Dispatcher) unprotectAll() {
	cm := d.node.Host().ConnManager()
	for p := range d.protected {
		cm.Unprotect(p, protectTag)
	}
	d.protected = nil
}
