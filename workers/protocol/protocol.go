package protocol

import (
	"fmt"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"
)

// The work protocol carries one request and its response per stream.
//
//	Client                                  Server
//	open stream, write request frame  --->  read it (deadline: read timeout)
//	keep the write side open                admit it into the local worker
//	                                  <---  accept frame: only when asked for,
//	                                        and only if the work is not done
//	                                        within the grace period
//	                                  <---  response frame, then Close
//	read the response, Close
//
// While the server drains (Drain), it half-closes after the response and
// holds the stream until the client's Close arrives: the client closes
// only after reading the response, so its FIN acknowledges it. A node
// stops right after its drain, and closing a QUIC connection discards
// what the client has not read yet, however long ago it was written.
//
// The client keeps its write side open while it waits because that is how
// the server notices a client that gives up: once the work outlasts the
// grace period, the server keeps one read pending on the stream, and the
// client's Reset (on cancellation) or a lost connection fails that read
// and cancels the work's context. (After a FIN, a later reset is not
// reported by QUIC, so a half-closed client could not be watched.) A client
// that half-closes anyway is not treated as gone. Bytes after the request
// are a protocol violation: the work is cancelled and the stream reset.
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

	// writeSlack is added to the work deadline for writing the response, so
	// a response for work that hit its deadline can still be delivered.
	writeSlack = 2 * time.Second
	// defaultAckWait bounds how long a draining server waits for the client
	// to acknowledge a response (see awaitAck).
	defaultAckWait = 2 * time.Second
	// stopWait is how long a draining server's watchdog.stop waits for the
	// read to end by its deadline before it closes the read side. Only a
	// transport that ignores deadlines (mocknet) waits it out.
	stopWait = time.Second
)
