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
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
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

// ErrDestinationRefused means a fetch would have connected to an address
// the http work type refuses (loopback, private, link-local...) and that
// http-allow does not list. Test it with errors.Is.
var ErrDestinationRefused = errors.New("destination refused")

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
	maxBody   int
	maxOutput int
	timeout   time.Duration
	agent     string
}

var _ workers.Handler = (*Handler)(nil)

type options struct {
	maxRedirects int
	maxOutput    int
	timeout      time.Duration
	agent        string
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
// DefaultMaxPayload, what the work protocol carries): a body within
// http-max-body can still encode larger (base64, JSON escapes), and such a
// response is refused with a clear error rather than failing on the wire.
func WithMaxOutput(n int) Option {
	return func(o *options) error {
		if n < 256 {
			return fmt.Errorf("http work type: max output %d bytes: want at least 256", n)
		}
		o.maxOutput = n
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
	o := options{maxRedirects: DefaultMaxRedirects, maxOutput: workers.DefaultMaxPayload, timeout: DefaultTimeout, agent: "workmesh"}
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
	h := &Handler{allow: allow, maxBody: cfg.MaxBody, maxOutput: o.maxOutput, timeout: o.timeout, agent: o.agent}
	transport := &http.Transport{
		// No proxy, ever: a proxy would dial for us and the address check
		// below would see only the proxy.
		Proxy:                 nil,
		DialContext:           h.dial,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   4,
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

// dial connects to addr, refusing every address the allowlist does not
// permit and, whatever it permits, the node's own ports. The check runs in
// the dialer's Control hook, on the resolved address about to be
// connected, before any packet is sent.
func (h *Handler) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("dial %s: port %q: %w", addr, portText, err)
	}
	hostAllowed := h.allow.hostAllowed(host, uint16(port))
	d := net.Dialer{
		Timeout:   10 * time.Second,
		KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("dial %s: address %q: %w", host, address, err)
			}
			if err := h.own.check(ap); err != nil {
				return err
			}
			if hostAllowed {
				return nil
			}
			if err := h.allow.checkAddr(ap.Addr(), ap.Port()); err != nil {
				if _, literal := netip.ParseAddr(host); literal == nil {
					return err
				}
				return fmt.Errorf("%s resolves to %w", host, err)
			}
			return nil
		},
	}
	return d.DialContext(ctx, network, addr)
}

// checkLiteral checks a redirect's target when its host is an IP address
// (a name is checked when dialed, like every address).
func (h *Handler) checkLiteral(u *url.URL) error {
	ip, err := netip.ParseAddr(u.Hostname())
	if err != nil {
		return nil
	}
	port := urlPort(u)
	if err := h.own.check(netip.AddrPortFrom(ip, port)); err != nil {
		return err
	}
	return h.allow.checkLiteral(u.Hostname(), port)
}

// urlPort is the port a URL connects to: its own, or its scheme's.
func urlPort(u *url.URL) uint16 {
	if p, err := strconv.ParseUint(u.Port(), 10, 16); err == nil {
		return uint16(p)
	}
	if u.Scheme == "https" {
		return 443
	}
	return 80
}

// ProtectOwnPorts makes ports of this machine unfetchable, whatever
// http-allow says: the node gives its API port and its listen ports, so
// that no peer can use the http work type to reach the node's own API
// (and, say, switch on its fault injection) or its libp2p endpoints. An
// address is of this machine when it is loopback, unspecified or one of
// its interfaces' addresses. Each call replaces the ports of the last;
// what names each port is shown in the refusal.
func (h *Handler) ProtectOwnPorts(ports map[uint16]string) {
	m := maps.Clone(ports)
	h.own.ports.Store(&m)
}

// ownPorts are the node's own ports (ProtectOwnPorts).
type ownPorts struct {
	ports atomic.Pointer[map[uint16]string]
}

// check refuses ap when its port is one of the node's own and its address
// is this machine's.
func (o *ownPorts) check(ap netip.AddrPort) error {
	m := o.ports.Load()
	if m == nil {
		return nil
	}
	what, ok := (*m)[ap.Port()]
	if !ok || !o.local(ap.Addr()) {
		return nil
	}
	return fmt.Errorf("%s is this node's own %s, which the http work type never fetches, whatever http-allow lists: %w",
		ap, what, ErrDestinationRefused)
}

