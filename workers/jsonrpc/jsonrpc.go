package jsonrpc

import (
	"bytes"
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

// JSON-RPC 2.0 error codes that workmesh produces or branches on.
const (
	// RPCParseError: the body is not valid JSON.
	RPCParseError = -32700
	// RPCInvalidRequest: the JSON is not a valid request object.
	RPCInvalidRequest = -32600
	// RPCMethodNotFound: the method does not exist or is not available.
	RPCMethodNotFound = -32601
	// RPCInvalidParams: the method's parameters are invalid.
	RPCInvalidParams = -32602
	// RPCInternalError: an internal error of the server (here: of workmesh
	// when no worker answered).
	RPCInternalError = -32603
	// RPCMethodNotSupported is EIP-1474's "method not supported".
	RPCMethodNotSupported = -32004
	// RPCLimitExceeded is EIP-1474's "request exceeds defined limit", the
	// code providers use for rate limiting.
	RPCLimitExceeded = -32005
)

// Sentinel errors of the jsonrpc work type.
var (
	// ErrChainIDMismatch means the upstream serves another chain than
	// jsonrpc-chain-id names; the node must not serve it.
	ErrChainIDMismatch = errors.New("upstream chain ID does not match jsonrpc-chain-id")
	// ErrJSONRPCClosed means Run was called on a closed Relay.
	ErrJSONRPCClosed = errors.New("jsonrpc work type closed")
)

// RPCError is a JSON-RPC 2.0 error object. A jsonrpc Result whose outcome
// comes from the upstream's error carries this object, in JSON, as its
// Error message, so that the /v1/rpc endpoint can hand the upstream's own
// code, message and data to the client.
type RPCError struct {
	// Code is the JSON-RPC error code (RPCInvalidParams, 3 for a revert...).
	Code int `json:"code"`
	// Message is the upstream's, or workmesh's, description.
	Message string `json:"message"`
	// Data is the error's extra data as sent (a revert reason, say).
	Data json.RawMessage `json:"data,omitempty"`
}

// Error returns the code and message.
func (e *RPCError) Error() string { return fmt.Sprintf("JSON-RPC error %d: %s", e.Code, e.Message) }

// Encode returns e in JSON, fitted to MaxErrorLen (data is dropped first,
// then the message is cut), so it survives the work protocol intact.
func (e *RPCError) Encode() string {
	b, err := json.Marshal(e)
	if err == nil && len(b) <= workers.MaxErrorLen {
		return string(b)
	}
	short := RPCError{Code: e.Code, Message: workers.Truncate(e.Message, workers.MaxErrorLen/2)}
	b, _ = json.Marshal(short)
	return string(b)
}

// ParseRPCError reads a Result's error message written by the jsonrpc work
// type from an upstream's JSON-RPC error; it returns false for any other
// message.
func ParseRPCError(msg string) (*RPCError, bool) {
	if !strings.HasPrefix(msg, `{"code":`) {
		return nil, false
	}
	var e RPCError
	dec := json.NewDecoder(strings.NewReader(msg))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || dec.More() {
		return nil, false
	}
	return &e, true
}

// rpcFail returns a result of outcome o carrying e as its message.
func rpcFail(o workers.Outcome, e *RPCError) workers.Result {
	return workers.Result{Outcome: o, Error: e.Encode()}
}

// Call is one JSON-RPC 2.0 request as workmesh reads it.
type Call struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
}

// Notification reports whether the call has no id, so expects no answer.
func (c *Call) Notification() bool { return c.ID == nil }

// Response is one JSON-RPC 2.0 response.
type Response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *RPCError       `json:"error,omitempty"`
}

