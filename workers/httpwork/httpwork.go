package httpwork

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
)

// Type is the name of the http work type.
const Type = "http"

// Defaults and bounds of the http work type.
const (
	// DefaultMaxRedirects is how many redirects a fetch follows.
	DefaultMaxRedirects = 5
	// DefaultTimeout bounds one fetch when the request's own deadline
	// is later or missing.
	DefaultTimeout = 30 * time.Second
	// maxURLLen, maxHTTPHeaders and maxHTTPHeaderLen bound a payload's
	// request line and headers.
	maxURLLen        = 8 << 10
	maxHTTPHeaders   = 64
	maxHTTPHeaderLen = 8 << 10
	// maxErrorBody is how much of an error response's body a message quotes.
	maxErrorBody = 200
)

// errTooManyRedirects marks a fetch stopped by the redirect limit.
var errTooManyRedirects = errors.New("too many redirects")

// Request is the JSON form of an http payload, for more than a GET.
// A payload that is not a JSON object is taken as a URL to GET.
type Request struct {
	// URL is the http:// or https:// address to fetch; required.
	URL string `json:"url"`
	// Method is the HTTP method; empty means GET.
	Method string `json:"method,omitempty"`
	// Headers are sent with the request (one value each).
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the request body as text.
	Body string `json:"body,omitempty"`
	// BodyB64 is the request body as bytes (base64 in JSON); it excludes Body.
	BodyB64 []byte `json:"body_b64,omitempty"`
}

// Response is the output of the http work type, in JSON.
type Response struct {
	// Status is the HTTP status code of the final response.
	Status int `json:"status"`
	// URL is the address the final response came from, after redirects,
	// with any password removed.
	URL string `json:"url"`
	// Headers are the selected response headers (ResponseHeaders),
	// multiple values joined by ", ".
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the response body when it is valid UTF-8.
	Body string `json:"body,omitempty"`
	// BodyB64 is the response body when it is not valid UTF-8.
	BodyB64 []byte `json:"body_b64,omitempty"`
	// Truncated is true when the body was cut at http-max-body bytes.
	Truncated bool `json:"truncated,omitempty"`
}

// ResponseHeaders are the response headers the http work type
// returns; the others are left out, as they describe the connection more
// than the resource.
var ResponseHeaders = []string{
	"Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language", "Content-Length",
	"Content-Type", "Date", "ETag", "Expires", "Last-Modified", "Location", "Retry-After",
}

// refusedHeaders may not be set by a payload: the client manages them, and
// letting a caller set them would only smuggle or confuse.
var refusedHeaders = map[string]bool{
	"Connection": true, "Content-Length": true, "Host": true, "Keep-Alive": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Te": true, "Trailer": true,
	"Transfer-Encoding": true, "Upgrade": true,
}

// httpMethods are the methods a payload may use.
var httpMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

// Handler is the http work type: it fetches a URL and returns the
// status, selected headers and body. It refuses to connect to loopback,
// private, link-local and other special addresses unless http-allow lists
// the host or a CIDR covering the address (on every port, or on the one
// the entry names), and it never connects to the node's own ports
// (ProtectOwnPorts), whatever http-allow lists; the checks are made on the
// address actually dialed, so they hold after DNS resolution (and against
// DNS rebinding) and after every redirect.
type Handler struct {
	client    *http.Client
	allow     httpAllow
	own       ownPorts
	services  services
	maxBody   int
	maxOutput int
	maxResult int
	timeout   time.Duration
	agent     string
}

var _ workers.Handler = (*Handler)(nil)

type options struct {
	maxRedirects int
	maxOutput    int
	maxResult    int
	timeout      time.Duration
	agent        string
	concurrency  int
}

// Option adjusts an Handler.
type Option func(*options) error

// WithMaxRedirects sets how many redirects a fetch follows (default
// DefaultMaxRedirects; 0 returns the redirect itself).
func WithMaxRedirects(n int) Option {
	return func(o *options) error {
		if n < 0 || n > 20 {
			return fmt.Errorf("http work type: max redirects %d: want 0 to 20", n)
		}
		o.maxRedirects = n
		return nil
	}
}

