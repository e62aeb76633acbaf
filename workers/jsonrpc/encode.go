package jsonrpc

import (
	"bytes"
	"encoding/json"
)

// EncodeCall returns c in JSON, byte for byte what json.Marshal(c) gives,
// without its reflection: the /v1/rpc endpoint encodes every request it
// dispatches. Unusual content (a string with escapes or HTML characters,
// a raw value holding them) goes through json.Marshal itself.
func EncodeCall(c Call) ([]byte, error) {
	b := make([]byte, 0, 48+len(c.JSONRPC)+len(c.ID)+len(c.Method)+len(c.Params))
	b = append(b, `{"jsonrpc":`...)
	b, ok := appendPlainString(b, c.JSONRPC)
	if ok && len(c.ID) > 0 {
		b = append(b, `,"id":`...)
		b, ok = appendPlainRaw(b, c.ID, false)
	}
	if ok {
		b = append(b, `,"method":`...)
		b, ok = appendPlainString(b, c.Method)
	}
	if ok && len(c.Params) > 0 {
		b = append(b, `,"params":`...)
		b, ok = appendPlainRaw(b, c.Params, false)
	}
	if !ok {
		return json.Marshal(c)
	}
	return append(b, '}'), nil
}

// AppendResult appends the success response {"jsonrpc":"2.0","id":id,
// "result":result} and a newline to dst, byte for byte what a json.Encoder
// writes for that Response, without its reflection. ok is false, and dst
// unchanged, for content it leaves to the encoder (see EncodeCall). id
// and result must be valid JSON, as ParseCall and DecodeResponse give
// them: a result, which may be megabytes, is not checked again.
func AppendResult(dst []byte, id, result json.RawMessage) ([]byte, bool) {
	if len(result) == 0 {
		return dst, false // omitted by the encoder: not a success response
	}
	n := len(dst)
	b := append(dst, `{"jsonrpc":"2.0","id":`...)
	ok := true
	if id == nil {
		b = append(b, "null"...)
	} else {
		b, ok = appendPlainRaw(b, id, false)
	}
	if ok {
		b = append(b, `,"result":`...)
		b, ok = appendPlainRaw(b, result, true)
	}
	if !ok {
		return dst[:n], false
	}
	return append(b, "}\n"...), true
}

// appendPlainString appends s quoted when no byte of it needs an escape
// in JSON as encoding/json writes it (control characters, quote,
// backslash, the HTML characters <, > and &, anything beyond ASCII).
func appendPlainString(b []byte, s string) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return b, false
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}

// appendPlainRaw appends the JSON value v without insignificant space, as
// encoding/json does, when it holds no byte that encoding/json would
// escape (the HTML characters, and U+2028 and U+2029, which start with
// 0xE2); valid says v is known to be valid JSON, else it is checked.
func appendPlainRaw(b []byte, v json.RawMessage, valid bool) ([]byte, bool) {
	space := false
	for _, c := range v {
		switch c {
		case '<', '>', '&', 0xe2:
			return b, false
		case ' ', '\t', '\r', '\n':
			space = true
		}
	}
	if !space {
		if !valid && !json.Valid(v) {
			return b, false
		}
		return append(b, v...), true
	}
	buf := bytes.NewBuffer(b)
	if json.Compact(buf, v) != nil {
		return b, false
	}
	return buf.Bytes(), true
}
