package httpwork

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
)

// TestHTTPHandler_OwnPortsRefusedWhateverAllowed: with loopback allowed
// (every port), the node's own ports are still refused, on loopback, on
// the unspecified address and on an address of one of its interfaces, and
// after a redirect; other loopback ports are fetched.
func TestHTTPHandler_OwnPortsRefusedWhateverAllowed(t *testing.T) {
	own := newCountingServer(t, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "the node's API") })
	other := newCountingServer(t, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	ownPort := uint16(own.Listener.Addr().(*net.TCPAddr).Port)
	redirect := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, own.URL+"/v1/faults", http.StatusFound)
	})
	urls := []string{
		own.URL + "/v1/faults",
		fmt.Sprintf("http://127.0.0.9:%d/v1/faults", ownPort),
		fmt.Sprintf("http://0.0.0.0:%d/v1/faults", ownPort),
		fmt.Sprintf("http://[::ffff:127.0.0.1]:%d/v1/faults", ownPort),
		redirect.URL,
	}
	allow := []string{"127.0.0.0/8", "::1", "0.0.0.0"}
	// An address of one of this machine's interfaces (a connection to it
	// stays on the machine), when it has one besides loopback.
	if ip, ok := interfaceAddr(t); ok {
		urls = append(urls, "http://"+netip.AddrPortFrom(ip, ownPort).String()+"/v1/faults")
		allow = append(allow, ip.String())
	}
	h, err := New(config.HTTPConfig{Allow: allow, MaxBody: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.ProtectOwnPorts(map[uint16]string{ownPort: "API port"})
	for _, u := range urls {
		payload := fmt.Sprintf(`{"url":%q,"method":"PUT","body":"{\"error_rate\":1}"}`, u)
		r := h.Do(context.Background(), []byte(payload))
		if r.Outcome != workers.PermanentError || !strings.Contains(r.Error, "this node's own API port") || !strings.Contains(r.Error, "destination refused") {
			t.Errorf("%s: %s %q, want a permanent error naming the node's own API port", u, r.Outcome, r.Error)
		}
	}
	if n := own.hits.Load(); n != 0 {
		t.Errorf("the node's own port got %d requests, want 0", n)
	}
	if r := h.Do(context.Background(), []byte(other.URL)); r.Outcome != workers.Success {
		t.Errorf("another loopback port: %s %q, want success", r.Outcome, r.Error)
	}
}

// interfaceAddr returns an IPv4 address of one of this machine's
// interfaces other than loopback.
func interfaceAddr(t *testing.T) (netip.Addr, bool) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Logf("interface addresses: %v", err)
		return netip.Addr{}, false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() && !ip.IsLoopback() {
				return ip.Unmap(), true
			}
		}
	}
	return netip.Addr{}, false
}

// countingServer is a loopback server that counts its hits.
type countingServer struct {
	*httptest.Server
	hits atomic.Int64
}

