package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
	"github.com/workmesh/workmesh/workers/protocol"
)

// startTestStack starts a whole node on loopback, serving workTypes, with
// no API listener; it is closed when the test ends.
func startTestStack(t *testing.T, ctx context.Context, workTypes ...string) (*stack, config.Config) {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	cfg := config.Defaults()
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.Node.API = ""
	cfg.Node.DataDir = t.TempDir()
	cfg.Node.Network = "drain-test"
	cfg.Node.WorkTypes = workTypes
	s, err := startStack(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, cfg
}

// TestStackDrainServesThroughTheGrace: an idle stack that drains keeps
// serving its peers for a second after withdrawing its work types
// (a peer that has not heard yet is answered, not cut off), advertises no
// work type meanwhile, and refuses new work on its own API.
func TestStackDrainServesThroughTheGrace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, cfg := startTestStack(t, ctx, "echo")
	p, _ := startTestStack(t, ctx, "echo")
	if err := p.Node().Host().Connect(ctx, peer.AddrInfo{ID: s.Node().ID(), Addrs: s.Node().Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	client, err := protocol.NewClient(p.Node().Host(), cfg.Node.Network)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	drained := make(chan time.Duration, 1)
	go func() {
		s.Drain(10 * time.Second)
		drained <- time.Since(start)
		s.Close() // as node start does
	}()
	// At once, the record advertises no work type and the node's own API
	// refuses work (neither has an event of its own to wait on).
	for len(s.Node().NodeData().Data.WorkTypes) != 0 || s.Dispatch(ctx, dispatch.WorkRequest{Type: "echo", Payload: []byte("x")}).Error != workers.ErrShuttingDown {
		select {
		case took := <-drained:
			t.Fatalf("drain returned after %s with work types advertised or API work taken", took)
		case <-time.After(time.Millisecond):
		}
	}
	resp, err := client.Do(ctx, s.Node().ID(), protocol.Request{ID: "late", Type: "echo", Payload: []byte("late"), Timeout: 5 * time.Second})
	if err != nil || resp.Outcome != workers.Success || string(resp.Output) != "late" {
		t.Errorf("a peer's request during the grace: %+v %v, want it served", resp, err)
	}
	if took := <-drained; took < time.Second {
		t.Errorf("an idle drain returned after %s, before its grace of a second", took)
	}
}

// TestStackStopSaysWhyItCutARequest: when the drain times out, the stop
// ends a request of the node's own API as a timeout whose error says the
// node stopped, not as a plain missed deadline.
func TestStackStopSaysWhyItCutARequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, _ := startTestStack(t, ctx, "sleep")
	res := make(chan dispatch.WorkResult, 1)
	go func() {
		res <- s.Dispatch(ctx, dispatch.WorkRequest{Type: "sleep", Payload: []byte("20s"), Timeout: 25 * time.Second})
	}()
	// The dispatch has no event of its own: poll for it.
	testkit.WaitFor(t, 10*time.Second, "the sleep request in flight", func() error {
		if s.Dispatcher().InFlight() == 0 {
			return errors.New("no request in flight")
		}
		return nil
	})
	s.Drain(50 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.Status != apiv1.StatusTimeout || !strings.Contains(r.Error, "the node stopped (drain-timeout 50ms passed) before the request ended") {
		t.Errorf("the cut request: %+v, want a timeout saying the node stopped", r)
	}
}
