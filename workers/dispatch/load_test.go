package dispatch

import (
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/workers/protocol"
)

// TestDispatcher_AnswersCarryLoadToRating: the load in a health ping answer
// and the load in a work response both reach the rating of the peer that
// answered; a response without a load leaves it as it was.
func TestDispatcher_AnswersCarryLoadToRating(t *testing.T) {
	a, b := NewFakePeer(nil, "echo"), NewFakePeer(nil, "echo")
	d := testDispatcher(t, config.Defaults(), a, b)
	score := func(p *fakePeer) float64 {
		t.Helper()
		d.sel.Refresh()
		for _, r := range d.sel.Ranking("echo") {
			if r.Peer == string(p.id) {
				return r.Score
			}
		}
		t.Fatalf("%s is not ranked", p.id)
		return 0
	}
	idle := score(a)
	if score(b) != idle {
		t.Fatal("two idle peers score differently")
	}

	// a's health answer: 7 of its 14 places taken.
	d.pollLoad(string(a.id), node.HealthAnswer{Load: node.Load{InFlight: 4, Queued: 3}})
	polled := score(a)
	if polled >= idle || score(b) != idle {
		t.Fatalf("after a's loaded ping answer a scores %v, b %v, idle %v: want a below", polled, score(b), idle)
	}
	// b's work response: all 14 taken.
	d.answerLoad(string(b.id), protocol.Load{InFlight: 4, Queued: 10, Known: true}, time.Now())
	answered := score(b)
	if answered >= polled {
		t.Fatalf("after b's full work response b scores %v, a %v: want b below a", answered, polled)
	}
	// A response that says nothing of load changes nothing; one that says
	// b is idle again brings it back.
	d.answerLoad(string(b.id), protocol.Load{}, time.Now())
	if got := score(b); got != answered {
		t.Errorf("a response without load moved b from %v to %v", answered, got)
	}
	d.answerLoad(string(b.id), protocol.Load{Known: true}, time.Now())
	if got := score(b); got != idle {
		t.Errorf("b's idle response gives %v, want %v", got, idle)
	}
}
