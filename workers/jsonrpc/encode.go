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
	escapes, space := plainBytes(v)
	switch {
	case escapes:
		return b, false
	case !space:
		if !valid && !validJSON(v) {
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

// plainBytes reports whether v holds a byte encoding/json escapes in a raw
// value (<, >, & and 0xE2, the start of U+2028 and U+2029), and whether
// it holds a byte of JSON space (which may be insignificant). Each is one
// pass of bytes.IndexByte, which is many times faster on a long value
// than one loop over its bytes.
func plainBytes(v []byte) (escapes, space bool) {
	for _, c := range [...]byte{'<', '>', '&', 0xe2} {
		if bytes.IndexByte(v, c) >= 0 {
			return true, false
		}
	}
	for _, c := range [...]byte{' ', '\n', '\t', '\r'} {
		if bytes.IndexByte(v, c) >= 0 {
			return false, true
		}
	}
	return false, false
}

// ResultHead returns the start of the success response {"jsonrpc":"2.0",
// "id":id,"result":result} up to the result, for a result that goes out
// as it is (no byte of it to escape, no space): head, result and
// ResultTail written one after the other are AppendResult's bytes, with
// no copy of a result that may be megabytes. ok is false for any other
// id or result. Both must be valid JSON, as for AppendResult.
func ResultHead(id, result json.RawMessage) (head []byte, ok bool) {
	if len(result) == 0 {
		return nil, false
	}
	if escapes, space := plainBytes(result); escapes || space {
		return nil, false
	}
	head = append(make([]byte, 0, 32+len(id)), `{"jsonrpc":"2.0","id":`...)
	if id == nil {
		head = append(head, "null"...)
	} else if head, ok = appendPlainRaw(head, id, true); !ok {
		return nil, false
	}
	return append(head, `,"result":`...), true
}

// ResultTail ends a response begun with ResultHead.
const ResultTail = "}\n"
