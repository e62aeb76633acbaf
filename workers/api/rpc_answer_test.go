package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
	"github.com/workmesh/workmesh/workers/jsonrpc"
)

// A single answer is one line of JSON with its length, the client's id
// and the upstream's result, the same bytes whatever path wrote it (the
// plain one or encoding/json for results with HTML characters or
// U+2028); the dispatched payload is the request as json.Marshal writes
// it. Its length is announced whether the answer is small (the server
// counts it) or not (the handler says it).
func TestRPCHandler_SingleAnswerBytes(t *testing.T) {
	var (
		mu       sync.Mutex
		payloads [][]byte
	)
	srv := rpcEndpoint(t, func(_ context.Context, req dispatch.WorkRequest) dispatch.WorkResult {
		mu.Lock()
		payloads = append(payloads, req.Payload)
		mu.Unlock()
		var c jsonrpc.Call
		json.Unmarshal(req.Payload, &c)
		// The upstream spaces its answer and echoes the params as result.
		out := []byte(`{ "jsonrpc": "2.0", "id": ` + string(c.ID) + `, "result": ` + string(c.Params) + ` }`)
		return dispatch.WorkResult{Status: apiv1.StatusOK, Output: out, Worker: "peer-a"}
	})
	for _, c := range []struct{ id, params string }{
		{`7`, `["0x64"]`},
		{`"a b"`, `[{"to": "0xab", "data": "0x"}, "latest"]`},
		{`null`, `["<b>&amp;"]`},
		{`-1.5e3`, "[\"\u2028\"]"},
		{`8`, `["` + strings.Repeat("a", smallAnswer) + `"]`},
		{`9`, `["` + strings.Repeat("b", 64<<10) + `"]`},
	} {
		body := `{"jsonrpc":"2.0","id":` + c.id + `,"method":"eth_call","params":` + c.params + `}`
		resp, err := http.Post(srv.URL+RPCPath, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var want bytes.Buffer
		var params json.RawMessage
		json.Unmarshal([]byte(c.params), &params) // what a decoded result holds
		json.NewEncoder(&want).Encode(jsonrpc.Response{JSONRPC: "2.0", ID: json.RawMessage(c.id), Result: params})
		if resp.StatusCode != http.StatusOK || !bytes.Equal(got, want.Bytes()) || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("request %s: HTTP %d %s %q, want 200 application/json %q", body, resp.StatusCode, resp.Header.Get("Content-Type"), got, want.Bytes())
		}
		if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(got)) || len(resp.TransferEncoding) > 0 {
			t.Errorf("request %s: Content-Length %q (transfer encoding %q) for %d bytes, want it announced", workers.Truncate(body, 80), cl, resp.TransferEncoding, len(got))
		}
		var call jsonrpc.Call
		json.Unmarshal([]byte(body), &call)
		wantPayload, _ := json.Marshal(call)
		mu.Lock()
		p := payloads[len(payloads)-1]
		mu.Unlock()
		if !bytes.Equal(p, wantPayload) {
			t.Errorf("request %s: dispatched %s, want %s", body, p, wantPayload)
		}
	}
}

// A body larger than the buffer made before it arrives (64 KiB) is read
// whole; its Content-Length is a claim only: a client that announces more
// than it sends gets a read error, not a dispatch.
func TestRPCHandler_LargeBody(t *testing.T) {
	var dispatched atomic.Int64
	srv := rpcEndpoint(t, func(ctx context.Context, req dispatch.WorkRequest) dispatch.WorkResult {
		dispatched.Add(1)
		return upstreamOK(ctx, req)
	}, WithMaxBody(1<<20))
	big := `{"jsonrpc":"2.0","id":1,"method":"eth_call","params":["` + strings.Repeat("ab", 100<<10) + `"]}`
	code, body := postRPC(t, srv, big)
	if r := decodeOne(t, body); code != http.StatusOK || string(r.Result) != `"eth_call"` || dispatched.Load() != 1 {
		t.Fatalf("a %d-byte request: HTTP %d %s, %d dispatched", len(big), code, body, dispatched.Load())
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+RPCPath, io.MultiReader(strings.NewReader(big[:1000]), errReader{}))
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = int64(len(big))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	if dispatched.Load() != 1 {
		t.Fatalf("a body cut short was dispatched")
	}
}

// errReader fails: a client whose body breaks off.
type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }
