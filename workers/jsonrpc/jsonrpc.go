package jsonrpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/httpwork"
)

// Type is the name of the jsonrpc work type.
const Type = "jsonrpc"

// Defaults of the jsonrpc work type.
const (
	// DefaultTimeout bounds one upstream call when the request's own
	// deadline is later or missing.
	DefaultTimeout = 30 * time.Second
	// DefaultMaxBatch is the most requests one batch may hold.
	DefaultMaxBatch = 100
)

// Sentinel errors of the jsonrpc work type.
var (
	// ErrChainIDMismatch means the upstream serves another chain than
	// jsonrpc-chain-id names; the node must not serve it.
	ErrChainIDMismatch = errors.New("upstream chain ID does not match jsonrpc-chain-id")
	// ErrJSONRPCClosed means Run was called on a closed Relay.
	ErrJSONRPCClosed = errors.New("jsonrpc work type closed")
)

// Traits of the jsonrpc type: a request of nothing but reads has no side
// effects (ReadOnly), so it may be hedged; one that may write is not. A
// read of the chain's head changes as the chain grows, so results are not
// deterministic.
var Traits = workers.Traits{Idempotent: ReadOnly}

// Traits returns the jsonrpc type's Traits.
func (j *Relay) Traits() workers.Traits { return Traits }

// Relay is the jsonrpc work type: it relays JSON-RPC 2.0 requests (one
// or a batch) to the node's upstream over HTTP POST and classifies the
// answers for the dispatcher. It also follows the upstream's head
// (eth_blockNumber) and reports it (HeadReporter), which the node
// advertises so the beyond-head rule and head-lag rating apply.
type Relay struct {
	cfg    config.JSONRPCConfig
	url    *url.URL // the upstream
	shown  string   // the upstream as named in messages: scheme and host only
	client *http.Client
	// direct is the client's transport when a request may go to it
	// without Client.Do (see send); nil otherwise.
	direct *http.Transport
	// template is every upstream request's method, URL and header.
	template *http.Request
	log      logrus.FieldLogger
	opts     options
	chainID  uint64

	head    atomic.Uint64
	hasHead atomic.Bool

	mu        sync.Mutex
	closed    bool
	stopRun   context.CancelFunc
	runs      sync.WaitGroup
	pollFails int // consecutive failed head polls, for quiet logging

	// headErr is set while head polls fail, nil once one works again:
	// every request reads it (TypeHealth), so it takes no lock.
	headErr atomic.Pointer[error]
}

var (
	_ workers.Handler            = (*Relay)(nil)
	_ workers.HeadReporter       = (*Relay)(nil)
	_ workers.TypeHealthReporter = (*Relay)(nil)
)

// TypeHealth reports whether the upstream answered the last head poll.
// While it did not, the node withdraws the jsonrpc type alone from what it
// advertises (and Do refuses its work), so peers stop sending it RPC
// requests until its upstream answers again; the node's other work types,
// and its health pings, are not affected.
func (j *Relay) TypeHealth() error {
	if e := j.headErr.Load(); e != nil {
		return *e
	}
	return nil
}

type options struct {
	maxResponse int
	maxBatch    int
	timeout     time.Duration
	onHead      func(uint64)
	client      *http.Client
	concurrency int
}

// Option adjusts a Relay.
type Option func(*options) error

// WithMaxResponse bounds an upstream response, in bytes (default
// DefaultMaxPayload, what the work protocol carries).
func WithMaxResponse(n int) Option {
	return func(o *options) error {
		if n < 64 {
			return fmt.Errorf("jsonrpc: max response %d bytes: want at least 64", n)
		}
		o.maxResponse = n
		return nil
	}
}

// WithMaxBatch bounds the requests of one batch (default
// DefaultMaxBatch).
func WithMaxBatch(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("jsonrpc: max batch %d: want at least 1", n)
		}
		o.maxBatch = n
		return nil
	}
}

// WithTimeout bounds one upstream call when the request's deadline
// is later or missing (default DefaultTimeout).
func WithTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("jsonrpc: timeout %s: want more than 0", d)
		}
		o.timeout = d
		return nil
	}
}

// WithHeadChange calls f with the new head whenever a poll finds that it
// changed, from the goroutine running Run. The node's Announce fits, so a
// new head is advertised at once rather than at the next announce-interval.
// f must not block.
func WithHeadChange(f func(head uint64)) Option {
	return func(o *options) error {
		if f == nil {
			return errors.New("jsonrpc: nil head change function")
		}
		o.onHead = f
		return nil
	}
}

