package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/sirupsen/logrus"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/node/httpapi"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
	"github.com/workmesh/workmesh/workers/jsonrpc"
)

// RPCPath is where a node serves JSON-RPC 2.0: POST a request or a batch,
// as to any Ethereum endpoint.
const RPCPath = "/v1/rpc"

// Defaults of the JSON-RPC endpoint.
const (
	// DefaultRPCMaxBody bounds a request body.
	DefaultRPCMaxBody = apiv1.DefaultMaxBody
	// DefaultRPCConcurrency is how many requests of one batch are
	// dispatched at once.
	DefaultRPCConcurrency = 8
)

// RPC serves JSON-RPC 2.0 over HTTP POST (RPCPath), so a standard
// Ethereum client can use a workmesh node as its endpoint. Each request
// (each element of a batch) is dispatched as jsonrpc work, with the block
// it names (BlockOf) as MinHead so the beyond-head rule applies; the
// answers are standard JSON-RPC responses, batches in request order.
type RPC struct {
	dispatch DispatchFunc
	cfg      settings
}

// NewRPCHandler returns the JSON-RPC endpoint in front of dispatch
// ((*Dispatcher).Dispatch fits).
func NewRPC(do DispatchFunc, opts ...Option) (*RPC, error) {
	if do == nil {
		return nil, errors.New("JSON-RPC endpoint: nil dispatch function")
	}
	cfg, err := apply(settings{
		maxBody:     DefaultRPCMaxBody,
		maxBatch:    jsonrpc.DefaultMaxBatch,
		concurrency: DefaultRPCConcurrency,
		timeout:     dispatch.DefaultRequestTimeout,
		workType:    jsonrpc.Type,
		log:         logrus.StandardLogger(),
	}, "JSON-RPC endpoint", opts)
	if err != nil {
		return nil, err
	}
	return &RPC{dispatch: do, cfg: cfg}, nil
}