func newCountingServer(t *testing.T, h http.HandlerFunc) *countingServer {
	t.Helper()
	s := &countingServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// newCountingServerOn is newCountingServer on a given loopback address; it
// skips the test when the address cannot be listened on.
func newCountingServerOn(t *testing.T, addr string, h http.HandlerFunc) *countingServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	s := &countingServer{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		h(w, r)
	}))
	s.Listener.Close()
	s.Listener = ln
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func newHTTP(t *testing.T, allow []string, maxBody int, opts ...Option) *Handler {
	t.Helper()
	h, err := New(config.HTTPConfig{Allow: allow, MaxBody: maxBody}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func doHTTP(h *Handler, payload string) workers.Result {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.Do(ctx, []byte(payload))
}

func decodeHTTP(t *testing.T, r workers.Result) Response {
	t.Helper()
	if r.Outcome != workers.Success {
		t.Fatalf("outcome %s (%s), want success", r.Outcome, r.Error)
	}
	var out Response
	if err := json.Unmarshal(r.Output, &out); err != nil {
		t.Fatalf("output %q: %v", r.Output, err)
	}
	return out
}

func hello(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Internal", "secret-ish")
	io.WriteString(w, "hello")
}

func TestHTTPHandler_LoopbackRefusedUnlessAllowed(t *testing.T) {
	srv := newCountingServer(t, hello)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	byName := "http://localhost:" + strconv.Itoa(port) + "/"

	for _, c := range []struct {
		name  string
		allow []string
		url   string
		want  workers.Outcome
	}{
		{"literal, no allowlist", nil, srv.URL, workers.PermanentError},
		{"literal, other CIDR allowed", []string{"10.0.0.0/8", "localhost"}, srv.URL, workers.PermanentError},
		// The name is resolved and the address it resolves to is checked.
		{"name, no allowlist", nil, byName, workers.PermanentError},
		{"name, only another name allowed", []string{"example.internal"}, byName, workers.PermanentError},
		{"literal, CIDR allowed", []string{"127.0.0.0/8"}, srv.URL, workers.Success},
		{"literal, address allowed", []string{"127.0.0.1"}, srv.URL, workers.Success},
		{"name, host allowed", []string{"localhost"}, byName, workers.Success},
		{"name, CIDRs allowed", []string{"127.0.0.1/32", "::1/128"}, byName, workers.Success},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := srv.hits.Load()
			r := doHTTP(newHTTP(t, c.allow, 1<<10), c.url)
			if r.Outcome != c.want {
				t.Fatalf("outcome %s (%s), want %s", r.Outcome, r.Error, c.want)
			}
			hits := srv.hits.Load() - before
			if c.want != workers.Success {
				if hits != 0 {
					t.Fatalf("refused fetch reached the server %d times", hits)
				}
				if !strings.Contains(r.Error, "loopback address not in http-allow") {
					t.Fatalf("error %q does not say the destination was refused and why", r.Error)
				}
				return
			}
			out := decodeHTTP(t, r)
			if hits != 1 || out.Status != 200 || out.Body != "hello" || out.Headers["Content-Type"] != "text/plain" {
				t.Fatalf("hits %d, response %+v", hits, out)
			}
			if _, ok := out.Headers["X-Internal"]; ok {
				t.Fatalf("unselected header returned: %+v", out.Headers)
			}
		})
	}
}

func TestHTTPHandler_RedirectToRefusedAddress(t *testing.T) {
	// The target listens on another loopback address, which the allowlist
	// does not cover.
	target := newCountingServerOn(t, "127.0.0.2:0", hello)
	front := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/inside", http.StatusFound)
	})
	h := newHTTP(t, []string{"127.0.0.1/32"}, 1<<10)
	r := doHTTP(h, front.URL)
	if r.Outcome != workers.PermanentError || !strings.Contains(r.Error, "127.0.0.2") || !strings.Contains(r.Error, "not in http-allow") {
		t.Fatalf("outcome %s (%s), want a permanent error refusing 127.0.0.2", r.Outcome, r.Error)
	}
	if front.hits.Load() != 1 || target.hits.Load() != 0 {
		t.Fatalf("hits: front %d target %d, want 1 and 0", front.hits.Load(), target.hits.Load())
	}
	// Allowed, the same redirect is followed.
	r = doHTTP(newHTTP(t, []string{"127.0.0.1/32", "127.0.0.2"}, 1<<10), front.URL)
	if out := decodeHTTP(t, r); out.Body != "hello" || !strings.HasSuffix(out.URL, "/inside") || target.hits.Load() != 1 {
		t.Fatalf("allowed redirect: %+v, target hits %d", out, target.hits.Load())
	}
}

func TestHTTPHandler_RedirectFromAllowedNameToRefusedLiteral(t *testing.T) {
	// Both servers are on 127.0.0.1; only the name localhost is allowed,
	// so a redirect to the literal address is refused.
	target := newCountingServer(t, hello)
	front := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL, http.StatusTemporaryRedirect)
	})
	frontByName := "http://localhost:" + strconv.Itoa(front.Listener.Addr().(*net.TCPAddr).Port) + "/"
	r := doHTTP(newHTTP(t, []string{"localhost"}, 1<<10), frontByName)
	if r.Outcome != workers.PermanentError || !strings.Contains(r.Error, "redirect to") || !strings.Contains(r.Error, "loopback") {
		t.Fatalf("outcome %s (%s), want the redirect refused", r.Outcome, r.Error)
	}
	if front.hits.Load() != 1 || target.hits.Load() != 0 {
		t.Fatalf("hits: front %d target %d, want 1 and 0", front.hits.Load(), target.hits.Load())
	}
}