// WithMaxOutput bounds the encoded output, in bytes (default
// workers.WireLimit of the default limits, what the work protocol
// carries): the wire leaves room for a body within max-result to encode
// larger (base64, JSON escapes); an output past even that is refused with
// a clear error rather than failing on the wire.
func WithMaxOutput(n int) Option {
	return func(o *options) error {
		if n < 256 {
			return fmt.Errorf("http work type: max output %d bytes: want at least 256", n)
		}
		o.maxOutput = n
		return nil
	}
}

// WithMaxResult bounds a response body, in raw bytes (default
// workers.DefaultMaxPayload, max-result): a body over it fails clearly.
// The limit is of the body itself, not of its encoding in the output.
func WithMaxResult(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("http work type: max result %d bytes: want at least 1", n)
		}
		o.maxResult = n
		return nil
	}
}

// WithTimeout bounds one fetch when the request's deadline is later or
// missing (default DefaultTimeout).
func WithTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("http work type: timeout %s: want more than 0", d)
		}
		o.timeout = d
		return nil
	}
}

// WithConcurrency says how many fetches can run at once (the node's
// local-concurrency): that many connections to one host stay open between
// fetches (at least 4), so that a steady load on one site reuses them
// rather than closing and opening again those over the idle limit.
func WithConcurrency(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("http work type: concurrency %d: want at least 1", n)
		}
		o.concurrency = n
		return nil
	}
}

// WithUserAgent sets the User-Agent sent when the payload sets none
// (default "workmesh").
func WithUserAgent(ua string) Option {
	return func(o *options) error {
		if ua == "" || strings.ContainsAny(ua, "\r\n\x00") {
			return fmt.Errorf("http work type: user agent %q: want a non-empty single line", ua)
		}
		o.agent = ua
		return nil
	}
}

// New returns the http work type configured by cfg (http-allow,
// http-max-body). It refuses an http-allow entry that is neither a CIDR,
// an IP address, a host name nor "*." followed by a domain.
func New(cfg config.HTTPConfig, opts ...Option) (*Handler, error) {
	o := options{maxRedirects: DefaultMaxRedirects, maxOutput: workers.WireLimit(workers.DefaultMaxPayload, workers.DefaultMaxPayload),
		maxResult: workers.DefaultMaxPayload, timeout: DefaultTimeout, agent: "workmesh"}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if cfg.MaxBody < 1 {
		return nil, fmt.Errorf("http work type: http-max-body %d: want at least 1", cfg.MaxBody)
	}
	allow, err := parseHTTPAllow(cfg.Allow)
	if err != nil {
		return nil, fmt.Errorf("http work type: %w", err)
	}
	h := &Handler{allow: allow, maxBody: cfg.MaxBody, maxOutput: o.maxOutput, maxResult: o.maxResult, timeout: o.timeout, agent: o.agent}
	transport := &http.Transport{
		// No proxy, ever: a proxy would dial for us and the address check
		// below would see only the proxy.
		Proxy:             nil,
		DialContext:       h.dial,
		ForceAttemptHTTP2: true,
		// Room for every fetch that can run at once to find its host's
		// connection open again (WithConcurrency).
		MaxIdleConns:          max(64, o.concurrency),
		MaxIdleConnsPerHost:   max(4, o.concurrency),
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	maxRedirects := o.maxRedirects
	h.client = &http.Client{
		Transport: transport,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if maxRedirects == 0 {
				return http.ErrUseLastResponse
			}
			if len(via) > maxRedirects {
				return fmt.Errorf("stopped after %d redirects: %w", maxRedirects, errTooManyRedirects)
			}
			if s := req.URL.Scheme; s != "http" && s != "https" {
				return fmt.Errorf("redirect to %s: scheme %q: want http or https: %w", req.URL.Redacted(), s, ErrDestinationRefused)
			}
			// A literal address is refused here already, with the redirect
			// named; names are checked when dialed, like every address.
			if err := h.checkLiteral(req.URL); err != nil {
				return fmt.Errorf("redirect to %s: %w", req.URL.Redacted(), err)
			}
			return nil
		},
	}
	return h, nil
}

