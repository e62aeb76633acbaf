package jsonrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/workertest"
)

// connUpstream answers every request with result "0x1" (slow, for the
// method "slow", until release is closed) and counts the connections
// opened and closed.
type connUpstream struct {
	*httptest.Server
	opened, closed atomic.Int64
	closedCh       chan struct{} // one send per closed connection
	release        chan struct{}
}

func newConnUpstream(t *testing.T, setup func(*http.Server)) *connUpstream {
	t.Helper()
	u := &connUpstream{closedCh: make(chan struct{}, 1024), release: make(chan struct{})}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c, perr := ParseCall(body)
		if perr != nil {
			http.Error(w, perr.Message, http.StatusBadRequest)
			return
		}
		switch {
		case r.URL.Path == "/old":
			http.Redirect(w, r, "/new", http.StatusTemporaryRedirect)
			return
		case c.Method == "slow":
			<-u.release
		}
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":"0x1"}`, c.ID)
	}))
	u.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			u.opened.Add(1)
		case http.StateClosed:
			u.closed.Add(1)
			u.closedCh <- struct{}{}
		}
	}
	if setup != nil {
		setup(u.Config)
	}
	u.Start()
	t.Cleanup(func() {
		select {
		case <-u.release:
		default:
			close(u.release)
		}
		u.Close()
	})
	return u
}

func connRelay(t *testing.T, upstream string) *Relay {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	j, err := New(ctx, config.JSONRPCConfig{Upstream: upstream, HeadInterval: time.Hour}, workertest.QuietLogger())
	if err != nil {
		t.Fatal(err)
	}
	if j.plain == nil {
		t.Fatalf("upstream %s: the relay does not use its own connections", upstream)
	}
	t.Cleanup(j.Close)
	return j
}

func doOK(t *testing.T, j *Relay, id int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := j.Do(ctx, fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"eth_getBalance","params":["0xab","latest"]}`, id))
	if want := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":"0x1"}`, id); r.Outcome != workers.Success || string(r.Output) != want {
		t.Fatalf("request %d: %s %s %s, want %s", id, r.Outcome, r.Output, r.Error, want)
	}
}

// waitClosed waits until the upstream has seen n connections closed.
func (u *connUpstream) waitClosed(t *testing.T, n int64) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for u.closed.Load() < n {
		select {
		case <-u.closedCh:
		case <-deadline:
			t.Fatalf("%d connections closed, want %d", u.closed.Load(), n)
		}
	}
}

// One after the other, every request (the start-up ones too) goes over
// one kept-alive connection; Close closes it.
func TestPlainConns_KeepAlive(t *testing.T) {
	u := newConnUpstream(t, nil)
	j := connRelay(t, u.URL)
	for i := range 20 {
		doOK(t, j, i)
	}
	if n := u.opened.Load(); n != 1 {
		t.Fatalf("%d connections for 22 requests one after the other, want 1", n)
	}
	j.Close()
	u.waitClosed(t, 1)
}

// Requests at once each get a connection; no more are opened than were
// ever in use at once, and later requests reuse them.
func TestPlainConns_Concurrent(t *testing.T) {
	u := newConnUpstream(t, nil)
	j := connRelay(t, u.URL)
	const callers = 16
	var wg sync.WaitGroup
	for round := range 5 {
		for c := range callers {
			wg.Go(func() { doOK(t, j, round*100+c) })
		}
		wg.Wait()
	}
	if n := u.opened.Load(); n > callers {
		t.Fatalf("%d connections for %d callers at once, want at most %d", n, callers, callers)
	}
}

// An upstream that closes a connection while it is idle (its idle
// timeout), or asks to close it after each answer: the next request goes
// on a new connection and succeeds.
func TestPlainConns_UpstreamCloses(t *testing.T) {
	t.Run("idle timeout", func(t *testing.T) {
		u := newConnUpstream(t, func(s *http.Server) { s.IdleTimeout = 20 * time.Millisecond })
		j := connRelay(t, u.URL)
		for i := range 3 {
			u.waitClosed(t, int64(i+1)) // the upstream closed the idle one
			doOK(t, j, i)
		}
		if n := u.opened.Load(); n != 4 {
			t.Fatalf("%d connections, want 4 (one per request after each close)", n)
		}
	})
	t.Run("connection close", func(t *testing.T) {
		u := newConnUpstream(t, func(s *http.Server) { s.SetKeepAlivesEnabled(false) })
		j := connRelay(t, u.URL)
		for i := range 5 {
			doOK(t, j, i)
		}
		if n := u.opened.Load(); n != 7 {
			t.Fatalf("%d connections, want 7 (one per request)", n)
		}
	})
}

// A redirect is followed (as net/http's client follows a 307 of a POST);
// a cancelled request ends with the context's error and its connection
// is not reused; the next request works.
func TestPlainConns_RedirectAndCancel(t *testing.T) {
	u := newConnUpstream(t, nil)
	j := connRelay(t, u.URL+"/old")
	doOK(t, j, 1)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan workers.Result, 1)
	go func() { done <- j.Do(ctx, []byte(`{"jsonrpc":"2.0","id":2,"method":"slow","params":[]}`)) }()
	opened := u.opened.Load()
	cancel()
	if r := <-done; r.Outcome != workers.RetryableError || !strings.Contains(r.Error, "no answer") {
		t.Fatalf("cancelled request: %s %s, want a retryable no answer", r.Outcome, r.Error)
	}
	close(u.release)
	doOK(t, j, 3)
	if u.opened.Load() == opened {
		t.Fatal("the request after the cancelled one reused its connection")
	}
}

// A relay refused at start (another chain) leaves no connection open.
func TestPlainConns_RefusedStartCloses(t *testing.T) {
	u := newConnUpstream(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := New(ctx, config.JSONRPCConfig{Upstream: u.URL, ChainID: "5", HeadInterval: time.Hour}, workertest.QuietLogger()); !errors.Is(err, ErrChainIDMismatch) {
		t.Fatalf("start against chain 1 with jsonrpc-chain-id 5: %v, want a mismatch", err)
	}
	u.waitClosed(t, 1)
}
