package jsonrpc

import (
	"encoding/json"
	"strings"
	"testing"
)

var validCases = []string{
	``, ` `, `0`, `-0`, `01`, `-`, `1.`, `1.5`, `.5`, `1e`, `1e+`, `1e+5`, `1E-05`, `-12.34e56`, `1.5e3.2`,
	`true`, `tru`, `truex`, `false`, `null`, `nul`, `nullnull`, `"`, `""`, `"a`, `"\"`, `"\\"`, `"\u00e9"`,
	`"\u00g9"`, `"\u12"`, `"\x"`, `"\/\b\f\n\r\t"`, "\"\x01\"", "\"\x7f\xff\xfe\"", "\"\u2028\"",
	`[]`, `[ ]`, `[1,]`, `[,1]`, `[1 2]`, `[[[]]]`, `[[]`, `[]]`, `{}`, `{ }`, `{"a":1}`, `{"a":1,}`,
	`{"a" 1}`, `{"a":}`, `{1:2}`, `{"a":1 "b":2}`, `{"a":[1,{"b":null}],"c":"}"}`, `{"a":1}}`, `{"a":1}{}`,
	" \t\r\n{\"a\" : [ 1 , 2 ] } \n", "\v1", "1\x00", `[1,2,3,"x",{"y":[true,false,null]}]`,
	`{"jsonrpc":"2.0","id":1,"result":"0x64"}`,
}

// validJSON is json.Valid.
func TestValidJSON_AsValid(t *testing.T) {
	for _, c := range validCases {
		if got, want := validJSON([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("validJSON(%q) = %v, json.Valid says %v", c, got, want)
		}
	}
	// encoding/json's nesting limit: 10,000 levels, not one more.
	for _, depth := range []int{maxDepth, maxDepth + 1} {
		for _, open := range []string{"[", `{"a":`} {
			closer := map[string]string{"[": "]", `{"a":`: "}"}[open]
			doc := []byte(strings.Repeat(open, depth) + "1" + strings.Repeat(closer, depth))
			if got, want := validJSON(doc), json.Valid(doc); got != want {
				t.Errorf("%d levels of %s: validJSON %v, json.Valid %v", depth, open, got, want)
			}
		}
	}
}

func FuzzValidJSON(f *testing.F) {
	for _, c := range validCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), json.Valid(b); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid says %v", b, got, want)
		}
	})
}

func BenchmarkValidJSON(b *testing.B) {
	data := []byte(`{"jsonrpc":"2.0","id":1,"result":[` + strings.Repeat(`{"address":"0x00000000000000000000000000000000000000aa","topics":["0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"],"data":"0x0000000000000000000000000000000000000000000000000de0b6b3a7640000","blockNumber":"0x10","logIndex":"0x1","removed":false},`, 2000) + `{}]}`)
	b.SetBytes(int64(len(data)))
	for _, f := range []struct {
		name  string
		valid func([]byte) bool
	}{{"workmesh", validJSON}, {"encoding-json", json.Valid}} {
		b.Run(f.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if !f.valid(data) {
					b.Fatal("invalid")
				}
			}
		})
	}
}
