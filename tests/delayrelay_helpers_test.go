package tests

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// delayRelay forwards UDP datagrams between the clients that send to its
// address and one target, on loopback, delaying every datagram by delay in
// each direction: a peer reached through it is 2×delay of round trip away.
// Each direction of each client is one queue with one sender, so the
// goroutines are bounded (two per client, at most maxRelayClients clients,
// plus the front reader), and a full queue drops the datagram, as a
// congested link would. Cleanup stops everything and waits for it.
type delayRelay struct {
	front  *net.UDPConn
	target *net.UDPAddr
	delay  time.Duration
	done   chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex
	clients map[string]*relayClient // by the client's address
	// frozen drops every datagram in both directions, as a path to a
	// frozen or killed process would.
	frozen atomic.Bool
}

const (
	// maxRelayClients bounds the clients (source addresses) a relay serves.
	maxRelayClients = 8
	// relayQueue bounds the datagrams in flight in one direction of one client.
	relayQueue = 4096
)

// relayClient is one client's path through the relay: back is the socket
// that speaks to the target for it.
type relayClient struct {
	addr   *net.UDPAddr
	back   *net.UDPConn
	toward chan delayed // to the target
	from   chan delayed // to the client
}

type delayed struct {
	due time.Time
	b   []byte
}

// startDelayRelay starts a relay on 127.0.0.1 that forwards to target.
func startDelayRelay(t testing.TB, target *net.UDPAddr, delay time.Duration) *delayRelay {
	t.Helper()
	front, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	r := &delayRelay{front: front, target: target, delay: delay, done: make(chan struct{}), clients: map[string]*relayClient{}}
	r.wg.Go(r.readFront)
	t.Cleanup(r.close)
	return r
}

// Port is the relay's UDP port on 127.0.0.1.
func (r *delayRelay) Port() int { return r.front.LocalAddr().(*net.UDPAddr).Port }

func (r *delayRelay) close() {
	close(r.done)
	_ = r.front.Close()
	r.mu.Lock()
	for _, c := range r.clients {
		_ = c.back.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// readFront takes the clients' datagrams and queues them toward the target.
func (r *delayRelay) readFront() {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := r.front.ReadFromUDP(buf)
		if err != nil {
			return // closed
		}
		c := r.client(from)
		if c == nil {
			continue // over the client bound: dropped
		}
		enqueue(c.toward, buf[:n], r.delay)
	}
}

// client returns the path of the client at addr, starting it at its first
// datagram; nil when the relay has as many clients as it serves.
func (r *delayRelay) client(addr *net.UDPAddr) *relayClient {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.clients[addr.String()]; c != nil {
		return c
	}
	select {
	case <-r.done:
		return nil
	default:
	}
	if len(r.clients) >= maxRelayClients {
		return nil
	}
	back, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}, r.target)
	if err != nil {
		return nil
	}
	c := &relayClient{addr: addr, back: back, toward: make(chan delayed, relayQueue), from: make(chan delayed, relayQueue)}
	r.clients[addr.String()] = c
	r.wg.Go(func() { r.send(c.toward, func(b []byte) error { _, err := back.Write(b); return err }) })
	r.wg.Go(func() { r.send(c.from, func(b []byte) error { _, err := r.front.WriteToUDP(b, addr); return err }) })
	r.wg.Go(func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := back.Read(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				select {
				case <-r.done:
					return
				default:
					continue // an ICMP error for a datagram: the next one may pass
				}
			}
			enqueue(c.from, buf[:n], r.delay)
		}
	})
	return c
}

// enqueue queues a copy of b, due delay from now; a full queue drops it.
func enqueue(q chan delayed, b []byte, delay time.Duration) {
	d := delayed{due: time.Now().Add(delay), b: append([]byte(nil), b...)}
	select {
	case q <- d:
	default:
	}
}

// send writes the datagrams of q as each falls due, until the relay closes.
// The delay is the same for every datagram, so the queue is in due order.
func (r *delayRelay) send(q chan delayed, write func([]byte) error) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		var d delayed
		select {
		case d = <-q:
		case <-r.done:
			return
		}
		if wait := time.Until(d.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-r.done:
				timer.Stop()
				return
			}
		}
		if r.frozen.Load() {
			continue
		}
		if err := write(d.b); err != nil && errors.Is(err, net.ErrClosed) {
			return
		}
	}
}
