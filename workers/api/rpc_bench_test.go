package api

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers/dispatch"
	"github.com/workmesh/workmesh/workers/workertest"
)

// BenchmarkRPCServeHTTP is the endpoint's own cost for one request, the
// dispatch answering at once with an upstream's response: what /v1/rpc
// adds on a node's hot path besides the dispatch and the HTTP server.
func BenchmarkRPCServeHTTP(b *testing.B) {
	out := []byte(`{"jsonrpc":"2.0","id":7,"result":"0x64"}`)
	h, err := NewRPC(func(_ context.Context, req dispatch.WorkRequest) dispatch.WorkResult {
		return dispatch.WorkResult{Status: apiv1.StatusOK, Output: out, Worker: "w"}
	}, WithLogger(workertest.QuietLogger()))
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"jsonrpc":"2.0","id":7,"method":"eth_blockNumber","params":[]}`)
	want := `{"jsonrpc":"2.0","id":7,"result":"0x64"}`
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, RPCPath, bytes.NewReader(body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if got := string(bytes.TrimSpace(w.Body.Bytes())); got != want {
			b.Fatalf("answer %s, want %s", got, want)
		}
	}
}