func TestHTTPHandler_RedirectsCapped(t *testing.T) {
	var srv *countingServer
	srv = newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, srv.URL+"/again", http.StatusFound)
	})
	r := doHTTP(newHTTP(t, []string{"127.0.0.1"}, 1<<10), srv.URL)
	if r.Outcome != workers.PermanentError || !strings.Contains(r.Error, "stopped after 5 redirects") {
		t.Fatalf("outcome %s (%s), want a permanent error after 5 redirects", r.Outcome, r.Error)
	}
	if n := srv.hits.Load(); n != 6 {
		t.Fatalf("%d hits, want 6 (the request and 5 redirects)", n)
	}
	// With no redirects followed, the redirect itself is the answer.
	out := decodeHTTP(t, doHTTP(newHTTP(t, []string{"127.0.0.1"}, 1<<10, WithMaxRedirects(0)), srv.URL))
	if out.Status != http.StatusFound || !strings.HasSuffix(out.Headers["Location"], "/again") {
		t.Fatalf("max redirects 0: %+v", out)
	}
}

func TestHTTPHandler_Outcomes(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			io.WriteString(w, strings.Repeat("x", 100))
		case "/binary":
			w.Write([]byte{0xff, 0xfe, 0x00})
		case "/slow":
			select {
			case <-time.After(5 * time.Second):
			case <-r.Context().Done():
			}
		default:
			code := 200
			switch r.URL.Path {
			case "/404":
				code = 404
			case "/400":
				code = 400
			case "/408":
				code = 408
			case "/429":
				code = 429
			case "/500":
				code = 500
			case "/503":
				code = 503
			}
			w.WriteHeader(code)
			io.WriteString(w, "status body")
		}
	})
	h := newHTTP(t, []string{"127.0.0.1"}, 10)
	for path, want := range map[string]workers.Outcome{
		"/ok": workers.Success, "/400": workers.PermanentError, "/404": workers.PermanentError, "/408": workers.RetryableError,
		"/429": workers.Busy, "/500": workers.RetryableError, "/503": workers.RetryableError,
	} {
		r := doHTTP(h, srv.URL+path)
		if r.Outcome != want {
			t.Errorf("%s: outcome %s (%s), want %s", path, r.Outcome, r.Error, want)
		}
		if want != workers.Success && !strings.Contains(r.Error, "GET "+srv.URL+path) {
			t.Errorf("%s: error %q does not name the request", path, r.Error)
		}
	}

	out := decodeHTTP(t, doHTTP(h, srv.URL+"/big"))
	if out.Body != "xxxxxxxxxx" || !out.Truncated {
		t.Fatalf("body over http-max-body: %+v, want 10 bytes and truncated", out)
	}
	big := newHTTP(t, []string{"127.0.0.1"}, 1000, WithMaxOutput(512))
	if r := doHTTP(big, srv.URL+"/big"); r.Outcome != workers.Success {
		t.Fatalf("100 bytes within a 512-byte output: %s (%s)", r.Outcome, r.Error)
	}
	srvBig := newCountingServer(t, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, strings.Repeat("\x01", 200)) })
	if r := doHTTP(big, srvBig.URL); r.Outcome != workers.PermanentError || !strings.Contains(r.Error, "more than the 512") {
		t.Fatalf("200 control bytes (escaped to 1200) in a 512-byte output: %s (%s)", r.Outcome, r.Error)
	}
	out = decodeHTTP(t, doHTTP(h, srv.URL+"/binary"))
	if string(out.BodyB64) != "\xff\xfe\x00" || out.Body != "" {
		t.Fatalf("binary body: %+v, want it in body_b64", out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	r := h.Do(ctx, []byte(srv.URL+"/slow"))
	if r.Outcome != workers.RetryableError || time.Since(start) > 2*time.Second {
		t.Fatalf("slow server: outcome %s (%s) after %s, want retryable at the request's deadline", r.Outcome, r.Error, time.Since(start))
	}
	r = doHTTP(newHTTP(t, []string{"127.0.0.1"}, 10, WithTimeout(100*time.Millisecond)), srv.URL+"/slow")
	if r.Outcome != workers.RetryableError {
		t.Fatalf("slow server past the handler's timeout: outcome %s (%s), want retryable", r.Outcome, r.Error)
	}
}

func TestHTTPHandler_JSONPayload(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"method": r.Method, "x": r.Header.Get("X-Test"), "ua": r.UserAgent(), "body": string(b)})
	})
	h := newHTTP(t, []string{"127.0.0.1"}, 1<<10)
	p, _ := json.Marshal(Request{URL: srv.URL, Method: "POST", Headers: map[string]string{"x-test": "1"}, Body: "ping"})
	out := decodeHTTP(t, doHTTP(h, string(p)))
	var got map[string]string
	if err := json.Unmarshal([]byte(out.Body), &got); err != nil {
		t.Fatal(err)
	}
	if got["method"] != "POST" || got["x"] != "1" || got["body"] != "ping" || got["ua"] != "workmesh" {
		t.Fatalf("server saw %v", got)
	}
	p, _ = json.Marshal(Request{URL: srv.URL, Method: "PUT", Headers: map[string]string{"User-Agent": "me"}, BodyB64: []byte{1, 2}})
	out = decodeHTTP(t, doHTTP(h, string(p)))
	if err := json.Unmarshal([]byte(out.Body), &got); err != nil || got["ua"] != "me" || got["body"] != "\x01\x02" || got["method"] != "PUT" {
		t.Fatalf("server saw %v (%v)", got, err)
	}
}

