package jsonrpc

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/workertest"
)

// upstreamRequest is what an upstream saw of one request.
type upstreamRequest struct {
	method, uri, host, contentType, accept, auth, body string
}

// recordingUpstream answers every request with result "0x1" (and the
// chain ID and head polls alike), recording what it saw; its answers to
// "sized" come with size bytes of result, their length announced
// (chunked false) or not.
func recordingUpstream(t *testing.T) (*httptest.Server, func() []upstreamRequest, func(size int, chunked bool)) {
	t.Helper()
	var (
		mu      sync.Mutex
		seen    []upstreamRequest
		size    int
		chunked bool
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, upstreamRequest{r.Method, r.RequestURI, r.Host, r.Header.Get("Content-Type"), r.Header.Get("Accept"), r.Header.Get("Authorization"), string(body)})
		n, chunk := size, chunked
		mu.Unlock()
		c, perr := ParseCall(body)
		if perr != nil {
			http.Error(w, perr.Message, http.StatusBadRequest)
			return
		}
		if c.Method != "sized" {
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":"0x1"}`, c.ID)
			return
		}
		out := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":"%s"}`, c.ID, strings.Repeat("a", n))
		if chunk {
			// Flushed in two parts: no Content-Length, a chunked body.
			io.WriteString(w, out[:len(out)/2])
			w.(http.Flusher).Flush()
			io.WriteString(w, out[len(out)/2:])
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(out)))
		io.WriteString(w, out)
	}))
	t.Cleanup(srv.Close)
	get := func() []upstreamRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]upstreamRequest(nil), seen...)
	}
	set := func(n int, c bool) {
		mu.Lock()
		size, chunked = n, c
		mu.Unlock()
	}
	return srv, get, set
}