// Traits of the http type: a fetch may change what it reaches (a POST, a
// PUT), so it is never hedged, and a resource may change between two
// fetches, so it is not deterministic.
var Traits = workers.Traits{}

// Traits returns the http type's Traits.
func (h *Handler) Traits() workers.Traits { return Traits }

// Close releases the handler's idle connections.
func (h *Handler) Close() { h.client.CloseIdleConnections() }

// Do fetches the payload's URL and returns an Response in JSON. A 5xx
// status, a timeout or a network failure is a RetryableError; 429 is Busy
// (the target limits this node, another may get through); 408 is
// retryable; other 4xx are a PermanentError, as is a refused destination,
// a redirect loop and an invalid payload.
func (h *Handler) Do(ctx context.Context, payload []byte) workers.Result {
	in, err := parseHTTPPayload(payload)
	if err != nil {
		return workers.Fail(workers.PermanentError, "http: payload: %v", err)
	}
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > h.timeout {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.timeout)
		defer cancel()
	}
	var body io.Reader
	switch {
	case in.BodyB64 != nil:
		body = bytes.NewReader(in.BodyB64)
	case in.Body != "":
		body = strings.NewReader(in.Body)
	}
	req, err := http.NewRequestWithContext(ctx, in.Method, in.URL, body)
	if err != nil {
		return workers.Fail(workers.PermanentError, "http: payload: %v", err)
	}
	shown := in.Method + " " + req.URL.Redacted()
	req.Header.Set("User-Agent", h.agent)
	for k, v := range in.Headers {
		req.Header.Set(k, v)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return fetchFailure(ctx, shown, err)
	}
	defer resp.Body.Close()
	data, truncated, err := ReadAtMost(resp.Body, h.maxBody)
	if err != nil {
		if ctx.Err() != nil {
			return workers.Fail(workers.RetryableError, "http: %s: reading the body: %v", shown, context.Cause(ctx))
		}
		return workers.Fail(workers.RetryableError, "http: %s: reading the body: %v", shown, err)
	}
	switch code := resp.StatusCode; {
	case code == http.StatusTooManyRequests:
		return workers.Fail(workers.Busy, "http: %s: %s%s", shown, resp.Status, QuoteBody(data))
	case code >= 500, code == http.StatusRequestTimeout:
		return workers.Fail(workers.RetryableError, "http: %s: %s%s", shown, resp.Status, QuoteBody(data))
	case code >= 400:
		return workers.Fail(workers.PermanentError, "http: %s: %s%s", shown, resp.Status, QuoteBody(data))
	}
	out := Response{Status: resp.StatusCode, URL: resp.Request.URL.Redacted(), Truncated: truncated}
	for _, name := range ResponseHeaders {
		if vs := resp.Header.Values(name); len(vs) > 0 {
			if out.Headers == nil {
				out.Headers = make(map[string]string)
			}
			out.Headers[name] = strings.Join(vs, ", ")
		}
	}
	if len(data) > h.maxResult {
		return workers.Fail(workers.PermanentError, "http: %s: the body of %d bytes is more than the %d a result may carry (max-result; lower http-max-body)",
			shown, len(data), h.maxResult)
	}
	if utf8.Valid(data) {
		out.Body = string(data)
	} else {
		out.BodyB64 = data
	}
	enc, err := json.Marshal(out)
	if err != nil {
		return workers.Fail(workers.PermanentError, "http: %s: encode the response: %v", shown, err)
	}
	if len(enc) > h.maxOutput {
		return workers.Fail(workers.PermanentError, "http: %s: the response encodes to %d bytes, more than the %d a result may carry (lower http-max-body)",
			shown, len(enc), h.maxOutput)
	}
	return workers.OK(enc)
}

