package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

func quietLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// localRequest is a request as a client on the node's machine sends it:
// to 127.0.0.1, with a JSON body when body is not empty.
func localRequest(method, path, body string) *http.Request {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Host = "127.0.0.1:7400"
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	} else {
		r.Body, r.ContentLength = http.NoBody, 0
	}
	return r
}

// testServer mounts a GET route, a POST route and a route that panics.
func testServer(t *testing.T, token string) *Server {
	t.Helper()
	s := New(token, quietLogger())
	for pattern, h := range map[string]http.HandlerFunc{
		"GET /v1/info": func(w http.ResponseWriter, _ *http.Request) {
			_ = WriteJSON(w, http.StatusOK, map[string]string{"peer_id": "p"})
		},
		"POST /v1/work": func(w http.ResponseWriter, _ *http.Request) {
			WriteError(w, http.StatusBadRequest, "type", "type: required")
		},
		"GET /v1/boom": func(http.ResponseWriter, *http.Request) { panic("boom") },
	} {
		if err := s.Handle(pattern, h); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestServerAnswers(t *testing.T) {
	tests := []struct {
		name          string
		token, bearer string
		method, path  string
		code          int
		body          string // the exact body
		allow         string // the Allow header wanted
	}{
		{"mounted route", "", "", "GET", "/v1/info", 200, "{\n  \"peer_id\": \"p\"\n}\n", ""},
		{"error with a field", "", "", "POST", "/v1/work", 400, `{"error":"type: required","field":"type"}` + "\n", ""},
		{"unknown path", "", "", "GET", "/v1/nothing", 404, `{"error":"no such path: /v1/nothing"}` + "\n", ""},
		{"wrong method", "", "", "DELETE", "/v1/info", 405, `{"error":"DELETE /v1/info: method not allowed, want GET, HEAD"}` + "\n", "GET, HEAD"},
		{"wrong method of a POST route", "", "", "GET", "/v1/work", 405, `{"error":"GET /v1/work: method not allowed, want POST"}` + "\n", "POST"},
		{"panic", "", "", "GET", "/v1/boom", 500, `{"error":"internal error"}` + "\n", ""},
		{"token refused", goodToken, "wrong", "GET", "/v1/info", 401, `{"error":"invalid bearer token"}` + "\n", ""},
		{"token missing on an unknown path", goodToken, "", "GET", "/v1/nothing", 401, `{"error":"missing bearer token: send Authorization: Bearer \u003capi-token\u003e"}` + "\n", ""},
		{"token accepted, unknown path", goodToken, goodToken, "GET", "/v1/nothing", 404, `{"error":"no such path: /v1/nothing"}` + "\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := localRequest(tt.method, tt.path, "")
			if tt.bearer != "" {
				r.Header.Set("Authorization", "Bearer "+tt.bearer)
			}
			rec := serve(testServer(t, tt.token), r)
			if rec.Code != tt.code || rec.Body.String() != tt.body {
				t.Errorf("%s %s: %d %q, want %d %q", tt.method, tt.path, rec.Code, rec.Body, tt.code, tt.body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			if got := rec.Header().Get("Allow"); got != tt.allow {
				t.Errorf("Allow %q, want %q", got, tt.allow)
			}
			if tt.code >= 400 {
				var e ErrorBody
				dec := json.NewDecoder(rec.Body)
				dec.DisallowUnknownFields()
				if err := dec.Decode(&e); err != nil || e.Error == "" {
					t.Errorf("body is not an ErrorBody: %v", err)
				}
			}
		})
	}
}

// The mux's redirect to a clean path is not an error and passes through.
func TestServerRedirectPassesThrough(t *testing.T) {
	rec := serve(testServer(t, ""), localRequest("GET", "/v1/../v1/info", ""))
	if rec.Code/100 != 3 || rec.Header().Get("Location") != "/v1/info" {
		t.Errorf("%d, Location %q; want a redirect to /v1/info", rec.Code, rec.Header().Get("Location"))
	}
}

func TestServerHandleRefusesConflicts(t *testing.T) {
	s := testServer(t, "")
	for _, pattern := range []string{"GET /v1/info", "GET /v1/{x}info{", ""} {
		if err := s.Handle(pattern, http.NotFoundHandler()); err == nil {
			t.Errorf("Handle(%q) accepted", pattern)
		}
	}
}

// A started server answers on loopback, and Close stops it.
func TestServerStartClose(t *testing.T) {
	s := testServer(t, "")
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + s.Addr() + "/v1/nothing")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), `"error":"no such path: /v1/nothing"`) {
		t.Errorf("%d %q", resp.StatusCode, body)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := http.Get("http://" + s.Addr() + "/v1/info"); err == nil {
		t.Error("the server still answers after Close")
	}
	if err := New("", quietLogger()).Close(); err != nil {
		t.Errorf("Close of a server never started: %v", err)
	}
}

// A panic with http.ErrAbortHandler aborts the answer rather than being
// answered as a 500.
func TestRecoverPassesAbort(t *testing.T) {
	h := Recover(quietLogger(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }))
	defer func() {
		if v := recover(); !errors.Is(v.(error), http.ErrAbortHandler) {
			t.Errorf("recovered %v, want http.ErrAbortHandler", v)
		}
	}()
	serve(h, httptest.NewRequest("GET", "/", nil))
}

