package jsonrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	if perr := j.notRelayed(calls); perr != nil {
		return rpcFail(workers.Unsupported, perr)
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