// local reports whether ip is an address of this machine.
func (o *ownPorts) local(ip netip.Addr) bool {
	ip = ip.Unmap().WithZone("")
	if ip.IsLoopback() || ip.IsUnspecified() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // unknown: refuse rather than risk the node's own API
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ai, ok := netip.AddrFromSlice(n.IP); ok && ai.Unmap() == ip {
				return true
			}
		}
	}
	return false
}

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

// httpAllow is the parsed http-allow list.
type httpAllow struct {
	rules []allowRule
}

// allowRule is one http-allow entry: an address range, a host name or a
// "*." wildcard of a domain, each for one port or (port 0) for every port.
type allowRule struct {
	prefix netip.Prefix // valid for an address or CIDR entry
	host   string       // a host name entry
	suffix string       // ".example.com" for "*.example.com"
	port   uint16       // 0: every port
}

// parseHTTPAllow parses http-allow entries: CIDRs, addresses, host names
// and "*." wildcards of a domain, each optionally followed by ":port"
// (an IPv6 address or CIDR with a port in brackets: "[::1]:8080",
// "[fd00::/8]:443").
func parseHTTPAllow(entries []string) (httpAllow, error) {
	var a httpAllow
	for i, raw := range entries {
		r, ok := parseAllowRule(strings.ToLower(strings.TrimSpace(raw)))
		if !ok {
			return httpAllow{}, fmt.Errorf("http-allow entry %d (%q): want a CIDR, an IP address, a host name or *.domain, each with an optional :port", i+1, raw)
		}
		a.rules = append(a.rules, r)
	}
	return a, nil
}

