package httpapi

import (
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// DefaultBodyTimeout bounds the time a client may take to send a request
// body (see BodyTimeout).
const DefaultBodyTimeout = 30 * time.Second

// DefaultResponseTimeout bounds the time a client may take to read a
// response once it begins (see ResponseTimeout).
const DefaultResponseTimeout = 30 * time.Second

// Guard refuses what a web page in the operator's browser could make the
// API do, and what no client of the API sends:
//   - a request a browser marks as coming from a page: an Origin header,
//     or Sec-Fetch-Site other than "none" (typed by the user): 403;
//   - when the API has no token (so only loopback reaches it), a Host that
//     is not an address or "localhost" (a DNS name is how a page rebinds
//     its own name to 127.0.0.1): 403;
//   - a body that is not JSON: a request with a body must say
//     Content-Type: application/json, which a page cannot send to another
//     site without the browser asking first (and the API answers no such
//     question): 415.
//
// With a token the Host check is off: a page cannot send the token, and
// an operator may reach the API by a name of their own.
func Guard(token string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); o != "" {
			WriteError(w, http.StatusForbidden, "", "request from a web page (Origin %s) refused: the API takes no requests from browsers", clip(o))
			return
		}
		if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "none" {
			WriteError(w, http.StatusForbidden, "", "request from a web page (Sec-Fetch-Site %s) refused: the API takes no requests from browsers", clip(s))
			return
		}
		if token == "" && !ownHost(r.Host) {
			WriteError(w, http.StatusForbidden, "", "Host %q refused: without an api-token the API answers only to an IP address or localhost", clip(r.Host))
			return
		}
		if hasBody(r) && !isJSON(r.Header.Get("Content-Type")) {
			WriteError(w, http.StatusUnsupportedMediaType, "", "Content-Type %q: send the body as application/json (curl: -H 'Content-Type: application/json')",
				clip(r.Header.Get("Content-Type")))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// isJSON reports whether a Content-Type names application/json, with
// or without parameters.
func isJSON(contentType string) bool {
	if contentType == "application/json" { // as clients send it, read without allocating
		return true
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/json"
}

// ownHost reports whether host (a Host header, with or without a port) is
// an IP address or localhost.
func ownHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	_, err := netip.ParseAddr(host)
	return err == nil
}

// hasBody reports whether r carries a body.
func hasBody(r *http.Request) bool {
	return r.ContentLength > 0 || (r.ContentLength < 0 && r.Body != nil && r.Body != http.NoBody)
}

// clip bounds a value quoted from a request in an error.
func clip(s string) string {
	if len(s) > 100 {
		return s[:100] + "..."
	}
	return s
}

// BodyTimeout gives a client d to send its request body, whatever its
// size, so that a body trickled a byte at a time holds nothing for long:
// the read deadline is set when the handler starts and lifted once the
// body has been read (a handler that then waits for its work is not cut).
func BodyTimeout(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hasBody(r) {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err == nil {
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
		}
		next.ServeHTTP(w, r)
	})
}

// ResponseTimeout gives a client d to take its response, from when the
// response begins, so that a client that stops reading holds the handler
// (its goroutine, its output) for d at most: the write deadline is set at
// the response's status line. Until then the request may wait for its
// work as long as it takes (net/http lifts the deadline once a response
// is done).
func ResponseTimeout(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: d}, r)
	})
}

// deadlineWriter sets the write deadline when the response begins.
type deadlineWriter struct {
	http.ResponseWriter
	rc  *http.ResponseController
	d   time.Duration
	set bool
}

func (w *deadlineWriter) begin() {
	if !w.set {
		w.set = true
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	}
}

func (w *deadlineWriter) WriteHeader(code int) {
	if code >= http.StatusOK { // not an informational answer: the response itself
		w.begin()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	w.begin()
	return w.ResponseWriter.Write(b)
}

// Unwrap gives http.ResponseController the writer underneath.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// deadlineBody lifts the read deadline once the body has been read to
// its end, or failed.
type deadlineBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	lifted bool // Read is not called concurrently (io.Reader's rule)
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !b.lifted {
		b.lifted = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