// WithConcurrency says how many relays can run at once (the node's
// local-concurrency), so that as many connections to the upstream stay
// open between them (at least 64). It has no effect with WithClient.
func WithConcurrency(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("jsonrpc: concurrency %d: want at least 1", n)
		}
		o.concurrency = n
		return nil
	}
}

// WithClient sets the HTTP client for the upstream (default: one
// of its own, with the environment's proxy settings).
func WithClient(c *http.Client) Option {
	return func(o *options) error {
		if c == nil {
			return errors.New("jsonrpc: nil HTTP client")
		}
		o.client = c
		return nil
	}
}

// New returns the jsonrpc work type for cfg's upstream. Before it
// returns it asks the upstream for its chain ID: when cfg.ChainID is set
// (decimal or 0x-hex) and the upstream reports another, or cannot be asked,
// it refuses (ErrChainIDMismatch for a mismatch). It also reads the head
// once, so the node's first advertisement carries it. ctx bounds these
// start-up calls. Run keeps the head current; log (nil: logrus's standard
// logger) receives head poll failures.
func New(ctx context.Context, cfg config.JSONRPCConfig, log logrus.FieldLogger, opts ...Option) (*Relay, error) {
	o := options{maxResponse: workers.DefaultMaxPayload, maxBatch: DefaultMaxBatch, timeout: DefaultTimeout}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if log == nil {
		log = logrus.StandardLogger()
	}
	if cfg.Upstream == "" {
		return nil, errors.New("jsonrpc: jsonrpc-upstream is empty")
	}
	u, err := url.Parse(cfg.Upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("jsonrpc: jsonrpc-upstream %q: want an http:// or https:// URL", redactURL(cfg.Upstream))
	}
	if cfg.HeadInterval <= 0 {
		return nil, fmt.Errorf("jsonrpc: jsonrpc-head-interval %s: want more than 0", cfg.HeadInterval)
	}
	u.Host = strings.TrimSuffix(u.Host, ":") // an empty port, as http.NewRequest drops it
	j := &Relay{
		cfg:    cfg,
		url:    u,
		shown:  u.Scheme + "://" + u.Host,
		log:    log.WithField("upstream", u.Scheme+"://"+u.Host),
		opts:   o,
		client: o.client,
	}
	if j.client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// A relay sends many requests to one host: every relay that can
		// run at once, and the head poll, finds its connection open again.
		t.MaxIdleConnsPerHost = max(64, o.concurrency+1)
		j.client = &http.Client{Transport: t}
	}
	j.direct = directTransport(j.client, u)
	j.template = &http.Request{Method: http.MethodPost, URL: u, Host: u.Host, Header: postHeader,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}

	want, haveWant := uint64(0), cfg.ChainID != ""
	if haveWant {
		if want, err = parseChainID(cfg.ChainID); err != nil {
			return nil, fmt.Errorf("jsonrpc: jsonrpc-chain-id %q: %w", cfg.ChainID, err)
		}
	}
	got, err := j.quantity(ctx, "eth_chainId")
	switch {
	case err != nil && haveWant:
		j.client.CloseIdleConnections()
		return nil, fmt.Errorf("jsonrpc: check the chain ID of upstream %s: %w", j.shown, err)
	case err != nil:
		j.log.WithError(err).Warn("jsonrpc: could not read the upstream's chain ID (jsonrpc-chain-id is not set, so serving anyway)")
	case haveWant && got != want:
		j.client.CloseIdleConnections()
		return nil, fmt.Errorf("jsonrpc: upstream %s reports chain ID %d (%#x), jsonrpc-chain-id is %d: refusing to serve another chain: %w",
			j.shown, got, got, want, ErrChainIDMismatch)
	default:
		j.chainID = got
	}
	j.pollHead(ctx)
	return j, nil
}

// parseChainID reads a chain ID in decimal or 0x-hex.
// CheckChainID says what is wrong with a jsonrpc-chain-id, as New would
// refuse it, or nil: for a check before anything starts.
func CheckChainID(s string) error {
	if s == "" {
		return nil
	}
	if _, err := parseChainID(s); err != nil {
		return fmt.Errorf("jsonrpc-chain-id %q: %w", s, err)
	}
	return nil
}

