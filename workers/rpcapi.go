package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// RPCPath is where a node serves JSON-RPC 2.0: POST a request or a batch,
// as to any Ethereum endpoint.
const RPCPath = "/v1/rpc"

// Defaults of the JSON-RPC endpoint.
const (
	// DefaultRPCMaxBody bounds a request body.
	DefaultRPCMaxBody = DefaultAPIMaxBody
	// DefaultRPCConcurrency is how many requests of one batch are
	// dispatched at once.
	DefaultRPCConcurrency = 8
)

type rpcConfig struct {
	maxBody     int64
	maxBatch    int
	concurrency int
	timeout     time.Duration
	workType    string
	log         logrus.FieldLogger
}

// RPCOption adjusts an RPCHandler.
type RPCOption func(*rpcConfig) error

// WithRPCMaxBody bounds a request body, in bytes (default DefaultRPCMaxBody).
func WithRPCMaxBody(n int64) RPCOption {
	return func(c *rpcConfig) error {
		if n < 64 {
			return fmt.Errorf("JSON-RPC endpoint: max body %d bytes: want at least 64", n)
		}
		c.maxBody = n
		return nil
	}
}

// WithRPCMaxBatch bounds the requests of one batch (default
// DefaultJSONRPCMaxBatch).
func WithRPCMaxBatch(n int) RPCOption {
	return func(c *rpcConfig) error {
		if n < 1 {
			return fmt.Errorf("JSON-RPC endpoint: max batch %d: want at least 1", n)
		}
		c.maxBatch = n
		return nil
	}
}

// WithRPCConcurrency sets how many requests of one batch are dispatched at
// once (default DefaultRPCConcurrency).
func WithRPCConcurrency(n int) RPCOption {
	return func(c *rpcConfig) error {
		if n < 1 {
			return fmt.Errorf("JSON-RPC endpoint: concurrency %d: want at least 1", n)
		}
		c.concurrency = n
		return nil
	}
}

// WithRPCTimeout bounds each request's dispatch (default
// DefaultRequestTimeout).
func WithRPCTimeout(d time.Duration) RPCOption {
	return func(c *rpcConfig) error {
		if d <= 0 {
			return fmt.Errorf("JSON-RPC endpoint: timeout %s: want more than 0", d)
		}
		c.timeout = d
		return nil
	}
}

// WithRPCWorkType sets the work type requests are dispatched as (default
// JSONRPCType), for a network that names its chains' types apart.
func WithRPCWorkType(name string) RPCOption {
	return func(c *rpcConfig) error {
		if err := ValidateTypeName(name); err != nil {
			return fmt.Errorf("JSON-RPC endpoint: %w", err)
		}
		c.workType = name
		return nil
	}
}

// WithRPCLogger sets the logger for failures to write a response.
func WithRPCLogger(log logrus.FieldLogger) RPCOption {
	return func(c *rpcConfig) error {
		if log == nil {
			return errors.New("JSON-RPC endpoint: nil logger")
		}
		c.log = log
		return nil
	}
}

// RPCHandler serves JSON-RPC 2.0 over HTTP POST (RPCPath), so a standard
// Ethereum client can use a workmesh node as its endpoint. Each request
// (each element of a batch) is dispatched as jsonrpc work, with the block
// it names (BlockOf) as MinHead so the beyond-head rule applies; the
// answers are standard JSON-RPC responses, batches in request order.
type RPCHandler struct {
	dispatch DispatchFunc
	cfg      rpcConfig
}

// NewRPCHandler returns the JSON-RPC endpoint in front of dispatch
// ((*Dispatcher).Dispatch fits).
func NewRPCHandler(dispatch DispatchFunc, opts ...RPCOption) (*RPCHandler, error) {
	if dispatch == nil {
		return nil, errors.New("JSON-RPC endpoint: nil dispatch function")
	}
	cfg := rpcConfig{
		maxBody:     DefaultRPCMaxBody,
		maxBatch:    DefaultJSONRPCMaxBatch,
		concurrency: DefaultRPCConcurrency,
		timeout:     DefaultRequestTimeout,
		workType:    JSONRPCType,
		log:         logrus.StandardLogger(),
	}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	return &RPCHandler{dispatch: dispatch, cfg: cfg}, nil
}

