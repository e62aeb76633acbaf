package protocol

import (
	"fmt"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"
)

// The work protocol carries one request and its response at a time on a
// stream, and a stream carries requests one after the other:
//
//	Client                                  Server
//	open stream, write request frame  --->  read it (deadline: read timeout)
//	keep the write side open                admit it into the local worker
//	                                  <---  accept frame: only when asked for,
//	                                        and only if the work is not done
//	                                        within the grace period
//	                                  <---  response frame
//	read the response; later, on the
//	same stream, the next request     --->  read it (the stream waited idle)
//	...
//	done with the stream: Close       --->  EOF: the server closes too
//
// A client keeps a few streams per peer open between calls (WithStreamPool)
// so that a request pays neither the stream's opening, the protocol's
// negotiation nor the server's start of a goroutine; a stream that broke
// in any way (reset, timeout, a bad frame) is never used again. A client
// that closes the stream after its first response, as every client did
// when each stream carried one request, is served as before.
//
// The server ends a stream between requests (its idle timeout, its Close,
// a response sent while draining, its bounds on the streams waiting for a
// request, which a new stream waiting for its first is among) by closing
// its write side without a response: it never ends a stream with a FIN while a request it read is
// unanswered, and reads no request after that FIN. So a client that finds
// the end of the stream where a response should begin knows its request
// was not taken, and may send it again on a new stream; any other failure
// leaves it unknown whether the work ran.
//
// While the server drains (Drain), it half-closes after each response and
// holds the stream until the client's Close arrives: the client closes
// once it has read the response and then seen the FIN, so its FIN
// acknowledges the response. A node stops right after its drain, and
// closing a QUIC connection discards what the client has not read yet,
// however long ago it was written.
//
// The client keeps its write side open while it waits because that is how
// the server notices a client that gives up: once the work outlasts the
// grace period, the server keeps one read pending on the stream, and the
// client's Reset (on cancellation) or a lost connection fails that read
// and cancels the work's context. (After a FIN, a later reset is not
// reported by QUIC, so a half-closed client could not be watched.) That
// read is never stopped: once the work is done it is the wait for the next
// request. A client that half-closes anyway is not treated as gone. Bytes
// after the request and before its response are a protocol violation: the
// work is cancelled and the stream reset.
//
// The accept frame serves WorkerResponseTimeout: it lets the client bound
// the time until a worker has taken the work separately from the time the
// work takes. On the hot path it costs nothing: fast work is answered
// within the grace period, and the response itself proves acceptance.
// Neither the accept frame nor the watcher adds a round trip.

// ProtocolID returns the work protocol's ID for a network:
// /workmesh/<network>/work/1.0.0.
func ProtocolID(network string) protocol.ID {
	return protocol.ID("/workmesh/" + network + "/work/1.0.0")
}

func checkNetwork(network string) error {
	if network == "" || strings.ContainsAny(network, "/ \t\r\n") {
		return fmt.Errorf("network name %q: want a non-empty name without '/' or spaces", network)
	}
	return nil
}

// Defaults of the work protocol server.
const (
	// DefaultMaxWorkTime caps the time a server gives one request, whatever
	// the request asks for.
	DefaultMaxWorkTime = 2 * time.Minute
	// DefaultRequestReadTimeout bounds the time to receive a whole request
	// once a stream is open.
	DefaultRequestReadTimeout = 10 * time.Second
	// DefaultGracePeriod is how long the server waits for a result before
	// it watches the client for cancellation and sends the accept frame the
	// client asked for. Work done sooner needs neither.
	DefaultGracePeriod = 2 * time.Millisecond
	// DefaultClientTimeout bounds a client call whose context has no deadline.
	DefaultClientTimeout = 30 * time.Second
	// DefaultMaxIdleStreams is how many streams a client keeps open per
	// peer between calls: well below libp2p's default limits of streams
	// per peer and protocol, which idle streams count against.
	DefaultMaxIdleStreams = 32
	// DefaultClientIdleTimeout is how long a client keeps an unused stream.
	DefaultClientIdleTimeout = 30 * time.Second
	// DefaultServerIdleTimeout is how long a server keeps a stream that
	// waits for its next request: longer than a client's, so that clients
	// close their idle streams themselves.
	DefaultServerIdleTimeout = 90 * time.Second

	// maxMaxIdle bounds the idle streams per peer one can configure.
	maxMaxIdle = 1024

	// writeSlack is added to the work deadline for writing the response, so
	// a response for work that hit its deadline can still be delivered.
	writeSlack = 2 * time.Second
	// defaultAckWait bounds how long a draining server waits for the client
	// to acknowledge a response (see awaitAck).
	defaultAckWait = 2 * time.Second
)
