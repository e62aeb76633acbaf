package protocol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"

	"github.com/workmesh/workmesh/node/frame"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/workertest"
)

// TestWaitingStreamsBeyondTheBoundsAreClosed: the streams that wait for a
// request, fresh or kept after one, are bounded per peer and in all; beyond
// a bound the one that waited longest is closed, and work on a new stream
// is served throughout. Bounds of 6 in all and 3 per peer: a peer opening
// five silent streams keeps its three newest; a second peer's five leave
// six waiting; two streams of a third peer close the two oldest of all; a
// stream kept after a request counts as one waiting. (Unbounded, a few
// identities holding streams open took every work stream the host allows.)
func TestWaitingStreamsBeyondTheBoundsAreClosed(t *testing.T) {
	p := newPair(t, nil, WithWaitingLimits(6, 3))
	ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
	defer cancel()
	second, third := workertest.NewHost(t), workertest.NewHost(t)
	workertest.Connect(t, second, p.serverHost)
	workertest.Connect(t, third, p.serverHost)

	waiting := func(want int, wantClosed uint64) {
		t.Helper()
		testkit.WaitFor(t, workertest.FailAfter, fmt.Sprintf("%d streams waiting, %d closed for the bounds", want, wantClosed), func() error {
			if st := p.server.Stats(); st.Waiting != want || st.WaitingClosed != wantClosed {
				return fmt.Errorf("%d waiting, %d closed", st.Waiting, st.WaitingClosed)
			}
			return nil
		})
	}
	// open opens a stream from h that sends nothing, once the last one
	// opened is counted (so that the server's order is the opening order).
	var closed uint64
	count := 0
	open := func(h host.Host, closes uint64) network.Stream {
		t.Helper()
		s := rawStream(t, h, p.serverHost)
		_, err := s.Write(nil) // the protocol header only: the handler runs
		workertest.Must(t, err)
		count, closed = count+1-int(closes), closed+closes
		waiting(count, closed)
		return s
	}
	isOpen := func(s network.Stream) bool {
		_ = s.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := s.Read(make([]byte, 1))
		return errors.Is(err, os.ErrDeadlineExceeded)
	}
	served := func(id string) {
		t.Helper()
		resp, err := p.do(t, ctx, Request{ID: id, Type: "echo", Payload: []byte(id)})
		if err != nil || resp.Outcome != workers.Success {
			t.Fatalf("request %s: %v %v %q", id, err, resp.Outcome, resp.Error)
		}
	}

	var first []network.Stream
	for i := range 5 {
		first = append(first, open(p.clientHost, map[bool]uint64{true: 1}[i >= 3]))
	}
	for i, s := range first {
		if got, want := isOpen(s), i >= 2; got != want {
			t.Errorf("the first peer's stream %d open: %t, want %t (its three newest)", i, got, want)
		}
	}
	var others []network.Stream
	for i := range 5 {
		others = append(others, open(second, map[bool]uint64{true: 1}[i >= 3]))
	}
	open(third, 1)
	open(third, 1)
	for i, s := range first {
		if isOpen(s) != (i == 4) {
			t.Errorf("after the third peer's two: the first peer's stream %d open: %t, want only its newest", i, isOpen(s))
		}
	}
	if !isOpen(others[4]) {
		t.Error("the second peer's newest stream was closed")
	}
	// Work on a new stream is served, and its stream, kept, is one more
	// waiting: the oldest of all is closed for it.
	served("meanwhile")
	waiting(6, closed+1)
	_ = first[4].SetReadDeadline(time.Now().Add(workertest.FailAfter))
	if _, err := io.ReadAll(first[4]); err != nil {
		t.Errorf("the oldest waiting stream, closed for a kept one: %v, want a clean end", err)
	}
}

// TestNewStreamClosedBeforeItsRequestIsSentAgain: a worker that closes a
// new stream cleanly without taking its request, as its bounds on waiting
// streams may under a burst, leaves the request not taken, and the client
// sends it once more on another new stream; a worker that closes every
// stream so has the call fail after that one retry. (The client retried
// only kept streams: a burst of 100-150 callers lost 1 to 76 requests.)
func TestNewStreamClosedBeforeItsRequestIsSentAgain(t *testing.T) {
	for _, tc := range []struct {
		name   string
		closes int32 // streams the worker closes before answering
		want   bool  // the call succeeds
	}{{"the first", 1, true}, {"every one", 1 << 30, false}} {
		t.Run(tc.name, func(t *testing.T) {
			clientHost, serverHost := workertest.NewHost(t), workertest.NewHost(t)
			var opened atomic.Int32
			serverHost.SetStreamHandler(ProtocolID(workertest.Network), func(s network.Stream) {
				if opened.Add(1) <= tc.closes {
					_ = s.Close() // not read: not taken
					return
				}
				body, _, err := frame.Read(s, 1<<20, nil)
				if err != nil {
					_ = s.Reset()
					return
				}
				req, err := decodeRequest(body, 1<<20)
				if err != nil {
					_ = s.Reset()
					return
				}
				_ = writeResponse(s, &Response{ID: req.ID, Result: workers.OK(req.Payload)})
				_ = s.Close()
			})
			workertest.Connect(t, clientHost, serverHost)
			client, err := NewClient(clientHost, workertest.Network)
			workertest.Must(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), workertest.FailAfter)
			defer cancel()
			resp, err := client.Do(ctx, serverHost.ID(), Request{ID: "r", Type: "echo", Payload: []byte("x")})
			switch {
			case tc.want && (err != nil || resp.Outcome != workers.Success || string(resp.Output) != "x"):
				t.Errorf("after one new stream closed: %v %v %q, want the echo", err, resp.Outcome, resp.Output)
			case !tc.want && !errors.Is(err, ErrTruncated):
				t.Errorf("with every stream closed: %v, want the request not taken (ErrTruncated)", err)
			}
			if n, want := opened.Load(), int32(2); n != want {
				t.Errorf("%d streams opened, want %d (the first and one retry)", n, want)
			}
		})
	}
}
