package jsonrpc

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// decodeCases are responses and requests in the plain form (the fast
// path) and in every form the fast path leaves to encoding/json: escaped
// and non-ASCII keys (which json.Unmarshal folds), repeated members,
// values of the wrong kind, null, other JSON than an object, invalid JSON.
var decodeCases = []string{
	`{"jsonrpc":"2.0","id":7,"result":"0x64"}`,
	` { "jsonrpc" : "2.0" , "id" : "a b" , "result" : { "logs" : [ 1 , "x}]" , {"a":[]} ] } } `,
	`{"jsonrpc":"2.0","id":null,"result":null}`,
	`{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"header not found"}}`,
	`{"jsonrpc":"2.0","id":1,"error":{"code":3,"message":"execution reverted","data":"0x08c3"}}`,
	`{"jsonrpc":"2.0","id":1,"error":null,"result":true}`,
	`{"JSONRPC":"2.0","ID":1,"Result":1,"Error":null}`,
	`{"jsonrpc":"2.0","id":1,"result":1,"extra":{"x":[1,2,{"y":"\"}"}]},"more":"\\"}`,
	`{"jsonrpc":"2.0","id":"\\","result":"\\\"},\"id\":9","x":"\\\\"}`,
	`{"jsonrpc":"2.0","id":1,"result":1,"id":2}`,
	`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"a"},"error":{"code":2}}`,
	`{"jsonrpc":"2.0","id":1,"error":{"code":1},"error":null}`,
	`{"jsonrpc":"2.0","\u0069d":5,"result":1}`,
	`{"jsonrpc":"2.0","id":1,"reſult":1}`,
	`{"jſonrpc":"2.0","id":1,"result":1}`,
	`{"jsonrpc":2,"id":1,"result":1}`,
	`{"jsonrpc":"2.\u0030","id":1,"result":1}`,
	`{"jsonrpc":"2.0é","id":1,"result":1}`,
	`{"jsonrpc":"2.0","id":1,"error":"oops"}`,
	`{"jsonrpc":"2.0","id":1,"error":[1]}`,
	`{"jsonrpc":"2.0","id":1,"error":{"code":"x"}}`,
	`{"jsonrpc":"2.0","id":1,"error":{"code":1.5}}`,
	`{"jsonrpc":"2.0","id":1,"method":"eth_call","params":[{"to":"0xab"},"latest"]}`,
	`{"jsonrpc":"2.0","id":1,"method":5}`,
	`{"jsonrpc":"2.0","id":1,"method":null,"params":null}`,
	`{"jsonrpc":"2.0","id":1,"method":"m\u00e9"}`,
	`{"jsonrpc":"2.0","id":1,"METHOD":"a","method":"b"}`,
	`{"jsonrpc":"2.0","id":1,"Params":[1],"params":[2]}`,
	`{}`, `{ }`, `null`, `[]`, `[{"jsonrpc":"2.0","id":1,"result":1}]`, `"x"`, `1`, `true`,
	`{"jsonrpc":"2.0","id":1,"result":1`, `{"jsonrpc":"2.0","id":1,"result":1}}`, ``, `{"a":}`,
	"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"\xff\"}",
	"{\"jsonrpc\":\"\xff\",\"id\":1,\"result\":1}",
}

// sameResponse reports whether DecodeResponse's answer is json.Unmarshal's.
func sameResponse(data []byte) (got, want Response, gotErr, wantErr error, same bool) {
	got, gotErr = DecodeResponse(data)
	wantErr = json.Unmarshal(data, &want)
	if (gotErr != nil) != (wantErr != nil) {
		return got, want, gotErr, wantErr, false
	}
	if wantErr != nil {
		return got, want, gotErr, wantErr, true // the fields of a failed decode are nobody's
	}
	same = got.JSONRPC == want.JSONRPC && bytes.Equal(got.ID, want.ID) && (got.ID == nil) == (want.ID == nil) &&
		bytes.Equal(got.Result, want.Result) && (got.Result == nil) == (want.Result == nil) && reflect.DeepEqual(got.Error, want.Error)
	return got, want, gotErr, wantErr, same
}

// sameCall reports whether ParseCall reads raw as json.Unmarshal does:
// it fails where json.Unmarshal does, and what its fast path decodes is
// json.Unmarshal's (ParseCall's checks then see the same fields).
func sameCall(raw []byte) (got, want Call, gotErr *RPCError, wantErr error, same bool) {
	_, gotErr = ParseCall(raw)
	wantErr = json.Unmarshal(bytes.TrimSpace(raw), &want)
	if wantErr != nil {
		return got, want, gotErr, wantErr, gotErr != nil
	}
	got, ok := parseCallFast(bytes.TrimSpace(raw))
	if !ok {
		return got, want, gotErr, wantErr, true // decoded by json.Unmarshal itself
	}
	same = got.JSONRPC == want.JSONRPC && got.Method == want.Method && bytes.Equal(got.ID, want.ID) &&
		(got.ID == nil) == (want.ID == nil) && bytes.Equal(got.Params, want.Params) && (got.Params == nil) == (want.Params == nil)
	return got, want, gotErr, wantErr, same
}

func TestDecodeResponse_AsUnmarshal(t *testing.T) {
	for _, c := range decodeCases {
		if got, want, gotErr, wantErr, same := sameResponse([]byte(c)); !same {
			t.Errorf("DecodeResponse(%s) = %+v, %v; json.Unmarshal gives %+v, %v", c, got, gotErr, want, wantErr)
		}
	}
	// The plain responses take the fast path.
	for _, c := range decodeCases[:8] {
		if _, ok := decodeResponseFast([]byte(c)); !ok {
			t.Errorf("%s: not decoded by the fast path", c)
		}
	}
}

func TestParseCall_AsUnmarshal(t *testing.T) {
	for _, c := range decodeCases {
		if got, want, gotErr, wantErr, same := sameCall([]byte(c)); !same {
			t.Errorf("ParseCall(%s) = %+v, %v; json.Unmarshal gives %+v, %v", c, got, gotErr, want, wantErr)
		}
	}
	if _, ok := parseCallFast([]byte(`{"jsonrpc":"2.0","id":1,"method":"eth_call","params":[{"to":"0xab"},"latest"]}`)); !ok {
		t.Error("a plain request not decoded by the fast path")
	}
}

func FuzzDecodeResponse(f *testing.F) {
	for _, c := range decodeCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want, gotErr, wantErr, same := sameResponse(data); !same {
			t.Fatalf("DecodeResponse(%q) = %+v, %v; json.Unmarshal gives %+v, %v", data, got, gotErr, want, wantErr)
		}
	})
}

func FuzzParseCall(f *testing.F) {
	for _, c := range decodeCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want, gotErr, wantErr, same := sameCall(data); !same {
			t.Fatalf("ParseCall(%q) = %+v, %v; json.Unmarshal gives %+v, %v", data, got, gotErr, want, wantErr)
		}
	})
}

func BenchmarkDecodeResponse(b *testing.B) {
	data := []byte(`{"jsonrpc":"2.0","id":7,"result":"0x64"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeResponse(data); err != nil {
			b.Fatal(err)
		}
	}
}
