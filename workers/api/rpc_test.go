package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
	"github.com/workmesh/workmesh/workers/jsonrpc"
	"github.com/workmesh/workmesh/workers/workertest"
)

// rpcEndpoint serves an RPC over a fake dispatch.
func rpcEndpoint(t *testing.T, dispatch DispatchFunc, opts ...Option) *httptest.Server {
	t.Helper()
	opts = append([]Option{WithLogger(workertest.QuietLogger())}, opts...)
	h, err := NewRPC(dispatch, opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func postRPC(t *testing.T, srv *httptest.Server, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(srv.URL+RPCPath, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

func decodeOne(t *testing.T, body []byte) jsonrpc.Response {
	t.Helper()
	var r jsonrpc.Response
	if err := json.Unmarshal(body, &r); err != nil || r.JSONRPC != "2.0" {
		t.Fatalf("response %s: %v", body, err)
	}
	return r
}

// upstreamOK answers a payload as an upstream would: its method as result.
func upstreamOK(_ context.Context, req dispatch.WorkRequest) dispatch.WorkResult {
	var c jsonrpc.Call
	json.Unmarshal(req.Payload, &c)
	out, _ := json.Marshal(jsonrpc.Response{JSONRPC: "2.0", ID: c.ID, Result: json.RawMessage(`"` + c.Method + `"`)})
	return dispatch.WorkResult{Status: apiv1.StatusOK, Output: out, Worker: "peer-a"}
}

func TestRPCHandler_Single(t *testing.T) {
	var got []dispatch.WorkRequest
	var mu sync.Mutex
	srv := rpcEndpoint(t, func(ctx context.Context, req dispatch.WorkRequest) dispatch.WorkResult {
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		return upstreamOK(ctx, req)
	}, WithTimeout(3*time.Second))

	code, body := postRPC(t, srv, `{"jsonrpc":"2.0","id":"a-1","method":"eth_getBlockByNumber","params":["0x65",false],"extra":1}`)
	r := decodeOne(t, body)
	if code != 200 || string(r.ID) != `"a-1"` || string(r.Result) != `"eth_getBlockByNumber"` || r.Error != nil {
		t.Fatalf("HTTP %d %s", code, body)
	}
	req := got[0]
	if req.Type != jsonrpc.Type || req.MinHead == nil || *req.MinHead != 101 || req.Timeout != 3*time.Second {
		t.Fatalf("dispatched %+v, want type jsonrpc, min head 101, timeout 3s", req)
	}
	if strings.Contains(string(req.Payload), "extra") || !strings.Contains(string(req.Payload), `"params":["0x65",false]`) {
		t.Fatalf("payload %s, want the request without unknown fields", req.Payload)
	}
	postRPC(t, srv, `{"jsonrpc":"2.0","id":2,"method":"eth_getBlockByNumber","params":["latest",false]}`)
	if got[1].MinHead != nil {
		t.Fatalf("\"latest\" dispatched with min head %d", *got[1].MinHead)
	}
	// A notification is dispatched and has no answer.
	code, body = postRPC(t, srv, `{"jsonrpc":"2.0","method":"eth_chainId"}`)
	if code != http.StatusNoContent || len(body) != 0 || len(got) != 3 {
		t.Fatalf("notification: HTTP %d %q, %d dispatched", code, body, len(got))
	}
}

func TestRPCHandler_BadRequests(t *testing.T) {
	var dispatched atomic.Int64
	srv := rpcEndpoint(t, func(ctx context.Context, req dispatch.WorkRequest) dispatch.WorkResult {
		dispatched.Add(1)
		return upstreamOK(ctx, req)
	}, WithMaxBody(256), WithMaxBatch(2))
	for _, c := range []struct {
		body, id string
		code     int
	}{
		{`{"jsonrpc":"2.0","id":1,"method":`, "null", jsonrpc.RPCParseError},
		{``, "null", jsonrpc.RPCParseError},
		{`[]`, "null", jsonrpc.RPCInvalidRequest},
		{`1`, "null", jsonrpc.RPCInvalidRequest},
		{`{"jsonrpc":"2.0","id":7}`, "7", jsonrpc.RPCInvalidRequest},
		{`{"jsonrpc":"1.0","id":"x","method":"a"}`, `"x"`, jsonrpc.RPCInvalidRequest},
		{`{"jsonrpc":"2.0","id":8,"method":"a","params":"p"}`, "8", jsonrpc.RPCInvalidRequest},
		{`{"jsonrpc":"2.0","id":[1],"method":"a"}`, "null", jsonrpc.RPCInvalidRequest},
		{`{"jsonrpc":"2.0","id":9,"method":5}`, "9", jsonrpc.RPCInvalidRequest},
		{`[{},{},{}]`, "null", jsonrpc.RPCInvalidRequest},
	} {
		code, body := postRPC(t, srv, c.body)
		r := decodeOne(t, body)
		if code != 200 || r.Error == nil || r.Error.Code != c.code || string(r.ID) != c.id {
			t.Errorf("body %q: HTTP %d %s; want error %d with id %s", c.body, code, body, c.code, c.id)
		}
	}
	if n := dispatched.Load(); n != 0 {
		t.Fatalf("%d bad requests were dispatched", n)
	}
	code, body := postRPC(t, srv, `{"jsonrpc":"2.0","id":1,"method":"`+strings.Repeat("a", 300)+`"}`)
	if r := decodeOne(t, body); code != http.StatusRequestEntityTooLarge || r.Error.Code != jsonrpc.RPCInvalidRequest {
		t.Fatalf("body over the limit: HTTP %d %s", code, body)
	}
	resp, err := http.Get(srv.URL + RPCPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("GET: HTTP %d", resp.StatusCode)
	}
	// A batch answers each element, the invalid ones with their errors.
	_, body = postRPC(t, srv, `[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":2}]`)
	var rs []jsonrpc.Response
	if err := json.Unmarshal(body, &rs); err != nil || len(rs) != 2 || string(rs[0].Result) != `"a"` || rs[1].Error == nil || rs[1].Error.Code != jsonrpc.RPCInvalidRequest || string(rs[1].ID) != "2" {
		t.Fatalf("mixed batch: %s", body)
	}
}

func TestRPCHandler_BatchConcurrentInOrder(t *testing.T) {
	const conc = 3
	var inFlight, peak atomic.Int64
	srv := rpcEndpoint(t, func(ctx context.Context, req dispatch.WorkRequest) dispatch.WorkResult {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		defer inFlight.Add(-1)
		// Later elements finish first, so order is not arrival order.
		var c jsonrpc.Call
		json.Unmarshal(req.Payload, &c)
		time.Sleep(time.Duration(30-len(c.Method)) * time.Millisecond)
		return upstreamOK(ctx, req)
	}, WithConcurrency(conc))
	var batch []string
	var want []string
	for i := range 12 {
		m := strings.Repeat("m", i+1)
		if i == 5 {
			batch = append(batch, `{"jsonrpc":"2.0","method":"notify"}`)
		}
		batch = append(batch, `{"jsonrpc":"2.0","id":`+jsonInt(i)+`,"method":"`+m+`"}`)
		want = append(want, m)
	}
	start := time.Now()
	_, body := postRPC(t, srv, "["+strings.Join(batch, ",")+"]")
	var rs []jsonrpc.Response
	if err := json.Unmarshal(body, &rs); err != nil || len(rs) != len(want) {
		t.Fatalf("batch: %s (%v)", body, err)
	}
	for i, r := range rs {
		if string(r.ID) != jsonInt(i) || string(r.Result) != `"`+want[i]+`"` {
			t.Fatalf("element %d: %+v, want id %d result %s", i, r, i, want[i])
		}
	}
	if p := peak.Load(); p > conc || p < 2 {
		t.Fatalf("peak concurrency %d, want 2 to %d", p, conc)
	}
	t.Logf("13 requests, %d at once: %s", conc, time.Since(start))
}

func jsonInt(i int) string { b, _ := json.Marshal(i); return string(b) }

func TestRPCHandler_Answers(t *testing.T) {
	errJSON := (&jsonrpc.RPCError{Code: -32602, Message: "invalid argument 0"}).Encode()
	revert := (&jsonrpc.RPCError{Code: 3, Message: "execution reverted", Data: json.RawMessage(`"0x08c3"`)}).Encode()
	notFound := (&jsonrpc.RPCError{Code: -32601, Message: "method not found"}).Encode()
	for _, c := range []struct {
		name   string
		res    dispatch.WorkResult
		result string // the wanted result, or "" for an error
		code   int
		msg    string
	}{
		{"ok", dispatch.WorkResult{Status: apiv1.StatusOK, Output: []byte(`{"jsonrpc":"2.0","id":99,"result":{"a":1}}`)}, `{"a":1}`, 0, ""},
		{"ok with an error response", dispatch.WorkResult{Status: apiv1.StatusOK, Output: []byte(`{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"x"}}`)}, "", -32000, "x"},
		{"ok without a response", dispatch.WorkResult{Status: apiv1.StatusOK, Output: []byte(`garbage`), Worker: "p"}, "", jsonrpc.RPCInternalError, "worker p answered without"},
		{"empty", dispatch.WorkResult{Status: apiv1.StatusEmpty}, "null", 0, ""},
		{"decided by a worker's upstream error", dispatch.WorkResult{Status: apiv1.StatusFailed, Worker: "p", Error: errJSON}, "", -32602, "invalid argument 0"},
		{"revert keeps its data", dispatch.WorkResult{Status: apiv1.StatusFailed, Worker: "p", Error: revert}, "", 3, "execution reverted"},
		{"every worker empty", dispatch.WorkResult{Status: apiv1.StatusFailed, Error: "every attempt failed", Attempts: []apiv1.Attempt{{Outcome: workers.Empty}, {Outcome: workers.Empty}}}, "null", 0, ""},
		{"every worker busy", dispatch.WorkResult{Status: apiv1.StatusFailed, Error: "every attempt failed", Attempts: []apiv1.Attempt{{Outcome: workers.Busy}}}, "", jsonrpc.RPCLimitExceeded, "rate limited"},
		{"last upstream error", dispatch.WorkResult{Status: apiv1.StatusFailed, Error: "every attempt failed", Attempts: []apiv1.Attempt{{Outcome: workers.RetryableError, Error: notFound}, {Outcome: workers.Unreachable, Error: "dial"}}}, "", -32601, "method not found"},
		{"unavailable", dispatch.WorkResult{Status: apiv1.StatusUnavailable, RequestID: "r-1", Error: "no worker could take the work: 0 peers"}, "", jsonrpc.RPCInternalError, "workmesh: no worker could take the work"},
		{"timeout", dispatch.WorkResult{Status: apiv1.StatusTimeout, Error: "no result within 10s", Attempts: []apiv1.Attempt{{Outcome: workers.Cancelled}}}, "", jsonrpc.RPCInternalError, "no result within 10s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := rpcEndpoint(t, func(context.Context, dispatch.WorkRequest) dispatch.WorkResult { return c.res })
			_, body := postRPC(t, srv, `{"jsonrpc":"2.0","id":1,"method":"eth_call","params":[{}]}`)
			r := decodeOne(t, body)
			if string(r.ID) != "1" {
				t.Fatalf("id %s, want the request's", r.ID)
			}
			if c.result != "" {
				if r.Error != nil || string(r.Result) != c.result {
					t.Fatalf("%s, want result %s", body, c.result)
				}
				return
			}
			if r.Error == nil || r.Error.Code != c.code || !strings.Contains(r.Error.Message, c.msg) || r.Result != nil {
				t.Fatalf("%s, want error %d saying %q", body, c.code, c.msg)
			}
		})
	}
}
