package dispatch

import (
	"time"

	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/workers/protocol"
)

// A worker's load reaches the dispatcher in its answers: every work
// response carries the worker's load as it answered, and so does every
// health ping answer. Records are not re-signed and gossiped for load
// changes (what the record says about load is a snapshot from when it was
// signed for another reason); the selection core rates a peer by the
// freshest of the two (selection.Selector.ObserveLoad).

// pollLoad passes the load a health ping answer carried to rating.
func (d *Dispatcher) pollLoad(id string, ans node.HealthAnswer) {
	d.sel.ObserveLoad(id, ans.Load.InFlight+ans.Load.Queued)
}

// answerLoad passes the load a work response that came in at at carried
// to rating; a response without one (an older worker) changes nothing.
func (d *Dispatcher) answerLoad(id string, l protocol.Load, at time.Time) {
	if l.Known {
		d.sel.ObserveLoadAt(id, l.InFlight+l.Queued, at)
	}
}
