package jsonrpc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/httpwork"
)

// What Do makes of a payload and of the upstream's answer: the calls it
// holds, and the outcome the answer means.

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

// notRelayed answers a payload with a call of a method jsonrpc-methods
// does not relay, as the upstream would a method it does not have: the
// whole payload, a batch too, goes nowhere, and another worker may relay
// it (unsupported is final for this worker only).
func (j *Relay) notRelayed(calls []Call) *RPCError {
	for _, c := range calls {
		if !methodRelayed(j.cfg.Methods, c.Method) {
			return &RPCError{Code: RPCMethodNotFound,
				Message: fmt.Sprintf("method not found: %s is not relayed by this worker (jsonrpc-methods)", workers.Truncate(c.Method, 64))}
		}
	}
	return nil
}

// methodRelayed reports whether patterns (jsonrpc-methods) let method
// through: a pattern is the method's name, a prefix of it ending in "*",
// or "*"; no patterns let every method through.
func methodRelayed(patterns []string, method string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(method, prefix) {
				return true
			}
		} else if p == method {
			return true
		}
	}
	return false
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