// TestServerGuard: what a web page could make the API do is refused: a
// request with an Origin, one a browser marks as cross-site, a Host that
// is a name (DNS rebinding) when there is no token, a body that is not
// JSON; the same request as the CLI sends it is served.
func TestServerGuard(t *testing.T) {
	tests := []struct {
		name  string
		token string
		edit  func(*http.Request)
		code  int
		want  string
	}{
		{"as the CLI sends it", "", func(*http.Request) {}, 400, "type: required"},
		{"localhost", "", func(r *http.Request) { r.Host = "localhost:7400" }, 400, "type: required"},
		{"IPv6 loopback", "", func(r *http.Request) { r.Host = "[::1]:7400" }, 400, "type: required"},
		{"foreign Origin", "", func(r *http.Request) { r.Header.Set("Origin", "http://198.51.100.7") }, 403, "Origin http://198.51.100.7"},
		{"null Origin", "", func(r *http.Request) { r.Header.Set("Origin", "null") }, 403, "Origin null"},
		{"cross-site fetch", "", func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") }, 403, "Sec-Fetch-Site cross-site"},
		{"rebound name", "", func(r *http.Request) { r.Host = "evil.example:7400" }, 403, `Host "evil.example:7400"`},
		{"a name, with a token", goodToken, func(r *http.Request) {
			r.Host = "api.internal:7400"
			r.Header.Set("Authorization", "Bearer "+goodToken)
		}, 400, "type: required"},
		{"text/plain body", "", func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") }, 415, `Content-Type "text/plain"`},
		{"form body", "", func(r *http.Request) { r.Header.Set("Content-Type", "application/x-www-form-urlencoded") }, 415, "application/json"},
		{"no content type", "", func(r *http.Request) { r.Header.Del("Content-Type") }, 415, `Content-Type ""`},
		{"JSON with a charset", "", func(r *http.Request) { r.Header.Set("Content-Type", "application/json; charset=utf-8") }, 400, "type: required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := localRequest("POST", "/v1/work", `{"type":"echo"}`)
			tt.edit(r)
			rec := serve(testServer(t, tt.token), r)
			var e ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != tt.code || !strings.Contains(e.Error, tt.want) {
				t.Errorf("%d %q, want %d naming %q", rec.Code, rec.Body, tt.code, tt.want)
			}
		})
	}
}

// TestServerBodyTimeout: a body trickled slower than the body timeout is
// cut when the timeout passes; a handler that works longer than the
// timeout after reading its body is not.
// startAndDial starts s on loopback and opens a raw connection to it;
// both are closed when the test ends.
func startAndDial(t *testing.T, s *Server) net.Conn {
	t.Helper()
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func TestServerBodyTimeout(t *testing.T) {
	s := New("", quietLogger(), WithBodyTimeout(300*time.Millisecond))
	read := make(chan error, 1)
	if err := s.Handle("POST /v1/work", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		read <- err
		if err != nil {
			WriteError(w, http.StatusRequestTimeout, "", "body: %v", err)
			return
		}
		time.Sleep(500 * time.Millisecond) // work that outlasts the body timeout
		_ = WriteJSON(w, http.StatusOK, map[string]bool{"done": true})
	})); err != nil {
		t.Fatal(err)
	}
	// A trickle: the headers, then a byte at a time.
	conn := startAndDial(t, s)
	fmt.Fprintf(conn, "POST /v1/work HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for range 50 {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				if _, err := conn.Write([]byte("{")); err != nil {
					return
				}
			}
		}
	}()
	select {
	case err := <-read:
		t.Logf("read: %v after %s", err, time.Since(start))
		if err == nil {
			t.Fatal("the trickled body was read to its end")
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("the trickled body was cut after %s, want about the 300ms timeout", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the trickled body was never cut")
	}

	// A body sent at once, then work longer than the timeout: served.
	resp, err := http.Post("http://"+s.Addr()+"/v1/work", "application/json", strings.NewReader(`{"type":"echo"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Errorf("work after its body: %d %s, want 200", resp.StatusCode, b)
	}
}

// TestServerResponseTimeout: a client that stops reading its response
// holds the handler for the response timeout at most (its write fails),
// and the timeout runs from when the response begins: work that takes
// longer than it, on a connection an earlier response used, is answered.
func TestServerResponseTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	s := New("", quietLogger(), WithResponseTimeout(timeout))
	wrote := make(chan error, 1)
	chunk := make([]byte, 64<<10)
	if err := s.Handle("GET /v1/big", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		var err error
		for i := 0; i < 1024 && err == nil; i++ { // 64 MiB, far beyond what the sockets hold
			_, err = w.Write(chunk)
		}
		wrote <- err
	})); err != nil {
		t.Fatal(err)
	}
	if err := s.Handle("GET /v1/slow", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * timeout) // work that outlasts the response timeout
		_ = WriteJSON(w, http.StatusOK, map[string]bool{"done": true})
	})); err != nil {
		t.Fatal(err)
	}
	// A client that asks and never reads.
	conn := startAndDial(t, s)
	fmt.Fprintf(conn, "GET /v1/big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	start := time.Now()
	select {
	case err := <-wrote:
		t.Logf("write: %v after %s", err, time.Since(start))
		if err == nil {
			t.Fatal("64 MiB written to a client that reads nothing")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler still writes to a client that stopped reading")
	}

	// Two slow answers on one kept-alive connection: each is written.
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	for i := range 2 {
		resp, err := client.Get("http://" + s.Addr() + "/v1/slow")
		if err != nil {
			t.Fatalf("slow request %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"done": true`) {
			t.Fatalf("slow request %d: %d %q %v", i, resp.StatusCode, body, err)
		}
	}
}