// ParseCall decodes and checks one request object. The id is returned
// whenever it could be read, so an error answer can carry it.
func ParseCall(raw json.RawMessage) (Call, *RPCError) {
	var c Call
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return c, &RPCError{Code: RPCInvalidRequest, Message: "invalid request: want a JSON object"}
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		// Keep the id if it alone can be read.
		var idOnly struct {
			ID json.RawMessage `json:"id"`
		}
		if json.Unmarshal(raw, &idOnly) == nil && validID(idOnly.ID) {
			c.ID = idOnly.ID
		} else {
			c.ID = nil
		}
		return c, &RPCError{Code: RPCInvalidRequest, Message: "invalid request: " + describeJSONError(err)}
	}
	if c.ID != nil && !validID(c.ID) {
		c.ID = nil
		return c, &RPCError{Code: RPCInvalidRequest, Message: "invalid request: id must be a string, a number or null"}
	}
	switch {
	case c.JSONRPC != "2.0":
		return c, &RPCError{Code: RPCInvalidRequest, Message: `invalid request: "jsonrpc" must be "2.0"`}
	case c.Method == "":
		return c, &RPCError{Code: RPCInvalidRequest, Message: `invalid request: "method" is missing or empty`}
	case len(c.Method) > 256:
		return c, &RPCError{Code: RPCInvalidRequest, Message: `invalid request: "method" is longer than 256 bytes`}
	}
	if p := bytes.TrimSpace(c.Params); len(p) > 0 && p[0] != '[' && p[0] != '{' && !bytes.Equal(p, []byte("null")) {
		return c, &RPCError{Code: RPCInvalidRequest, Message: `invalid request: "params" must be an array or an object`}
	}
	return c, nil
}

// validID reports whether an id is a string, a number or null.
func validID(id json.RawMessage) bool {
	id = bytes.TrimSpace(id)
	if len(id) == 0 {
		return false
	}
	switch c := id[0]; {
	case c == '"', c == '-', c >= '0' && c <= '9':
		return true
	case bytes.Equal(id, []byte("null")):
		return true
	}
	return false
}

// blockParam maps the methods that address a block by number to the index
// of their block parameter.
var blockParam = map[string]int{
	"eth_getBlockByNumber":                       0,
	"eth_getBlockTransactionCountByNumber":       0,
	"eth_getUncleCountByBlockNumber":             0,
	"eth_getUncleByBlockNumberAndIndex":          0,
	"eth_getTransactionByBlockNumberAndIndex":    0,
	"eth_getRawTransactionByBlockNumberAndIndex": 0,
	"eth_getBlockReceipts":                       0,
	"eth_getHeaderByNumber":                      0,
	"eth_getBalance":                             1,
	"eth_getCode":                                1,
	"eth_getTransactionCount":                    1,
	"eth_call":                                   1,
	"eth_estimateGas":                            1,
	"eth_createAccessList":                       1,
	"eth_feeHistory":                             1,
	"eth_getStorageAt":                           2,
	"eth_getProof":                               2,
	"debug_traceBlockByNumber":                   0,
	"debug_getRawBlock":                          0,
	"debug_getRawHeader":                         0,
	"debug_getRawReceipts":                       0,
	"debug_traceCall":                            1,
	"trace_block":                                0,
	"trace_replayBlockTransactions":              0,
	"trace_callMany":                             1,
	"trace_call":                                 2,
}

// readOnlyMethods are the methods, besides the block-addressed and range
// ones, that only read chain state any node of the chain answers alike, so
// a request of nothing but reads may be hedged: sent to a second worker
// while the first is slow. Anything else (sending transactions, signing,
// filters and subscriptions, which live on one node) is never hedged.
var readOnlyMethods = map[string]bool{
	"eth_blockNumber": true, "eth_chainId": true, "net_version": true, "web3_clientVersion": true,
	"eth_gasPrice": true, "eth_maxPriorityFeePerGas": true, "eth_feeHistory": true, "eth_blobBaseFee": true,
	"eth_syncing": true, "eth_getBlockByHash": true, "eth_getBlockTransactionCountByHash": true,
	"eth_getUncleCountByBlockHash": true, "eth_getTransactionByHash": true,
	"eth_getTransactionByBlockHashAndIndex": true, "eth_getTransactionReceipt": true,
	"eth_getBlockReceipts": true, "eth_estimateGas": true, "eth_createAccessList": true,
	"debug_traceTransaction": true, "trace_transaction": true, "trace_get": true, "trace_replayTransaction": true,
}

