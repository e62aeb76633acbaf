package jsonrpc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/workmesh/workmesh/node/httpapi"
	"github.com/workmesh/workmesh/workers"
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
// whenever it could be read, so an error answer can carry it. The call's
// ID and Params may share raw's bytes.
func ParseCall(raw json.RawMessage) (Call, *RPCError) {
	var c Call
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return c, &RPCError{Code: RPCInvalidRequest, Message: "invalid request: want a JSON object"}
	}
	if fast, ok := parseCallFast(raw); ok {
		c = fast
	} else if key, ok := ambiguousMember(raw); ok {
		return c, &RPCError{Code: RPCInvalidRequest, Message: fmt.Sprintf("invalid request: member %q: each of jsonrpc, id, method and params at most once, written in lower case", workers.Truncate(key, 32))}
	} else if err := json.Unmarshal(raw, &c); err != nil {
		// Keep the id if it alone can be read.
		var idOnly struct {
			ID json.RawMessage `json:"id"`
		}
		if json.Unmarshal(raw, &idOnly) == nil && validID(idOnly.ID) {
			c.ID = idOnly.ID
		} else {
			c.ID = nil
		}
		return c, &RPCError{Code: RPCInvalidRequest, Message: "invalid request: " + httpapi.DescribeJSONError(err)}
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

// ambiguousMember returns a member key of the request object raw that
// makes it read two ways: one that encoding/json takes for jsonrpc, id,
// method or params (case folded, escapes undone) but that is not that name
// as written, or a second of one of them. Decoders differ on those (Go's
// takes the last match in any case; others take the exact name, or the
// first), and the payload goes to the upstream as it is: a method checked
// here (jsonrpc-methods) must be the one the upstream runs. ok is false
// for a plain object, and for one that is not valid JSON (json.Unmarshal
// says what is wrong with it).
func ambiguousMember(raw []byte) (key string, ok bool) {
	if !validJSON(raw) {
		return "", false
	}
	var seen [4]bool
	eachMember(raw, func(k, _ []byte) bool {
		name := string(k)
		if !plainKey(k) {
			var s string
			if json.Unmarshal(append(append([]byte{'"'}, k...), '"'), &s) != nil {
				return true
			}
			name = s
		}
		for i, m := range callMembers {
			if !strings.EqualFold(name, m) {
				continue
			}
			if seen[i] || string(k) != m {
				key, ok = name, true
				return false
			}
			seen[i] = true
		}
		return true
	})
	return key, ok
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

// sameID reports whether two ids are the same JSON value up to
// insignificant space (an upstream may space its answer's id otherwise).
func sameID(a, b json.RawMessage) bool {
	return bytes.Equal(a, b) || bytes.Equal(compactJSON(a), compactJSON(b))
}

// compactJSON returns v without insignificant space, for comparing ids.
func compactJSON(v json.RawMessage) []byte {
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return v
	}
	return b.Bytes()
}