// parseAllowRule parses one lower-cased entry.
func parseAllowRule(e string) (allowRule, bool) {
	if r, ok := parseAllowTarget(e); ok {
		return r, true
	}
	// With a port: "[v6 or v6/len]:port", or "v4, v4/len or name:port".
	var target, port string
	if strings.HasPrefix(e, "[") {
		end := strings.Index(e, "]:")
		if end < 0 {
			return allowRule{}, false
		}
		target, port = e[1:end], e[end+2:]
		if !strings.Contains(target, ":") {
			return allowRule{}, false // brackets are for IPv6 only
		}
	} else {
		i := strings.LastIndexByte(e, ':')
		if i < 0 || strings.Count(e, ":") != 1 {
			return allowRule{}, false
		}
		target, port = e[:i], e[i+1:]
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != port {
		return allowRule{}, false
	}
	r, ok := parseAllowTarget(target)
	r.port = uint16(n)
	return r, ok
}

// parseAllowTarget parses an entry without a port.
func parseAllowTarget(e string) (allowRule, bool) {
	e = strings.TrimSuffix(e, ".")
	if p, err := netip.ParsePrefix(e); err == nil {
		return allowRule{prefix: p.Masked()}, true
	}
	if ip, err := netip.ParseAddr(e); err == nil {
		ip = ip.Unmap().WithZone("")
		return allowRule{prefix: netip.PrefixFrom(ip, ip.BitLen())}, true
	}
	if strings.HasPrefix(e, "*.") && validHostName(e[2:]) {
		return allowRule{suffix: e[1:]}, true
	}
	if validHostName(e) {
		return allowRule{host: e}, true
	}
	return allowRule{}, false
}

// validHostName reports whether s is a DNS name of letters, digits, '-'
// and '.' (and '_', seen in the wild).
func validHostName(s string) bool {
	if s == "" || len(s) > 253 || strings.HasPrefix(s, ".") || strings.Contains(s, "..") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}

// covers reports whether the rule applies to port.
func (r allowRule) covers(port uint16) bool { return r.port == 0 || r.port == port }

// hostAllowed reports whether host (as named in the URL) is listed by name
// for port.
func (a httpAllow) hostAllowed(host string, port uint16) bool {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	for _, r := range a.rules {
		if !r.covers(port) {
			continue
		}
		if r.host != "" && r.host == h || r.suffix != "" && strings.HasSuffix(h, r.suffix) {
			return true
		}
	}
	return false
}

// checkAddr returns an error wrapping ErrDestinationRefused when ip is in
// a refused range and no allowed CIDR covers it on port.
func (a httpAllow) checkAddr(ip netip.Addr, port uint16) error {
	why := refusedRange(ip)
	if why == "" {
		return nil
	}
	plain := ip.Unmap().WithZone("")
	for _, r := range a.rules {
		if r.prefix.IsValid() && r.covers(port) && r.prefix.Contains(plain) {
			return nil
		}
	}
	return fmt.Errorf("%s, a %s address not in http-allow: %w", netip.AddrPortFrom(ip, port), why, ErrDestinationRefused)
}

// checkLiteral checks a URL host that is an IP address; names pass (they
// are checked when dialed) unless the name itself is allowed.
func (a httpAllow) checkLiteral(host string, port uint16) error {
	ip, err := netip.ParseAddr(host)
	if err != nil || a.hostAllowed(host, port) {
		return nil
	}
	return a.checkAddr(ip, port)
}

// specialRange is an address range the http type refuses unless allowed.
type specialRange struct {
	prefix netip.Prefix
	why    string
}

var specialRanges = func() []specialRange {
	table := []struct{ cidr, why string }{
		{"0.0.0.0/8", "unspecified (\"this network\")"},
		{"10.0.0.0/8", "private (RFC 1918)"},
		{"100.64.0.0/10", "shared (CGNAT, RFC 6598)"},
		{"127.0.0.0/8", "loopback"},
		{"169.254.0.0/16", "link-local"},
		{"172.16.0.0/12", "private (RFC 1918)"},
		{"192.0.0.0/24", "IETF protocol assignment"},
		{"192.0.2.0/24", "documentation"},
		{"192.88.99.0/24", "6to4 relay anycast"},
		{"192.168.0.0/16", "private (RFC 1918)"},
		{"198.18.0.0/15", "benchmarking"},
		{"198.51.100.0/24", "documentation"},
		{"203.0.113.0/24", "documentation"},
		{"224.0.0.0/4", "multicast"},
		{"240.0.0.0/4", "reserved"}, // with the broadcast address
		{"::/128", "unspecified"},
		{"::1/128", "loopback"},
		{"64:ff9b:1::/48", "local-use NAT64"},
		{"100::/64", "discard-only"},
		{"2001::/32", "Teredo"},
		{"2001:db8::/32", "documentation"},
		{"fc00::/7", "unique local (ULA)"},
		{"fe80::/10", "link-local"},
		{"fec0::/10", "site-local"},
		{"ff00::/8", "multicast"},
	}
	out := make([]specialRange, len(table))
	for i, r := range table {
		out[i] = specialRange{prefix: netip.MustParsePrefix(r.cidr), why: r.why}
	}
	return out
}()

var (
	nat64Prefix  = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour    = netip.MustParsePrefix("2002::/16")
	v4Compatible = netip.MustParsePrefix("::/96")
)

// refusedRange says which special range ip is in (loopback, private,
// link-local...), or "" for an ordinary public address. IPv6 forms that
// embed an IPv4 address (mapped, NAT64, 6to4, compatible) are judged by the
// address they embed, so they cannot smuggle a private one.
func refusedRange(ip netip.Addr) string {
	if !ip.IsValid() {
		return "invalid"
	}
	ip = ip.WithZone("").Unmap()
	if ip.Is6() {
		b := ip.As16()
		var embedded netip.Addr
		switch {
		case nat64Prefix.Contains(ip), v4Compatible.Contains(ip) && ip.Compare(netip.IPv6Loopback()) > 0:
			embedded = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
		case sixToFour.Contains(ip):
			embedded = netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})
		}
		if embedded.IsValid() {
			if why := refusedRange(embedded); why != "" {
				return why + " (embedded in " + ip.String() + ")"
			}
		}
	}
	for _, r := range specialRanges {
		if r.prefix.Contains(ip) {
			return r.why
		}
	}
	return ""
}
