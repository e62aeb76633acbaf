package jsonrpc

import (
	"bytes"
	"encoding/json"
	"testing"
)

// encodeCases are calls and responses as ParseCall and an upstream give
// them: plain ones (the fast path) and every kind the fast path leaves to
// encoding/json (escapes, HTML characters, U+2028, non-ASCII, space,
// invalid raw values).
var encodeCases = []Call{
	{JSONRPC: "2.0", ID: json.RawMessage(`7`), Method: "eth_blockNumber", Params: json.RawMessage(`[]`)},
	{JSONRPC: "2.0", ID: json.RawMessage(`"a-b"`), Method: "eth_getBalance", Params: json.RawMessage(`["0xabc", "latest"]`)},
	{JSONRPC: "2.0", Method: "eth_subscribe"},
	{JSONRPC: "2.0", ID: json.RawMessage(`null`), Method: "m", Params: json.RawMessage(`null`)},
	{JSONRPC: "2.0", ID: json.RawMessage(` 12 `), Method: "m", Params: json.RawMessage("{\n\t\"a\" : [1, 2]\r\n}")},
	{JSONRPC: "2.0", ID: json.RawMessage(`1`), Method: "m<script>", Params: json.RawMessage(`["<b>&"]`)},
	{JSONRPC: "2.0", ID: json.RawMessage(`1`), Method: "a&b", Params: json.RawMessage(`["a&b"]`)},
	{JSONRPC: "2.0", ID: json.RawMessage(`1`), Method: "a>b", Params: json.RawMessage(`["a>b"]`)},
	{JSONRPC: "2.0", ID: json.RawMessage(`"<"`), Method: "a", Params: json.RawMessage(`[">"]`)},
	{JSONRPC: "2.0", ID: json.RawMessage(`"\u2028"`), Method: "m", Params: json.RawMessage("[\"\u2028\u2029\"]")},
	{JSONRPC: "2.0", ID: json.RawMessage(`1`), Method: "métho\"d\\\x01", Params: json.RawMessage(`["ü", "\"", "\\n"]`)},
	{JSONRPC: "2\x7f", ID: json.RawMessage(`1`), Method: "m", Params: json.RawMessage(`[1e3, -0.5, true, false, {}]`)},
	{JSONRPC: "2.0", ID: json.RawMessage(`1`), Method: "m", Params: json.RawMessage(`[1,`)},
	{JSONRPC: "2.0", ID: json.RawMessage(`{`), Method: "m"},
	{JSONRPC: "2.0", ID: json.RawMessage(``), Method: "m", Params: json.RawMessage(`[ ]`)},
	{JSONRPC: "2.0", ID: json.RawMessage(`1`), Method: "m", Params: json.RawMessage("[\xff]")},
}

// EncodeCall gives exactly what json.Marshal gives, errors included.
func TestEncodeCall_AsMarshal(t *testing.T) {
	for _, c := range encodeCases {
		want, wantErr := json.Marshal(c)
		got, err := EncodeCall(c)
		if (err != nil) != (wantErr != nil) || !bytes.Equal(got, want) {
			t.Errorf("EncodeCall(%+v) = %s, %v; json.Marshal gives %s, %v", c, got, err, want, wantErr)
		}
	}
}

// AppendResult gives exactly what a json.Encoder writes for the success
// response, or leaves it to the encoder, for every valid id and result
// (what it takes: a result is not checked again).
func TestAppendResult_AsEncoder(t *testing.T) {
	fast := 0
	for _, c := range encodeCases {
		if !json.Valid(c.Params) || (c.ID != nil && !json.Valid(c.ID)) {
			continue
		}
		for _, id := range []json.RawMessage{c.ID, nil} {
			result := c.Params
			var want bytes.Buffer
			encErr := json.NewEncoder(&want).Encode(Response{JSONRPC: "2.0", ID: id, Result: result})
			got, ok := AppendResult([]byte("prefix"), id, result)
			switch {
			case !ok && !bytes.Equal(got, []byte("prefix")):
				t.Errorf("AppendResult(%s, %s) left %q in dst, want it unchanged", id, result, got)
			case !ok:
			case encErr != nil || len(result) == 0:
				t.Errorf("AppendResult(%s, %s) = %s; the encoder gives an error (%v) or no result", id, result, got, encErr)
			case !bytes.Equal(got[len("prefix"):], want.Bytes()):
				t.Errorf("AppendResult(%s, %s) = %q; the encoder writes %q", id, result, got[len("prefix"):], want.Bytes())
			default:
				fast++
			}
			// ResultHead, the result and ResultTail are the same bytes,
			// for a result that needs neither escapes nor compaction.
			head, hok := ResultHead(id, result)
			escapes, space := plainBytes(result)
			switch {
			case hok && !ok:
				t.Errorf("ResultHead(%s, %s) = %q, but AppendResult leaves it to the encoder", id, result, head)
			case hok && string(head)+string(result)+ResultTail != want.String():
				t.Errorf("ResultHead(%s, %s) gives %q, the encoder writes %q", id, result, string(head)+string(result)+ResultTail, want.Bytes())
			case !hok && ok && !escapes && !space && plainID(id):
				t.Errorf("ResultHead(%s, %s) refused a plain result", id, result)
			}
		}
	}
	if fast < 6 {
		t.Errorf("%d responses took the fast path, want every plain one (6 at least)", fast)
	}
}

// plainID reports whether an id needs no escape nor compaction.
func plainID(id json.RawMessage) bool {
	escapes, space := plainBytes(id)
	return !escapes && !space
}

func BenchmarkEncodeCall(b *testing.B) {
	c := Call{JSONRPC: "2.0", ID: json.RawMessage(`7`), Method: "eth_getBalance", Params: json.RawMessage(`["0x00000000000000000000000000000000000000aa","latest"]`)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := EncodeCall(c); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzEncodeCall: for any request ParseCall takes, EncodeCall gives what
// json.Marshal gives.
func FuzzEncodeCall(f *testing.F) {
	for _, c := range encodeCases {
		if b, err := json.Marshal(c); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"eth_call","params":[{"to":"0xab","data":"0x"} , "latest"]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, perr := ParseCall(raw)
		if perr != nil {
			return
		}
		want, wantErr := json.Marshal(c)
		got, err := EncodeCall(c)
		if (err != nil) != (wantErr != nil) || !bytes.Equal(got, want) {
			t.Fatalf("EncodeCall of %q = %s, %v; json.Marshal gives %s, %v", raw, got, err, want, wantErr)
		}
	})
}
