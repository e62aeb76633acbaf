package jsonrpc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/workertest"
)

// answerInMemory is an http.RoundTripper that answers every JSON-RPC
// request at once with result "0x64", so a benchmark sees the relay's own
// cost and not the network's.
type answerInMemory struct{}

func (answerInMemory) RoundTrip(r *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	var c Call
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, err
	}
	out := []byte(`{"jsonrpc":"2.0","id":` + string(c.ID) + `,"result":"0x64"}`)
	return &http.Response{
		StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(out)),
		ContentLength: int64(len(out)), Request: r,
	}, nil
}

// BenchmarkRelayDo is the jsonrpc type's own cost for one request (parse,
// request, read, classify), its upstream answering in memory.
func BenchmarkRelayDo(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	j, err := New(ctx, config.JSONRPCConfig{Upstream: "http://127.0.0.1:1/rpc", HeadInterval: time.Hour},
		workertest.QuietLogger(), WithClient(&http.Client{Transport: answerInMemory{}}))
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		id := strconv.Itoa(i)
		res := j.Do(ctx, []byte(`{"jsonrpc":"2.0","id":`+id+`,"method":"eth_blockNumber","params":[]}`))
		if res.Outcome != workers.Success || string(res.Output) != `{"jsonrpc":"2.0","id":`+id+`,"result":"0x64"}` {
			b.Fatalf("result %+v", res)
		}
	}
}

// BenchmarkRelayDoLoopback is one request relayed to an upstream on
// loopback over kept-alive connections, its request handed to the
// transport directly (as a plain client's are) and through Client.Do (as
// before, and as a client with a cookie jar's still are), from 1 and 32
// goroutines.
func BenchmarkRelayDoLoopback(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c, perr := ParseCall(body)
		if perr != nil {
			http.Error(w, perr.Message, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":`+string(c.ID)+`,"result":"0x64"}`)
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	j, err := New(ctx, config.JSONRPCConfig{Upstream: srv.URL, HeadInterval: time.Hour}, workertest.QuietLogger())
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	direct := j.direct
	for _, via := range []string{"transport", "client.Do"} {
		for _, par := range []int{1, 32} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", via, par), func(b *testing.B) {
				j.direct = direct
				if via == "client.Do" {
					j.direct = nil
				}
				b.ReportAllocs()
				b.SetParallelism(par)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						res := j.Do(ctx, []byte(`{"jsonrpc":"2.0","id":7,"method":"eth_blockNumber","params":[]}`))
						if res.Outcome != workers.Success || string(res.Output) != `{"jsonrpc":"2.0","id":7,"result":"0x64"}` {
							b.Errorf("result %+v", res)
							return
						}
					}
				})
			})
		}
	}
}