// Register mounts the endpoint at RPCPath with handle;
// (*node.Node).HandleAPI fits.
func (h *RPCHandler) Register(handle func(pattern string, h http.Handler) error) error {
	if err := handle(RPCPath, h); err != nil {
		return fmt.Errorf("JSON-RPC endpoint: mount %s: %w", RPCPath, err)
	}
	return nil
}

var nullID = json.RawMessage("null")

// ServeHTTP answers a POST of one JSON-RPC request or a batch. Errors in
// the request itself are JSON-RPC errors with HTTP 200, as clients expect;
// only a wrong method (405) and a body over the limit (413) change the
// HTTP status.
func (h *RPCHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.write(w, http.StatusMethodNotAllowed, errorResponse(nullID, &RPCError{
			Code: RPCInvalidRequest, Message: fmt.Sprintf("%s %s: want POST with a JSON-RPC 2.0 request", r.Method, r.URL.Path)}))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.maxBody))
	if err != nil {
		if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
			h.write(w, http.StatusRequestEntityTooLarge, errorResponse(nullID, &RPCError{
				Code: RPCInvalidRequest, Message: fmt.Sprintf("request body larger than %d bytes", mbe.Limit)}))
			return
		}
		h.write(w, http.StatusBadRequest, errorResponse(nullID, &RPCError{Code: RPCParseError, Message: "read the request body: " + err.Error()}))
		return
	}
	body = bytes.TrimSpace(body)
	if !json.Valid(body) {
		h.write(w, http.StatusOK, errorResponse(nullID, &RPCError{Code: RPCParseError, Message: "parse error: the body is not valid JSON"}))
		return
	}
	if body[0] != '[' {
		resp, ok := h.serveOne(r.Context(), body)
		if !ok {
			w.WriteHeader(http.StatusNoContent) // a notification
			return
		}
		h.write(w, http.StatusOK, resp)
		return
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(body, &raws); err != nil {
		h.write(w, http.StatusOK, errorResponse(nullID, &RPCError{Code: RPCInvalidRequest, Message: "invalid request: " + err.Error()}))
		return
	}
	switch {
	case len(raws) == 0:
		h.write(w, http.StatusOK, errorResponse(nullID, &RPCError{Code: RPCInvalidRequest, Message: "invalid request: empty batch"}))
		return
	case len(raws) > h.cfg.maxBatch:
		h.write(w, http.StatusOK, errorResponse(nullID, &RPCError{Code: RPCInvalidRequest,
			Message: fmt.Sprintf("invalid request: batch of %d requests, more than %d", len(raws), h.cfg.maxBatch)}))
		return
	}
	resps := h.serveBatch(r.Context(), raws)
	if len(resps) == 0 {
		w.WriteHeader(http.StatusNoContent) // only notifications
		return
	}
	h.write(w, http.StatusOK, resps)
}

// serveBatch dispatches a batch's requests, at most concurrency at once,
// and returns their answers in request order, notifications left out.
func (h *RPCHandler) serveBatch(ctx context.Context, raws []json.RawMessage) []rpcResponse {
	out := make([]rpcResponse, len(raws))
	answered := make([]bool, len(raws))
	sem := make(chan struct{}, h.cfg.concurrency)
	var wg sync.WaitGroup
	for i, raw := range raws {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], answered[i] = h.serveOne(ctx, raw)
		})
	}
	wg.Wait()
	resps := out[:0]
	for i := range out {
		if answered[i] {
			resps = append(resps, out[i])
		}
	}
	return resps
}

