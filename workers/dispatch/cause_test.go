package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/quic-go/quic-go"

	"github.com/workmesh/workmesh/workers/protocol"
)

// TestAttemptCauseTyped feeds attemptCause the error values libp2p and
// quic-go return, wrapped as the work protocol and connect wrap them.
func TestAttemptCauseTyped(t *testing.T) {
	pid := peer.ID("12D3KooWfake")
	addr := ma.StringCast("/ip4/127.0.0.1/udp/9/quic-v1")
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"libp2p stream reset over a quic stream error", fmt.Errorf("work sha256 for x: read response: %w",
			&network.StreamError{ErrorCode: 0, TransportError: &quic.StreamError{StreamID: 4, ErrorCode: 0}}), causeConnLost},
		{"libp2p conn closed", fmt.Errorf("read: %w", &network.ConnError{Remote: true, TransportError: &quic.ApplicationError{ErrorCode: 0}}), causeConnLost},
		{"bare ErrReset", fmt.Errorf("write request: %w", network.ErrReset), causeConnLost},
		{"quic application error", fmt.Errorf("open stream: %w", &quic.ApplicationError{ErrorCode: 0, Remote: true}), causeConnLost},
		{"quic stream error", &quic.StreamError{StreamID: 8, ErrorCode: 1, Remote: true}, causeConnLost},
		{"quic idle timeout", fmt.Errorf("read response: %w", &quic.IdleTimeoutError{}), causeConnLost},
		{"quic stateless reset", &quic.StatelessResetError{}, causeConnLost},
		{"deadline", fmt.Errorf("work echo for x: %w (%v)", context.DeadlineExceeded, network.ErrReset), "no answer in time"},
		{"accept timeout", fmt.Errorf("work echo for x: %w: nothing within 1s (stream reset)", protocol.ErrAcceptTimeout), protocol.ErrAcceptTimeout.Error()},
		{"truncated", fmt.Errorf("read response: stream closed without a response: %w", protocol.ErrTruncated), "the worker closed the stream without an answer"},
		{"dial: handshake timeout", &dialError{timeout: time.Second, err: &swarm.DialError{Peer: pid,
			DialErrors: []swarm.TransportError{{Address: addr, Cause: &quic.HandshakeTimeoutError{}}}}}, "unreachable: no answer within 1s"},
		{"dial: deadline", &dialError{timeout: 2 * time.Second, err: &swarm.DialError{Peer: pid, Cause: context.DeadlineExceeded}}, "unreachable: no answer within 2s"},
		{"dial: refused", &dialError{timeout: time.Second, err: &swarm.DialError{Peer: pid,
			DialErrors: []swarm.TransportError{{Address: addr, Cause: &quic.TransportError{ErrorCode: quic.ConnectionRefused, Remote: true}}}}}, "unreachable: connection refused"},
		{"dial: backoff", &dialError{timeout: time.Second, err: fmt.Errorf("%w: %w", swarm.ErrDialBackoff, errors.New("x"))}, "unreachable: a dial just failed, not dialing again yet"},
		{"dial: no addresses", &dialError{timeout: time.Second, err: &swarm.DialError{Peer: pid, Cause: swarm.ErrNoAddresses}}, "unreachable: no address known to dial"},
		{"dial below the dispatcher", fmt.Errorf("open stream: %w", &swarm.DialError{Peer: pid, Cause: swarm.ErrNoAddresses}), "unreachable: no address known to dial"},
		{"other, several lines", errors.New("first\n  * second"), "first; * second"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := attemptCause(tc.err); got != tc.want {
				t.Errorf("attemptCause(%q) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

// newLoopbackHost starts a libp2p host on a loopback QUIC port.
func newLoopbackHost(t *testing.T) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/udp/0/quic-v1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestAttemptCauseReal makes the errors happen between real hosts on
// loopback: a dial to a port nobody listens on, a stream the other side
// resets, and a peer that closes its host while a read waits.
func TestAttemptCauseReal(t *testing.T) {
	const proto = "/workmesh-test/cause/1"
	a, b := newLoopbackHost(t), newLoopbackHost(t)
	b.SetStreamHandler(proto+"/reset", func(s network.Stream) { s.Reset() })
	held := make(chan network.Stream, 1)
	b.SetStreamHandler(proto+"/hold", func(s network.Stream) { held <- s })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("dial of a dead port", func(t *testing.T) {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		pc.Close()
		c := newLoopbackHost(t)
		dead := peer.AddrInfo{ID: c.ID(), Addrs: []ma.Multiaddr{ma.StringCast(fmt.Sprintf("/ip4/127.0.0.1/udp/%d/quic-v1", port))}}
		const timeout = 500 * time.Millisecond
		dctx, dcancel := context.WithTimeout(ctx, timeout)
		defer dcancel()
		err = a.Connect(dctx, dead)
		if err == nil {
			t.Fatal("dial of a dead port succeeded")
		}
		got := attemptCause(&dialError{timeout: timeout, err: err})
		if !strings.HasPrefix(got, causeUnreachable+": ") || strings.Contains(got, "\n") || strings.Contains(got, "failed to dial") {
			t.Errorf("attemptCause(%q) = %q, want one line \"unreachable: <cause>\"", err, got)
		}
		t.Logf("%q -> %q", err, got)
	})

	if err := a.Connect(ctx, peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		t.Fatal(err)
	}
	t.Run("stream reset by the worker", func(t *testing.T) {
		s, err := a.NewStream(ctx, b.ID(), proto+"/reset")
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadAll(s)
		if err == nil {
			t.Fatal("read of a reset stream succeeded")
		}
		if got := attemptCause(fmt.Errorf("work echo for x: read response: %w", err)); got != causeConnLost {
			t.Errorf("attemptCause(%q) = %q, want %q", err, got, causeConnLost)
		}
	})
	t.Run("worker gone while the answer is awaited", func(t *testing.T) {
		s, err := a.NewStream(ctx, b.ID(), proto+"/hold")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		<-held
		b.Close()
		_, err = io.ReadAll(s)
		if err == nil {
			t.Fatal("read from a closed host succeeded")
		}
		if got := attemptCause(fmt.Errorf("work echo for x: read response: %w", err)); got != causeConnLost {
			t.Errorf("attemptCause(%q) = %q, want %q", err, got, causeConnLost)
		}
	})
}