func parseChainID(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X") {
		if n, ok := hexQuantity(s); ok {
			return n, nil
		}
		return 0, errors.New("want a decimal number or 0x and up to 16 hex digits")
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, errors.New("want a decimal number or 0x and up to 16 hex digits")
	}
	return n, nil
}

// ChainID returns the chain ID the upstream reported at start, and false
// when it could not be read.
func (j *Relay) ChainID() (uint64, bool) { return j.chainID, j.chainID != 0 }

// Head returns the upstream's block number at the last successful poll,
// and false before the first one.
func (j *Relay) Head() (uint64, bool) {
	if !j.hasHead.Load() {
		return 0, false
	}
	return j.head.Load(), true
}

// Run polls the upstream's head every jsonrpc-head-interval until ctx ends
// or Close is called. A failed poll keeps the last head (an unknown head
// would turn the beyond-head rule off for the whole network) and is
// logged once per run of failures.
func (j *Relay) Run(ctx context.Context) error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return ErrJSONRPCClosed
	}
	if j.stopRun != nil {
		j.mu.Unlock()
		return errors.New("jsonrpc: Run is already running")
	}
	ctx, cancel := context.WithCancel(ctx)
	j.stopRun = cancel
	j.runs.Add(1)
	j.mu.Unlock()
	defer func() {
		cancel()
		j.mu.Lock()
		j.stopRun = nil
		j.mu.Unlock()
		j.runs.Done()
	}()
	t := time.NewTicker(j.cfg.HeadInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			j.pollHead(ctx)
		}
	}
}

// Close stops Run, waits for it to return and releases idle connections.
// Requests still in Do finish on their own contexts.
func (j *Relay) Close() {
	j.mu.Lock()
	j.closed = true
	if j.stopRun != nil {
		j.stopRun()
	}
	j.mu.Unlock()
	j.runs.Wait()
	j.client.CloseIdleConnections()
}

// pollHead reads the head once and records it.
func (j *Relay) pollHead(ctx context.Context) {
	// A poll may take up to one interval, and at least a second, so a slow
	// upstream is not mistaken for a dead one.
	pctx, cancel := context.WithTimeout(ctx, min(max(j.cfg.HeadInterval, time.Second), 10*time.Second))
	defer cancel()
	h, err := j.quantity(pctx, "eth_blockNumber")
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down
		}
		j.pollFails++
		// Peers see this in health answers: it names neither the upstream
		// nor the error, whose URL may carry an API key (the log has both).
		e := fmt.Errorf("upstream head poll failed (%d in a row)", j.pollFails)
		j.headErr.Store(&e)
		if j.pollFails == 1 {
			j.log.WithError(err).Warn("jsonrpc: head poll failed; keeping the last head")
		} else {
			j.log.WithError(err).Debugf("jsonrpc: head poll failed %d times in a row", j.pollFails)
		}
		return
	}
	if j.pollFails > 0 {
		j.log.Infof("jsonrpc: head poll works again after %d failures", j.pollFails)
		j.pollFails = 0
		j.headErr.Store(nil)
	}
	old, had := j.head.Swap(h), j.hasHead.Swap(true)
	if (!had || old != h) && j.opts.onHead != nil {
		j.opts.onHead(h)
	}
}