// serveOne checks and dispatches one request; false means it was a
// notification and has no answer.
func (h *RPCHandler) serveOne(ctx context.Context, raw json.RawMessage) (rpcResponse, bool) {
	c, perr := parseCall(raw)
	if perr != nil {
		id := c.ID
		if id == nil {
			id = nullID
		}
		return errorResponse(id, perr), true
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return errorResponse(c.ID, &RPCError{Code: RPCInternalError, Message: "encode the request: " + err.Error()}), !c.notification()
	}
	req := WorkRequest{Type: h.cfg.workType, Payload: payload, Timeout: h.cfg.timeout}
	if n, ok := BlockOf(c.Method, c.Params); ok {
		req.MinHead = &n
	}
	res := h.dispatch(ctx, req)
	if c.notification() {
		return rpcResponse{}, false
	}
	return answerOf(c.ID, res), true
}

// answerOf turns a dispatch result into the JSON-RPC response for id.
func answerOf(id json.RawMessage, res WorkResult) rpcResponse {
	switch res.Status {
	case StatusOK:
		var up rpcResponse
		if err := json.Unmarshal(res.Output, &up); err != nil || (up.Result == nil && up.Error == nil) {
			return errorResponse(id, workmeshError(res, fmt.Sprintf("worker %s answered without a JSON-RPC response", res.Worker)))
		}
		if up.Error != nil {
			return errorResponse(id, up.Error)
		}
		return rpcResponse{JSONRPC: "2.0", ID: id, Result: up.Result}
	case StatusEmpty:
		return rpcResponse{JSONRPC: "2.0", ID: id, Result: nullID}
	}
	// A worker decided the request with its upstream's error: that error
	// is the answer (invalid params, a revert).
	if e, ok := ParseRPCError(res.Error); ok && res.Worker != "" {
		return errorResponse(id, e)
	}
	// Every worker tried had nothing: null is the answer.
	if allOutcomes(res.Attempts, "empty") {
		return rpcResponse{JSONRPC: "2.0", ID: id, Result: nullID}
	}
	if allOutcomes(res.Attempts, "busy") {
		return errorResponse(id, workmeshErrorCode(res, RPCLimitExceeded, "every worker tried is rate limited: "+res.Error))
	}
	// Otherwise the last upstream error heard says most about why (a
	// method that no upstream has, a block none has yet).
	for i := len(res.Attempts) - 1; i >= 0; i-- {
		if e, ok := ParseRPCError(res.Attempts[i].Error); ok {
			return errorResponse(id, e)
		}
	}
	msg := res.Error
	if msg == "" {
		msg = "request ended with status " + string(res.Status)
	}
	return errorResponse(id, workmeshError(res, msg))
}

// allOutcomes reports whether there are attempts and all ended in outcome.
func allOutcomes(as []Attempt, outcome string) bool {
	for _, a := range as {
		if a.Outcome != outcome {
			return false
		}
	}
	return len(as) > 0
}

// workmeshError is an internal error naming what workmesh saw.
func workmeshError(res WorkResult, msg string) *RPCError {
	return workmeshErrorCode(res, RPCInternalError, msg)
}

func workmeshErrorCode(res WorkResult, code int, msg string) *RPCError {
	data, _ := json.Marshal(struct {
		Status    Status `json:"workmesh_status"`
		RequestID string `json:"request_id,omitempty"`
		Attempts  int    `json:"attempts"`
	}{res.Status, res.RequestID, len(res.Attempts)})
	return &RPCError{Code: code, Message: "workmesh: " + msg, Data: data}
}

func errorResponse(id json.RawMessage, e *RPCError) rpcResponse {
	return rpcResponse{JSONRPC: "2.0", ID: id, Error: e}
}

func (h *RPCHandler) write(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		h.cfg.log.Debugf("JSON-RPC endpoint: write response: %v", err)
	}
}
