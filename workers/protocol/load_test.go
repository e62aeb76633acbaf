package protocol

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/workmesh/workmesh/node/frame"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/workertest"
)

// TestCodec_ResponseCarriesLoad: a response with the server's load comes
// back with it; one without (kind 0x03) comes back with the load unknown.
func TestCodec_ResponseCarriesLoad(t *testing.T) {
	for _, want := range []Response{
		{ID: "a", Result: workers.OK([]byte("out")), Load: Load{InFlight: 3, Queued: 70000, Known: true}},
		{ID: "b", Result: workers.OK([]byte("out"))},
	} {
		body, _, err := frame.Read(bytes.NewReader(appendResponse(nil, &want)), frameLimit(workers.DefaultMaxPayload), nil)
		workertest.Must(t, err)
		got, _, err := decodeServerFrame(body, workers.DefaultMaxPayload)
		workertest.Must(t, err)
		if got.ID != want.ID || got.Load != want.Load || string(got.Output) != "out" {
			t.Errorf("round trip of %+v: got %+v", want, got)
		}
	}
}

// TestProtocol_ResponseCarriesServerLoad: the server's answer says how many
// requests it has running, so that the dispatcher learns a worker's load
// from its answers rather than from gossip.
func TestProtocol_ResponseCarriesServerLoad(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	p := newPair(t, map[string]workers.Handler{
		"hold": workers.HandlerFunc(func(ctx context.Context, _ []byte) workers.Result {
			started <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return workers.OK(nil)
		}),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := p.client.Do(ctx, p.serverHost.ID(), Request{ID: "hold", Type: "hold"})
			done <- err
		}()
	}
	for range 2 {
		workertest.Recv(t, started, "a held request to start")
	}
	resp, err := p.do(t, ctx, Request{ID: "e", Type: "echo", Payload: []byte("x")})
	workertest.Must(t, err)
	if !resp.Load.Known || resp.Load.InFlight < 2 || resp.Load.InFlight > 3 {
		t.Errorf("response load %+v with 2 requests held, want 2 or 3 in flight", resp.Load)
	}
	close(release)
	for range 2 {
		workertest.Must(t, workertest.Recv(t, done, "a held request to end"))
	}
}