func TestHTTPHandler_BadPayloads(t *testing.T) {
	h := newHTTP(t, nil, 1<<10)
	for payload, want := range map[string]string{
		"":                            "url is empty",
		"ftp://example.com/":          "scheme",
		"file:///etc/passwd":          "scheme",
		"http://":                     "no host",
		"::bad":                       "url",
		`{"url": 1}`:                  "JSON object",
		`{"url": "http://x", "x": 1}`: "unknown field",
		`{"url": "http://x"} {}`:      "after the JSON object",
		`{"url": "http://x", "method": "CONNECT"}`:                   "method",
		`{"url": "http://x", "method": "get"}`:                       "method",
		`{"url": "http://x", "headers": {"Host": "y"}}`:              "Host",
		`{"url": "http://x", "headers": {"transfer-encoding": "y"}}`: "Transfer-Encoding",
		`{"url": "http://x", "headers": {"a b": "y"}}`:               "HTTP token",
		`{"url": "http://x", "headers": {"A": "y\r\nB: z"}}`:         "single line",
		`{"url": "http://x", "body": "a", "body_b64": "AA=="}`:       "not both",
		"http://x/" + strings.Repeat("a", maxURLLen):                 "longer than",
	} {
		r := doHTTP(h, payload)
		if r.Outcome != workers.PermanentError || !strings.Contains(r.Error, want) {
			t.Errorf("payload %.40q: outcome %s (%s), want a permanent error saying %q", payload, r.Outcome, r.Error, want)
		}
	}
	if _, err := New(config.HTTPConfig{MaxBody: 0}); err == nil {
		t.Error("http-max-body 0 accepted")
	}
	if _, err := New(config.HTTPConfig{MaxBody: 1, Allow: []string{"not a host"}}); err == nil || !strings.Contains(err.Error(), "http-allow entry 1") {
		t.Errorf("bad http-allow entry: %v", err)
	}
}

func TestHTTPHandler_PasswordNotShown(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) })
	u, _ := url.Parse(srv.URL)
	u.User = url.UserPassword("user", "hunter2")
	r := doHTTP(newHTTP(t, []string{"127.0.0.1"}, 1<<10), u.String())
	if r.Outcome != workers.RetryableError || strings.Contains(r.Error, "hunter2") {
		t.Fatalf("outcome %s, error %q: want retryable without the password", r.Outcome, r.Error)
	}
}