// ReadOnly reports whether a jsonrpc payload (one request or a batch) asks
// only for reads: then the dispatcher may hedge it. A payload it cannot
// read is not.
func ReadOnly(payload []byte) bool {
	type call struct {
		Method string `json:"method"`
	}
	p := bytes.TrimSpace(payload)
	var calls []call
	if len(p) > 0 && p[0] == '[' {
		if json.Unmarshal(p, &calls) != nil {
			return false
		}
	} else {
		var c call
		if json.Unmarshal(p, &c) != nil {
			return false
		}
		calls = []call{c}
	}
	for _, c := range calls {
		if _, addressed := blockParam[c.Method]; !addressed && !rangeMethods[c.Method] && !readOnlyMethods[c.Method] {
			return false
		}
	}
	return len(calls) > 0
}

// rangeMethods take a filter object whose fromBlock and toBlock name blocks.
var rangeMethods = map[string]bool{"eth_getLogs": true, "trace_filter": true}

// BlockOf returns the block number a JSON-RPC request names, for the
// beyond-head rule: the block parameter of a block-addressed method
// (eth_getBlockByNumber, eth_getBalance, eth_call...), or the highest of
// fromBlock and toBlock for eth_getLogs. Only a concrete number is a
// position: tags ("latest", "pending", "earliest", "safe", "finalized"),
// block hashes and absent parameters give false.
func BlockOf(method string, params json.RawMessage) (uint64, bool) {
	idx, addressed := blockParam[method]
	if !addressed && !rangeMethods[method] {
		return 0, false
	}
	var list []json.RawMessage
	if err := json.Unmarshal(params, &list); err != nil {
		return 0, false
	}
	if addressed {
		if idx >= len(list) {
			return 0, false
		}
		return blockNumber(list[idx])
	}
	if len(list) == 0 {
		return 0, false
	}
	var filter struct {
		FromBlock json.RawMessage `json:"fromBlock"`
		ToBlock   json.RawMessage `json:"toBlock"`
		BlockHash json.RawMessage `json:"blockHash"`
	}
	if err := json.Unmarshal(list[0], &filter); err != nil || filter.BlockHash != nil {
		return 0, false
	}
	from, okFrom := blockNumber(filter.FromBlock)
	to, okTo := blockNumber(filter.ToBlock)
	switch {
	case okFrom && okTo:
		return max(from, to), true
	case okTo:
		return to, true
	case okFrom:
		return from, true
	}
	return 0, false
}

// blockNumber reads a block parameter: a hex quantity ("0x1b4"), a JSON
// number, or an EIP-1898 object {"blockNumber": ...}.
func blockNumber(raw json.RawMessage) (uint64, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0, false
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0, false
		}
		return hexQuantity(s)
	case '{':
		var obj struct {
			BlockNumber json.RawMessage `json:"blockNumber"`
		}
		if json.Unmarshal(raw, &obj) != nil || obj.BlockNumber == nil {
			return 0, false
		}
		return blockNumber(obj.BlockNumber)
	}
	n, err := strconv.ParseUint(string(raw), 10, 64)
	return n, err == nil
}

// hexQuantity parses "0x" and 1 to 16 hex digits. A block hash (64
// digits) and anything else give false.
func hexQuantity(s string) (uint64, bool) {
	if len(s) < 3 || len(s) > 18 || (s[:2] != "0x" && s[:2] != "0X") {
		return 0, false
	}
	n, err := strconv.ParseUint(s[2:], 16, 64)
	return n, err == nil
}