// Each request reaches the upstream as configured: POST to the URL's path
// and query, its credentials as basic auth, JSON content type and accept,
// the payload as the body; one after the other over the same URL, from
// several goroutines at once (they share the request header).
func TestRelay_UpstreamRequest(t *testing.T) {
	srv, seen, _ := recordingUpstream(t)
	host := strings.TrimPrefix(srv.URL, "http://")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	j, err := New(ctx, config.JSONRPCConfig{Upstream: "http://user:pw@" + host + "/v3/key?tier=1", HeadInterval: time.Hour}, workertest.QuietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			payload := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"eth_getBalance","params":["0xab","latest"]}`, i)
			if r := j.Do(ctx, []byte(payload)); r.Outcome != workers.Success || string(r.Output) != fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":"0x1"}`, i) {
				t.Errorf("request %d: %s %s %s", i, r.Outcome, r.Output, r.Error)
			}
		})
	}
	wg.Wait()
	reqs := seen()
	if len(reqs) != 2+8 { // the chain ID, the head, the 8 requests
		t.Fatalf("upstream saw %d requests, want 10: %+v", len(reqs), reqs)
	}
	bodies := map[string]bool{}
	for _, r := range reqs {
		want := upstreamRequest{http.MethodPost, "/v3/key?tier=1", host, "application/json", "application/json", "Basic dXNlcjpwdw==", r.body}
		if r != want {
			t.Errorf("upstream saw %+v, want %+v", r, want)
		}
		bodies[r.body] = true
	}
	for i := range 8 {
		if b := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"eth_getBalance","params":["0xab","latest"]}`, i); !bodies[b] {
			t.Errorf("the upstream never saw %s", b)
		}
	}
}

// The response bound holds whether the upstream announces the length or
// not: a response of the bound is relayed whole, one byte more is too
// large (PermanentError), both ways.
func TestRelay_ResponseBound(t *testing.T) {
	srv, _, setSize := recordingUpstream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const bound = 64 << 10
	j, err := New(ctx, config.JSONRPCConfig{Upstream: srv.URL, HeadInterval: time.Hour}, workertest.QuietLogger(), WithMaxResponse(bound))
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	frame := len(`{"jsonrpc":"2.0","id":1,"result":""}`)
	for _, chunked := range []bool{false, true} {
		for _, c := range []struct {
			size int
			want workers.Outcome
		}{{1, workers.Success}, {bound - frame, workers.Success}, {bound - frame + 1, workers.PermanentError}, {4 * bound, workers.PermanentError}} {
			setSize(c.size, chunked)
			r := j.Do(ctx, []byte(`{"jsonrpc":"2.0","id":1,"method":"sized","params":[]}`))
			switch {
			case r.Outcome != c.want:
				t.Errorf("chunked %v, %d bytes: outcome %s (%s), want %s", chunked, c.size+frame, r.Outcome, r.Error, c.want)
			case c.want == workers.Success && len(r.Output) != c.size+frame:
				t.Errorf("chunked %v: %d bytes relayed of %d", chunked, len(r.Output), c.size+frame)
			case c.want != workers.Success && !strings.Contains(r.Error, "larger than 65536 bytes"):
				t.Errorf("chunked %v, %d bytes: error %q, want it to name the bound", chunked, c.size+frame, r.Error)
			}
		}
	}
}

// An upstream that redirects (a 307 to its new path, say) is followed as
// Client.Do follows it, the request's body and method intact, whether the
// relay hands requests to its transport directly (a plain client) or
// through Client.Do (a client with a cookie jar).
func TestRelay_UpstreamRedirect(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+string(body))
		mu.Unlock()
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/new", http.StatusTemporaryRedirect)
			return
		}
		c, perr := ParseCall(body)
		if perr != nil {
			http.Error(w, perr.Message, http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":"0x1"}`, c.ID)
	}))
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		opts   []Option
		direct bool
	}{
		{"plain client", nil, true},
		{"client with a cookie jar", []Option{WithClient(&http.Client{Jar: jar})}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			j, err := New(ctx, config.JSONRPCConfig{Upstream: srv.URL + "/old", HeadInterval: time.Hour}, workertest.QuietLogger(), c.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer j.Close()
			if got := j.direct != nil; got != c.direct {
				t.Fatalf("requests straight to the transport: %v, want %v", got, c.direct)
			}
			mu.Lock()
			seen = nil
			mu.Unlock()
			payload := `{"jsonrpc":"2.0","id":9,"method":"eth_getBalance","params":["0xab","latest"]}`
			if r := j.Do(ctx, []byte(payload)); r.Outcome != workers.Success || string(r.Output) != `{"jsonrpc":"2.0","id":9,"result":"0x1"}` {
				t.Fatalf("%s %s %s", r.Outcome, r.Output, r.Error)
			}
			mu.Lock()
			defer mu.Unlock()
			if n := len(seen); n < 2 || seen[n-1] != "POST /new "+payload || seen[n-2] != "POST /old "+payload {
				t.Errorf("upstream saw %q, want the request at /old and then at /new", seen)
			}
		})
	}
}

// Requests skip Client.Do only for a plain client: a cookie jar, a
// client timeout, credentials in the URL or a transport other than
// net/http's keep it.
func TestRelay_DirectTransport(t *testing.T) {
	plain, _ := url.Parse("http://127.0.0.1:1/rpc")
	creds, _ := url.Parse("http://user:pw@127.0.0.1:1/rpc")
	jar, _ := cookiejar.New(nil)
	for _, c := range []struct {
		name string
		c    *http.Client
		u    *url.URL
		want bool
	}{
		{"default transport", &http.Client{}, plain, true},
		{"a transport of its own", &http.Client{Transport: &http.Transport{}}, plain, true},
		{"credentials in the URL", &http.Client{}, creds, false},
		{"cookie jar", &http.Client{Jar: jar}, plain, false},
		{"client timeout", &http.Client{Timeout: time.Second}, plain, false},
		{"other round tripper", &http.Client{Transport: answerInMemory{}}, plain, false},
	} {
		if got := directTransport(c.c, c.u) != nil; got != c.want {
			t.Errorf("%s: direct %v, want %v", c.name, got, c.want)
		}
	}
}