// TestHTTPHandler_CustomServicesRefusedWhateverAllowed: the local
// services of the node's custom work types are never fetched through the
// http type, on their address, on another address of this machine at
// their port, or after a redirect; other loopback ports still are.
func TestHTTPHandler_CustomServicesRefusedWhateverAllowed(t *testing.T) {
	svc := newCountingServer(t, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "the operator's service") })
	other := newCountingServer(t, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	port := uint16(svc.Listener.Addr().(*net.TCPAddr).Port)
	redirect := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, svc.URL+"/enrich", http.StatusFound)
	})
	h, err := New(config.HTTPConfig{Allow: []string{"127.0.0.0/8", "::1", "0.0.0.0"}, MaxBody: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.ProtectServices(map[string]string{svc.Listener.Addr().String(): "the service of custom work type enrich"})
	for _, u := range []string{
		svc.URL + "/enrich",
		fmt.Sprintf("http://127.0.0.9:%d/enrich", port),
		fmt.Sprintf("http://0.0.0.0:%d/enrich", port),
		redirect.URL,
	} {
		r := h.Do(context.Background(), []byte(u))
		if r.Outcome != workers.PermanentError || !strings.Contains(r.Error, "custom work type enrich") || !strings.Contains(r.Error, "destination refused") {
			t.Errorf("%s: %s %q, want a refusal naming the custom type's service", u, r.Outcome, r.Error)
		}
	}
	if n := svc.hits.Load(); n != 0 {
		t.Errorf("the service got %d requests through the http type, want 0", n)
	}
	if r := h.Do(context.Background(), []byte(other.URL)); r.Outcome != workers.Success {
		t.Errorf("another loopback port: %s %q, want success", r.Outcome, r.Error)
	}
}

// TestHTTPHandler_BinaryBodyNotInflatedPastTheLimit: an 800 KB binary body
// is within the 1 MiB result limit, so it is served, though its base64
// in the output is larger than 1 MiB; a body over max-result fails
// clearly.
func TestHTTPHandler_BinaryBodyNotInflatedPastTheLimit(t *testing.T) {
	body := make([]byte, 800_000)
	for i := range body {
		body[i] = byte(i*7+i/251) | 0x80 // not UTF-8
	}
	srv := newCountingServer(t, func(w http.ResponseWriter, _ *http.Request) { w.Write(body) })
	h, err := New(config.HTTPConfig{Allow: []string{"127.0.0.1"}, MaxBody: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	r := h.Do(context.Background(), []byte(srv.URL))
	if r.Outcome != workers.Success {
		t.Fatalf("800 KB binary body: %s %q, want success", r.Outcome, r.Error)
	}
	var resp Response
	if err := json.Unmarshal(r.Output, &resp); err != nil || len(resp.BodyB64) != len(body) || len(r.Output) <= workers.DefaultMaxPayload {
		t.Fatalf("output of %d bytes, body %d bytes (%v), want the whole body in base64 past 1 MiB", len(r.Output), len(resp.BodyB64), err)
	}
	small, err := New(config.HTTPConfig{Allow: []string{"127.0.0.1"}, MaxBody: 1 << 20}, WithMaxResult(500_000))
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	if r := small.Do(context.Background(), []byte(srv.URL)); r.Outcome != workers.PermanentError || !strings.Contains(r.Error, "max-result") {
		t.Fatalf("body over max-result: %s %q", r.Outcome, r.Error)
	}
}

// With WithConcurrency, a fetch keeps its connection open for every fetch
// that can run at once: bursts of that many concurrent fetches of one host
// reuse the connections of the first.
func TestHTTPHandler_KeepsAConnectionPerConcurrentFetch(t *testing.T) {
	const fetches = 16
	srv := testkit.NewBurstServer(t, fetches, "hello")
	h := newHTTP(t, []string{"127.0.0.0/8"}, 1<<10, WithConcurrency(fetches))
	for burst := range 3 {
		var wg sync.WaitGroup
		for range fetches {
			wg.Go(func() {
				if r := doHTTP(h, srv.URL); r.Outcome != workers.Success {
					t.Errorf("burst %d: %v %q", burst, r.Outcome, r.Error)
				}
			})
		}
		wg.Wait()
	}
	if n := srv.Opened(); n != fetches {
		t.Fatalf("3 bursts of %d concurrent fetches opened %d connections, want %d (one per fetch under way, kept between bursts)", fetches, n, fetches)
	}
}