// Register mounts the endpoint at RPCPath with handle;
// (*node.Node).HandleAPI fits.
func (h *RPC) Register(handle func(pattern string, h http.Handler) error) error {
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
func (h *RPC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.write(w, http.StatusMethodNotAllowed, errorResponse(nullID, &jsonrpc.RPCError{
			Code: jsonrpc.RPCInvalidRequest, Message: fmt.Sprintf("%s %s: want POST with a JSON-RPC 2.0 request", r.Method, r.URL.Path)}))
		return
	}
	body, err := readBody(w, r, h.cfg.maxBody)
	if err != nil {
		if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
			h.write(w, http.StatusRequestEntityTooLarge, errorResponse(nullID, &jsonrpc.RPCError{
				Code: jsonrpc.RPCInvalidRequest, Message: fmt.Sprintf("request body larger than %d bytes", mbe.Limit)}))
			return
		}
		h.write(w, http.StatusBadRequest, errorResponse(nullID, &jsonrpc.RPCError{Code: jsonrpc.RPCParseError, Message: "read the request body: " + err.Error()}))
		return
	}
	body = bytes.TrimSpace(body)
	if !jsonrpc.Valid(body) {
		h.write(w, http.StatusOK, errorResponse(nullID, &jsonrpc.RPCError{Code: jsonrpc.RPCParseError, Message: "parse error: the body is not valid JSON"}))
		return
	}
	if body[0] != '[' {
		resp, ok := h.serveOne(r.Context(), body)
		if !ok {
			w.WriteHeader(http.StatusNoContent) // a notification
			return
		}
		h.writeOne(w, resp)
		return
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(body, &raws); err != nil {
		h.write(w, http.StatusOK, errorResponse(nullID, &jsonrpc.RPCError{Code: jsonrpc.RPCInvalidRequest, Message: "invalid request: " + err.Error()}))
		return
	}
	switch {
	case len(raws) == 0:
		h.write(w, http.StatusOK, errorResponse(nullID, &jsonrpc.RPCError{Code: jsonrpc.RPCInvalidRequest, Message: "invalid request: empty batch"}))
		return
	case len(raws) > h.cfg.maxBatch:
		h.write(w, http.StatusOK, errorResponse(nullID, &jsonrpc.RPCError{Code: jsonrpc.RPCInvalidRequest,
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
func (h *RPC) serveBatch(ctx context.Context, raws []json.RawMessage) []jsonrpc.Response {
	out := make([]jsonrpc.Response, len(raws))
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
func (h *RPC) serveOne(ctx context.Context, raw json.RawMessage) (jsonrpc.Response, bool) {
	c, perr := jsonrpc.ParseCall(raw)
	if perr != nil {
		id := c.ID
		if id == nil {
			id = nullID
		}
		return errorResponse(id, perr), true
	}
	// The request goes on as workmesh read it, re-encoded: what the worker
	// and its upstream see is what the checks and BlockOf here saw (a
	// duplicate key, say, cannot name one method here and another there).
	payload, err := jsonrpc.EncodeCall(c)
	if err != nil {
		return errorResponse(c.ID, &jsonrpc.RPCError{Code: jsonrpc.RPCInternalError, Message: "encode the request: " + err.Error()}), !c.Notification()
	}
	req := dispatch.WorkRequest{Type: h.cfg.workType, Payload: payload, Timeout: h.cfg.timeout}
	if n, ok := jsonrpc.BlockOf(c.Method, c.Params); ok {
		minHead := n // on the heap only for the requests that name a block
		req.MinHead = &minHead
	}
	res := h.dispatch(ctx, req)
	if c.Notification() {
		return jsonrpc.Response{}, false
	}
	return answerOf(c.ID, res), true
}

// answerOf turns a dispatch result into the JSON-RPC response for id.
func answerOf(id json.RawMessage, res dispatch.WorkResult) jsonrpc.Response {
	switch res.Status {
	case apiv1.StatusOK:
		up, err := jsonrpc.DecodeResponse(res.Output)
		if err != nil || (up.Result == nil && up.Error == nil) {
			return errorResponse(id, workmeshError(res, fmt.Sprintf("worker %s answered without a JSON-RPC response", res.Worker)))
		}
		if up.Error != nil {
			return errorResponse(id, up.Error)
		}
		return jsonrpc.Response{JSONRPC: "2.0", ID: id, Result: up.Result}
	case apiv1.StatusEmpty:
		return jsonrpc.Response{JSONRPC: "2.0", ID: id, Result: nullID}
	}
	// A worker decided the request with its upstream's error: that error
	// is the answer (invalid params, a revert).
	if e, ok := jsonrpc.ParseRPCError(res.Error); ok && res.Worker != "" {
		return errorResponse(id, e)
	}
	// Every worker tried had nothing: null is the answer.
	if allOutcomes(res.Attempts, workers.Empty) {
		return jsonrpc.Response{JSONRPC: "2.0", ID: id, Result: nullID}
	}
	if allOutcomes(res.Attempts, workers.Busy) {
		return errorResponse(id, workmeshErrorCode(res, jsonrpc.RPCLimitExceeded, "every worker tried is rate limited: "+res.Error))
	}
	// Otherwise the last upstream error heard says most about why (a
	// method that no upstream has, a block none has yet).
	for i := len(res.Attempts) - 1; i >= 0; i-- {
		if e, ok := jsonrpc.ParseRPCError(res.Attempts[i].Error); ok {
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
func allOutcomes(as []apiv1.Attempt, outcome workers.Outcome) bool {
	for _, a := range as {
		if a.Outcome != outcome {
			return false
		}
	}
	return len(as) > 0
}

// workmeshError is an internal error naming what workmesh saw.
func workmeshError(res dispatch.WorkResult, msg string) *jsonrpc.RPCError {
	return workmeshErrorCode(res, jsonrpc.RPCInternalError, msg)
}

func workmeshErrorCode(res dispatch.WorkResult, code int, msg string) *jsonrpc.RPCError {
	data, _ := json.Marshal(struct {
		Status    apiv1.Status `json:"workmesh_status"`
		RequestID string       `json:"request_id,omitempty"`
		Attempts  int          `json:"attempts"`
	}{res.Status, res.RequestID, len(res.Attempts)})
	return &jsonrpc.RPCError{Code: code, Message: "workmesh: " + msg, Data: data}
}

func errorResponse(id json.RawMessage, e *jsonrpc.RPCError) jsonrpc.Response {
	return jsonrpc.Response{JSONRPC: "2.0", ID: id, Error: e}
}

// readBody reads the request body, at most limit bytes, into a buffer
// sized from its Content-Length (up to bodyPresize: a length is only a
// claim until the bytes arrive).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	size := int64(512)
	if n := r.ContentLength; n > 0 {
		size = min(n, limit, bodyPresize) + 1
	}
	buf := bytes.NewBuffer(make([]byte, 0, size+bytes.MinRead))
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	return buf.Bytes(), err
}

// bodyPresize bounds the buffer readBody makes before the body arrives.
const bodyPresize = 64 << 10

// writeOne answers with one response: a success is written without
// encoding/json's reflection, with its length, byte for byte as write
// would.
func (h *RPC) writeOne(w http.ResponseWriter, resp jsonrpc.Response) {
	if resp.Error == nil && resp.JSONRPC == "2.0" {
		if head, ok := jsonrpc.ResultHead(resp.ID, resp.Result); ok {
			// The result goes out as the worker sent it, not copied.
			jsonHeader(w, len(head)+len(resp.Result)+len(jsonrpc.ResultTail))
			if h.writePart(w, head) && h.writePart(w, resp.Result) {
				h.writePart(w, []byte(jsonrpc.ResultTail))
			}
			return
		}
		if b, ok := jsonrpc.AppendResult(make([]byte, 0, 40+len(resp.ID)+len(resp.Result)), resp.ID, resp.Result); ok {
			jsonHeader(w, len(b))
			h.writePart(w, b)
			return
		}
	}
	h.write(w, http.StatusOK, resp)
}

// jsonContentType is the Content-Type of every answer, one value that
// all share: the server copies a handler's header when it is written and
// changes none of its values in place.
var jsonContentType = []string{"application/json"}

// smallAnswer is the size under which the server announces an answer's
// length itself (net/http does below a few KB when the handler returns
// without flushing), so the handler need not make the header line.
const smallAnswer = 1024

// jsonHeader starts a 200 answer of n bytes of JSON.
func jsonHeader(w http.ResponseWriter, n int) {
	hdr := w.Header()
	hdr["Content-Type"] = jsonContentType
	if n >= smallAnswer {
		hdr["Content-Length"] = []string{strconv.Itoa(n)}
		w.WriteHeader(http.StatusOK)
	}
}

// writePart writes b, and logs and says so when it cannot.
func (h *RPC) writePart(w http.ResponseWriter, b []byte) bool {
	if _, err := w.Write(b); err != nil {
		h.cfg.log.Debugf("JSON-RPC endpoint: write response: %v", err)
		return false
	}
	return true
}

// write answers with a JSON-RPC 2.0 body (a response, an error response or
// a batch of them), on one line: JSON-RPC clients read it, and its errors
// are JSON-RPC's, not the API's error shape.
func (h *RPC) write(w http.ResponseWriter, code int, v any) {
	if err := httpapi.WriteCompactJSON(w, code, v); err != nil {
		h.cfg.log.Debugf("JSON-RPC endpoint: write response: %v", err)
	}
}