// blockAddressed reports whether a null result of method is a miss: the
// method reads a block by number, so a node without that block answers
// null. Hash lookups (eth_getTransactionReceipt...) are left out on
// purpose: a null there usually means "not mined yet", and clients poll
// them, so treating it as a miss would sweep every peer on every poll.
func blockAddressed(method string) bool {
	_, ok := blockParam[method]
	return ok
}

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
	cfg      config.JSONRPCConfig
	endpoint string // the upstream URL
	shown    string // the upstream as named in messages: scheme and host only
	client   *http.Client
	log      logrus.FieldLogger
	opts     options
	chainID  uint64

	head    atomic.Uint64
	hasHead atomic.Bool

	mu        sync.Mutex
	closed    bool
	stopRun   context.CancelFunc
	runs      sync.WaitGroup
	pollFails int   // consecutive failed head polls, for quiet logging
	headErr   error // set while head polls fail; nil once one works again
}

var (
	_ workers.Handler       = (*Relay)(nil)
	_ workers.HeadReporter  = (*Relay)(nil)
	_ workers.HealthChecker = (*Relay)(nil)
)

// Healthy reports whether the upstream answered the last head poll. A node
// whose upstream stopped answering fails its health pings with this error,
// so peers take it out of their selection (as liveness polls would find a
// sick RPC node) until its upstream answers again.
func (j *Relay) Healthy() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.headErr
}

type options struct {
	maxResponse int
	maxBatch    int
	timeout     time.Duration
	onHead      func(uint64)
	client      *http.Client
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
	j := &Relay{
		cfg:      cfg,
		endpoint: cfg.Upstream,
		shown:    u.Scheme + "://" + u.Host,
		log:      log.WithField("upstream", u.Scheme+"://"+u.Host),
		opts:     o,
		client:   o.client,
	}
	if j.client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64 // a relay sends many requests to one host
		j.client = &http.Client{Transport: t}
	}

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
		j.mu.Lock()
		// Peers see this in health answers: it names neither the upstream
		// nor the error, whose URL may carry an API key (the log has both).
		j.headErr = fmt.Errorf("upstream head poll failed (%d in a row)", j.pollFails)
		j.mu.Unlock()
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
		j.mu.Lock()
		j.headErr = nil
		j.mu.Unlock()
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

// post sends body to the upstream and reads the answer, bounded.
func (j *Relay) post(ctx context.Context, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.endpoint, bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("upstream %s: %v", j.shown, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := j.client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("upstream %s: %w", j.shown, httpwork.UnwrapURLError(err))
	}
	defer resp.Body.Close()
	data, more, err := httpwork.ReadAtMost(resp.Body, j.opts.maxResponse)
	if err != nil {
		return 0, nil, fmt.Errorf("upstream %s: read the response: %w", j.shown, err)
	}
	if more {
		return 0, nil, fmt.Errorf("upstream %s: response larger than %d bytes: %w", j.shown, j.opts.maxResponse, errResponseTooLarge)
	}
	return resp.StatusCode, data, nil
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
	if !json.Valid(p) {
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
	var resp Response
	if err := json.Unmarshal(data, &resp); err != nil || (resp.Result == nil && resp.Error == nil) {
		return j.notJSONRPC(status, data)
	}
	if resp.Error != nil {
		return rpcFail(rpcOutcome(resp.Error.Code), resp.Error)
	}
	if status/100 != 2 {
		return j.notJSONRPC(status, data)
	}
	if !bytes.Equal(compactJSON(resp.ID), compactJSON(c.ID)) {
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
	return workers.OK(data)
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

// compactJSON returns v without insignificant space, for comparing ids.
func compactJSON(v json.RawMessage) []byte {
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return v
	}
	return b.Bytes()
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

// describeJSONError turns a decode error of one field into a short
// message. TODO(restructure): one copy, in the HTTP house.
func describeJSONError(err error) string {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return fmt.Sprintf("want %s, got JSON %s", te.Type, te.Value)
	}
	return err.Error()
}
