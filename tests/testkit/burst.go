package testkit

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// BurstServer is an HTTP server on loopback that answers requests in
// bursts of n: each request waits until n of them are in, so that a burst
// holds n connections at once, and then all n get answer. Opened counts
// the connections clients opened to it, to see whether a client kept them
// between bursts.
type BurstServer struct {
	*httptest.Server
	opened atomic.Int64
}

// NewBurstServer starts a BurstServer; it closes when the test ends.
func NewBurstServer(tb testing.TB, n int, answer string) *BurstServer {
	tb.Helper()
	s := &BurstServer{}
	var mu sync.Mutex
	arrived, release := 0, make(chan struct{})
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		arrived++
		wait := release
		if arrived == n {
			arrived, release = 0, make(chan struct{})
			close(wait)
		}
		mu.Unlock()
		<-wait
		_, _ = io.WriteString(w, answer)
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.opened.Add(1)
		}
	}
	s.Start()
	tb.Cleanup(s.Close)
	return s
}

// Opened is how many connections clients opened to the server so far.
func (s *BurstServer) Opened() int64 { return s.opened.Load() }