// quantity calls a parameterless method that answers a hex quantity.
func (j *Relay) quantity(ctx context.Context, method string) (uint64, error) {
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"` + method + `","params":[]}`)
	status, data, err := j.post(ctx, body)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", method, err)
	}
	if status/100 != 2 {
		return 0, fmt.Errorf("%s: upstream %s answered HTTP %d%s", method, j.shown, status, httpwork.QuoteBody(data))
	}
	var resp Response
	if err := json.Unmarshal(data, &resp); err != nil {
		return 0, fmt.Errorf("%s: upstream %s answered no JSON-RPC response: %v", method, j.shown, err)
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("%s: upstream %s: %w", method, j.shown, resp.Error)
	}
	var s string
	if err := json.Unmarshal(resp.Result, &s); err != nil {
		return 0, fmt.Errorf("%s: upstream %s answered %s, want a hex quantity", method, j.shown, workers.Truncate(string(resp.Result), 64))
	}
	n, ok := hexQuantity(s)
	if !ok {
		return 0, fmt.Errorf("%s: upstream %s answered %q, want a hex quantity", method, j.shown, workers.Truncate(s, 64))
	}
	return n, nil
}

// errResponseTooLarge marks an upstream response over the bound.
var errResponseTooLarge = errors.New("upstream response too large")

// postHeader is the header of every upstream request. Requests share it:
// neither the client nor its transport writes to a request's header (a
// redirect or credentials in the URL make a copy first; a cookie jar
// does write, so a client with one gets a copy).
var postHeader = http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json"}}

// post sends body to the upstream and reads the answer, bounded.
func (j *Relay) post(ctx context.Context, body []byte) (int, []byte, error) {
	resp, err := j.send(ctx, body)
	if err != nil {
		return 0, nil, fmt.Errorf("upstream %s: %w", j.shown, httpwork.UnwrapURLError(err))
	}
	defer resp.Body.Close()
	data, more, err := readAtMost(resp, j.opts.maxResponse)
	if err != nil {
		return 0, nil, fmt.Errorf("upstream %s: read the response: %w", j.shown, err)
	}
	if more {
		return 0, nil, fmt.Errorf("upstream %s: response larger than %d bytes: %w", j.shown, j.opts.maxResponse, errResponseTooLarge)
	}
	return resp.StatusCode, data, nil
}

// request is a POST of body to the upstream: a copy of the relay's
// request template (made once, in New: method, URL, header) with ctx and
// the body, rather than a new request parsed from strings each time.
func (j *Relay) request(ctx context.Context, body []byte) *http.Request {
	req := j.template.WithContext(ctx)
	// Each request has its own copy of the URL, as the client may rewrite
	// a request's URL.
	u := *j.url
	req.URL = &u
	req.ContentLength = int64(len(body))
	req.Body = io.NopCloser(bytes.NewReader(body))
	// The transport sends the body again on a kept-alive connection the
	// upstream closed before it read the request.
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if len(body) == 0 {
		req.Body, req.GetBody = http.NoBody, func() (io.ReadCloser, error) { return http.NoBody, nil }
	}
	if j.client.Jar != nil { // a client of WithClient's adds its cookies to the header
		req.Header = postHeader.Clone()
	}
	return req
}

// send posts body to the upstream. With a plain client (see
// directTransport) the request goes to its transport at once: Client.Do
// would copy the request's header for redirects it might follow and wrap
// its cancellation, a tenth of the relay's allocations for nothing on an
// upstream that does not redirect. An answer that redirects is sent again
// through Client.Do, which follows it as it always has (the upstream sees
// the first request twice, its redirect not being an answer).
func (j *Relay) send(ctx context.Context, body []byte) (*http.Response, error) {
	req := j.request(ctx, body)
	if j.direct == nil {
		return j.client.Do(req)
	}
	resp, err := j.direct.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if !redirects(resp) {
		return resp, nil
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // so the connection is kept
	resp.Body.Close()
	return j.client.Do(j.request(ctx, body))
}

// directTransport returns c's transport when a request to u may skip
// Client.Do: a net/http Transport, and nothing Client.Do adds (a cookie
// jar, a timeout of the client's own, basic auth from credentials in u);
// redirects are left to send. Otherwise nil.
func directTransport(c *http.Client, u *url.URL) *http.Transport {
	rt := c.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	t, ok := rt.(*http.Transport)
	if !ok || c.Jar != nil || c.Timeout != 0 || u.User != nil {
		return nil
	}
	return t
}

// redirects reports whether Client.Do would follow resp to another URL.
func redirects(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return resp.Header.Get("Location") != ""
	}
	return false
}

// readAtMost reads resp's body, up to n bytes; more reports a body longer
// than n. A body of known length is read into one buffer of that size
// (up to n), not grown step by step.
func readAtMost(resp *http.Response, n int) (data []byte, more bool, err error) {
	if resp.ContentLength < 0 || resp.ContentLength > int64(n) {
		return httpwork.ReadAtMost(resp.Body, n)
	}
	// One byte over: a body longer than announced is read to the bound
	// and found too large, as one of unknown length is.
	buf := bytes.NewBuffer(make([]byte, 0, int(resp.ContentLength)+bytes.MinRead))
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, int64(n)+1)); err != nil {
		return nil, false, err
	}
	if buf.Len() > n {
		return buf.Bytes()[:n], true, nil
	}
	return buf.Bytes(), false, nil
}

// Do relays the payload, one JSON-RPC 2.0 request or a batch, to the
// upstream. Its output is the upstream's response as is. The outcome:
//
//   - Success: a result, or an error that is the answer (an execution
//     revert, say), which the caller gets as PermanentError below.
//   - Empty: a null result of a block-addressed method; the dispatcher's
//     beyond-head rule decides whether it is final.
//   - Unsupported: method not found (-32601) or not supported (-32004):
//     final for this node's upstream only.
//   - Busy: rate limited (-32005 or HTTP 429).
//   - RetryableError: server errors (-32000 to -32099, -32603), HTTP 5xx,
//     an answer that is not JSON-RPC, timeouts and network failures.
//   - PermanentError: an invalid payload, invalid params or request
//     (-32602, -32600, -32700), or an application error such as a revert.
//
// When the outcome comes from the upstream's JSON-RPC error, the Result's
// Error is that error object in JSON (see ParseRPCError).
func (j *Relay) Do(ctx context.Context, payload []byte) workers.Result {
	if err := j.TypeHealth(); err != nil {
		return workers.Fail(workers.Unsupported, "jsonrpc is out on this worker: %v", err)
	}
	calls, batch, perr := j.parsePayload(payload)
	if perr != nil {
		return rpcFail(workers.PermanentError, perr)
	}
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > j.opts.timeout {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, j.opts.timeout)
		defer cancel()
	}
	status, data, err := j.post(ctx, payload)
	switch {
	case err != nil && ctx.Err() != nil:
		return workers.Fail(workers.RetryableError, "jsonrpc: upstream %s: no answer: %v", j.shown, context.Cause(ctx))
	case errors.Is(err, errResponseTooLarge):
		return workers.Fail(workers.PermanentError, "jsonrpc: %v", err)
	case err != nil:
		return workers.Fail(workers.RetryableError, "jsonrpc: %v", err)
	case status == http.StatusTooManyRequests:
		return workers.Fail(workers.Busy, "jsonrpc: upstream %s is rate limiting: HTTP 429%s", j.shown, httpwork.QuoteBody(data))
	}
	if status/100 == 2 && allNotifications(calls) {
		return workers.OK(nil) // notifications have no answer
	}
	if batch {
		return j.classifyBatch(calls, status, data)
	}
	return j.classifyOne(calls[0], status, data)
}

// allNotifications reports whether no call expects an answer.
func allNotifications(calls []Call) bool {
	for _, c := range calls {
		if !c.Notification() {
			return false
		}
	}
	return true
}

// parsePayload checks the payload: one request object or a non-empty
// batch of them.
func (j *Relay) parsePayload(payload []byte) ([]Call, bool, *RPCError) {
	p := bytes.TrimSpace(payload)
	if !validJSON(p) {
		return nil, false, &RPCError{Code: RPCParseError, Message: "parse error: the payload is not valid JSON"}
	}
	if p[0] != '[' {
		c, e := ParseCall(p)
		if e != nil {
			return nil, false, e
		}
		return []Call{c}, false, nil
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(p, &raws); err != nil {
		return nil, true, &RPCError{Code: RPCInvalidRequest, Message: "invalid request: " + err.Error()}
	}
	if len(raws) == 0 {
		return nil, true, &RPCError{Code: RPCInvalidRequest, Message: "invalid request: empty batch"}
	}
	if len(raws) > j.opts.maxBatch {
		return nil, true, &RPCError{Code: RPCInvalidRequest, Message: fmt.Sprintf("invalid request: batch of %d requests, more than %d", len(raws), j.opts.maxBatch)}
	}
	calls := make([]Call, len(raws))
	for i, r := range raws {
		c, e := ParseCall(r)
		if e != nil {
			e.Message = fmt.Sprintf("batch element %d: %s", i, e.Message)
			return nil, true, e
		}
		calls[i] = c
	}
	return calls, true, nil
}

// classifyOne classifies the upstream's answer to a single request.
func (j *Relay) classifyOne(c Call, status int, data []byte) workers.Result {
	resp, err := DecodeResponse(data)
	if err != nil || (resp.Result == nil && resp.Error == nil) {
		return j.notJSONRPC(status, data)
	}
	if resp.Error != nil {
		return rpcFail(rpcOutcome(resp.Error.Code), resp.Error)
	}
	if status/100 != 2 {
		return j.notJSONRPC(status, data)
	}
	if !sameID(resp.ID, c.ID) {
		return workers.Fail(workers.RetryableError, "jsonrpc: upstream %s answered id %s to a request with id %s",
			j.shown, workers.Truncate(string(resp.ID), 64), workers.Truncate(string(c.ID), 64))
	}
	if bytes.Equal(bytes.TrimSpace(resp.Result), []byte("null")) && blockAddressed(c.Method) {
		return workers.Result{Outcome: workers.Empty}
	}
	return workers.OK(data)
}

// classifyBatch classifies the upstream's answer to a batch: a success
// carrying every answer, unless one of them says this upstream cannot
// serve now (busy, method not found, a server error), in which case the
// batch is that failure so the dispatcher can try it elsewhere.
func (j *Relay) classifyBatch(calls []Call, status int, data []byte) workers.Result {
	var resps []Response
	if err := json.Unmarshal(data, &resps); err != nil {
		// A batch refused as a whole comes back as one error object.
		var one Response
		if json.Unmarshal(data, &one) == nil && one.Error != nil {
			return rpcFail(rpcOutcome(one.Error.Code), one.Error)
		}
		return j.notJSONRPC(status, data)
	}
	want := 0
	for _, c := range calls {
		if !c.Notification() {
			want++
		}
	}
	if len(resps) != want {
		return workers.Fail(workers.RetryableError, "jsonrpc: upstream %s answered %d responses to a batch of %d requests", j.shown, len(resps), want)
	}
	for _, r := range resps {
		if r.Error == nil {
			continue
		}
		switch o := rpcOutcome(r.Error.Code); o {
		case workers.Busy, workers.Unsupported, workers.RetryableError:
			return rpcFail(o, r.Error)
		}
	}
	if status/100 != 2 {
		return j.notJSONRPC(status, data)
	}
	if id, ok := unmatchedID(calls, resps); !ok {
		return workers.Fail(workers.RetryableError, "jsonrpc: upstream %s answered id %s, which no request of the batch has (or that it answered twice)",
			j.shown, workers.Truncate(string(id), 64))
	}
	return workers.OK(data)
}

// unmatchedID checks that every response answers a request of the batch
// and none is answered twice (in any order, as JSON-RPC allows), and
// returns the first id that does not.
func unmatchedID(calls []Call, resps []Response) (json.RawMessage, bool) {
	used := make([]bool, len(calls))
next:
	for _, r := range resps {
		for i, c := range calls {
			if !used[i] && !c.Notification() && sameID(r.ID, c.ID) {
				used[i] = true
				continue next
			}
		}
		if r.Error != nil && (len(r.ID) == 0 || string(r.ID) == "null") {
			continue // an error about a request the upstream could not read
		}
		return r.ID, false
	}
	return nil, true
}

// notJSONRPC classifies an answer that carries no JSON-RPC response.
func (j *Relay) notJSONRPC(status int, data []byte) workers.Result {
	if status == http.StatusRequestEntityTooLarge {
		return workers.Fail(workers.PermanentError, "jsonrpc: upstream %s: HTTP 413, the request is too large%s", j.shown, httpwork.QuoteBody(data))
	}
	// Anything else is this upstream's failure (down, misconfigured, behind
	// a proxy that answers in HTML): another node may serve the request.
	return workers.Fail(workers.RetryableError, "jsonrpc: upstream %s answered HTTP %d without a JSON-RPC response%s", j.shown, status, httpwork.QuoteBody(data))
}

// rpcOutcome classifies a JSON-RPC error code.
func rpcOutcome(code int) workers.Outcome {
	switch {
	case code == RPCMethodNotFound, code == RPCMethodNotSupported:
		return workers.Unsupported
	case code == RPCLimitExceeded:
		return workers.Busy
	case code == RPCParseError, code == RPCInvalidRequest, code == RPCInvalidParams:
		return workers.PermanentError
	case code == RPCInternalError, code >= -32099 && code <= -32000:
		return workers.RetryableError
	}
	// Application errors (3: execution reverted, and others) are the
	// answer to the request, not a failure of the upstream.
	return workers.PermanentError
}

// redactURL returns a URL reduced to its scheme and host, or a placeholder
// when it cannot be parsed: upstream URLs often carry API keys in the path.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return "(unparseable URL)"
	}
	return u.Scheme + "://" + u.Host
}
