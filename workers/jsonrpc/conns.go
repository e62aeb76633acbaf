package jsonrpc

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"sync"
	"syscall"
	"time"
)

// maxIdleConns is how many kept-alive connections to the upstream a relay
// keeps: it sends many requests to one host.
const maxIdleConns = 64

// plainConns is the relay's HTTP/1.1 client for a plain-HTTP upstream
// reached without a proxy: kept-alive connections on which a request is
// written and its answer read on the caller's goroutine, with net/http's
// own Request.Write and ReadResponse. net/http's Transport hands every
// request to two goroutines of its own per connection, which costs an
// upstream on loopback about as much as the upstream's answer (about 17 µs
// of 40 per call measured from one caller). Anything else the Transport
// does that a relay needs is here: a connection the upstream closed
// while idle is found before it is used, one whose answer was not read to
// its end or that the upstream asked to close is closed, a deadline or
// cancellation ends the exchange.
type plainConns struct {
	addr   string // host:port
	dialer net.Dialer

	mu     sync.Mutex
	idle   []*plainConn // most recently used last
	closed bool
}

type plainConn struct {
	net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

// newPlainConns returns the plain client for u, or nil when u needs
// net/http's: https, credentials in the URL, a proxy from the
// environment.
func newPlainConns(u *url.URL) *plainConns {
	if u.Scheme != "http" || u.User != nil {
		return nil
	}
	if p, err := http.ProxyFromEnvironment(&http.Request{URL: u}); err != nil || p != nil {
		return nil
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return &plainConns{addr: net.JoinHostPort(u.Hostname(), port), dialer: net.Dialer{KeepAlive: 30 * time.Second}}
}

// get returns an idle connection that is still open, or a new one.
func (p *plainConns) get(ctx context.Context) (*plainConn, error) {
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		pc := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if pc.open() {
			return pc, nil
		}
		pc.Close()
	}
	c, err := p.dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	return &plainConn{Conn: c, br: bufio.NewReader(c), bw: bufio.NewWriter(c)}, nil
}

// open reports whether an idle connection can carry a request: the
// upstream has not closed it (nor sent anything unasked, a 408 before
// closing, say) while it was idle. It looks without waiting: one peek at
// the socket.
func (pc *plainConn) open() bool {
	if pc.br.Buffered() > 0 {
		return false
	}
	sc, ok := pc.Conn.(syscall.Conn)
	if !ok {
		return true // nothing to look with: the exchange finds out
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var (
		buf   [1]byte
		alive bool
	)
	err = rc.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = errors.Is(rerr, syscall.EAGAIN) // nothing to read, not even the end
		return true
	})
	return err == nil && alive
}

// put keeps a connection whose exchange ended cleanly for the next
// request, or closes it when enough are kept or the client is closed.
func (p *plainConns) put(pc *plainConn) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < maxIdleConns {
		p.idle = append(p.idle, pc)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	pc.Close()
}

// close closes the idle connections; connections in use are closed when
// their exchange ends.
func (p *plainConns) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, pc := range idle {
		pc.Close()
	}
}

// aLongTimeAgo is a deadline in the past: it ends a connection's blocked
// read or write at once.
var aLongTimeAgo = time.Unix(1, 0)

// do sends req on a kept-alive connection and reads the answer, at most
// maxResponse bytes (more reports a longer one). redirect reports a 3xx
// answer, which the caller sends again through net/http's client, as the
// Transport's would follow it.
func (p *plainConns) do(ctx context.Context, req *http.Request, maxResponse int) (status int, data []byte, more, redirect bool, err error) {
	pc, err := p.get(ctx)
	if err != nil {
		return 0, nil, false, false, err
	}
	// The context's end (its deadline too) cuts the exchange: the error is
	// then the context's, as the Transport's would be.
	stop := context.AfterFunc(ctx, func() { pc.SetDeadline(aLongTimeAgo) })
	status, data, more, keep, err := pc.exchange(req, maxResponse)
	if !stop() {
		keep = false // the context ended: the deadline is spoiled, the exchange may be cut
		if err != nil && ctx.Err() != nil {
			err = context.Cause(ctx)
		}
	}
	if keep {
		p.put(pc)
	} else {
		pc.Close()
	}
	return status, data, more, status/100 == 3, err
}

// exchange writes req and reads its answer; keep reports that the
// connection is ready for another request.
func (pc *plainConn) exchange(req *http.Request, maxResponse int) (status int, data []byte, more, keep bool, err error) {
	if err := req.Write(pc.bw); err != nil {
		return 0, nil, false, false, err
	}
	if err := pc.bw.Flush(); err != nil {
		return 0, nil, false, false, err
	}
	var resp *http.Response
	for {
		if resp, err = http.ReadResponse(pc.br, req); err != nil {
			return 0, nil, false, false, err
		}
		// An informational answer (100 Continue, 103 Early Hints) comes
		// before the answer; 101 would switch protocols, and is an answer.
		if resp.StatusCode < 100 || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	data, more, err = readAtMost(resp, maxResponse)
	if err != nil || more {
		// The rest of the answer is unread: the connection cannot carry
		// another one.
		return resp.StatusCode, data, more, false, err
	}
	resp.Body.Close()
	return resp.StatusCode, data, false, !resp.Close && resp.StatusCode != http.StatusSwitchingProtocols, nil
}