// fetchFailure classifies an error of http.Client.Do.
func fetchFailure(ctx context.Context, shown string, err error) workers.Result {
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	switch {
	case errors.Is(err, ErrDestinationRefused):
		return workers.Fail(workers.PermanentError, "http: %s: %v", shown, UnwrapURLError(err))
	case errors.Is(err, errTooManyRedirects):
		return workers.Fail(workers.PermanentError, "http: %s: %v", shown, UnwrapURLError(err))
	case ctx.Err() != nil:
		return workers.Fail(workers.RetryableError, "http: %s: %v", shown, context.Cause(ctx))
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return workers.Fail(workers.PermanentError, "http: %s: %v", shown, UnwrapURLError(err))
	case errors.As(err, &certErr), errors.As(err, &unknownAuth), errors.As(err, &hostErr):
		return workers.Fail(workers.PermanentError, "http: %s: %v", shown, UnwrapURLError(err))
	}
	return workers.Fail(workers.RetryableError, "http: %s: %v", shown, UnwrapURLError(err))
}

// UnwrapURLError drops the *url.Error wrapper, whose text repeats the
// method and URL the message already names.
func UnwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// ReadAtMost reads r up to n bytes and reports whether there was more.
func ReadAtMost(r io.Reader, n int) ([]byte, bool, error) {
	data, err := io.ReadAll(io.LimitReader(r, int64(n)+1))
	if err != nil {
		return nil, false, err
	}
	if len(data) > n {
		return data[:n], true, nil
	}
	return data, false, nil
}

// QuoteBody is the start of an error response's body, for a message.
func QuoteBody(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || !utf8.Valid(b) {
		return ""
	}
	return ": " + workers.Truncate(string(b), maxErrorBody)
}

// parseHTTPPayload reads a payload: a JSON object (Request) or a URL.
func parseHTTPPayload(payload []byte) (Request, error) {
	p := bytes.TrimSpace(payload)
	var in Request
	if len(p) > 0 && p[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(p))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			return in, fmt.Errorf("want a URL or a JSON object {url, method, headers, body}: %v", err)
		}
		if dec.More() {
			return in, errors.New("unexpected data after the JSON object")
		}
	} else {
		in.URL = string(p)
	}
	if in.URL == "" {
		return in, errors.New("url is empty")
	}
	if len(in.URL) > maxURLLen {
		return in, fmt.Errorf("url of %d bytes is longer than %d", len(in.URL), maxURLLen)
	}
	u, err := url.Parse(in.URL)
	if err != nil {
		return in, fmt.Errorf("url: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return in, fmt.Errorf("url %s: scheme %q: want http or https", u.Redacted(), u.Scheme)
	}
	if u.Hostname() == "" {
		return in, fmt.Errorf("url %s: no host", u.Redacted())
	}
	if in.Method == "" {
		in.Method = http.MethodGet
	}
	if !httpMethods[in.Method] {
		return in, fmt.Errorf("method %q: want one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS", workers.Truncate(in.Method, 32))
	}
	if in.Body != "" && in.BodyB64 != nil {
		return in, errors.New("give body or body_b64, not both")
	}
	if len(in.Headers) > maxHTTPHeaders {
		return in, fmt.Errorf("%d headers, more than %d", len(in.Headers), maxHTTPHeaders)
	}
	for k, v := range in.Headers {
		if !validHeaderName(k) {
			return in, fmt.Errorf("header name %q: want an HTTP token", workers.Truncate(k, 64))
		}
		if refusedHeaders[http.CanonicalHeaderKey(k)] {
			return in, fmt.Errorf("header %s: set by the fetcher, not the payload", http.CanonicalHeaderKey(k))
		}
		if len(k)+len(v) > maxHTTPHeaderLen || strings.ContainsAny(v, "\r\n\x00") {
			return in, fmt.Errorf("header %s: value too long or not a single line", http.CanonicalHeaderKey(k))
		}
	}
	return in, nil
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}
