package tests

import (
	"fmt"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
)

// A dispatcher has the connection manager keep its connections to the
// workers that lead its ranking, and only to those: a peer that serves no
// work is not protected, and a worker that stops and goes unreachable no
// longer is. When the dispatcher stops, every protection it placed goes.
func TestDispatch_LeadingWorkersConnectionsProtected(t *testing.T) {
	hits := newHitCounter()
	gw := startMember(t, hits, memberSpec{name: "gateway"}, nil)
	echo := map[string]workers.Handler{"echo": echoHandler()}
	w1 := startMember(t, hits, memberSpec{name: "w1", handlers: echo}, gw)
	w2 := startMember(t, hits, memberSpec{name: "w2", handlers: echo}, gw)
	idle := startMember(t, hits, memberSpec{name: "idle"}, gw) // serves nothing
	waitRanked(t, gw, "echo", 2)
	cm := gw.node.Host().ConnManager()
	protected := func(m *member) bool { return cm.IsProtected(m.node.ID(), "workmesh-dispatch") }
	testkit.WaitFor(t, 10*time.Second, "the gateway to protect both workers' connections", func() error {
		if !protected(w1) || !protected(w2) {
			return fmt.Errorf("protected: w1 %v, w2 %v", protected(w1), protected(w2))
		}
		return nil
	})
	if protected(idle) {
		t.Error("a peer that serves no work is protected")
	}
	w2.stop()
	testkit.WaitFor(t, 15*time.Second, "the gateway to lift w2's protection once it is gone", func() error {
		if protected(w2) {
			return fmt.Errorf("w2 still protected; ranking %+v", gw.disp.Selector().Ranking("echo"))
		}
		return nil
	})
	if !protected(w1) {
		t.Error("w1 lost its protection when w2 stopped")
	}
	gw.cancel() // the dispatcher's Run ends
	<-gw.done
	if protected(w1) {
		t.Error("w1 still protected after the dispatcher stopped")
	}
}
