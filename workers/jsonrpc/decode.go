package jsonrpc

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// DecodeResponse decodes one JSON-RPC response as json.Unmarshal into a
// Response does (the same fields, the same errors), scanning data once to
// check it (validJSON) and once to find its members, with no reflection: a relayed
// answer is decoded on the worker and again on the node that asked, and
// an eth_getLogs answer may be megabytes. ID and Result share data's
// bytes.
func DecodeResponse(data []byte) (Response, error) {
	if r, ok := decodeResponseFast(data); ok {
		return r, nil
	}
	var r Response
	err := json.Unmarshal(data, &r)
	return r, err
}

// decodeResponseFast decodes the plain form of a response: valid JSON, an
// object whose keys are ASCII without escapes, each of "jsonrpc", "id",
// "result" and "error" at most once, their values of the right kinds. ok
// false leaves anything else (and every error) to json.Unmarshal.
func decodeResponseFast(data []byte) (r Response, ok bool) {
	if !validJSON(data) {
		return r, false
	}
	var seen [4]bool
	ok = eachMember(data, func(key, value []byte) bool {
		i, known, ok := plainMember(key, &responseMembers, &seen)
		if !known || !ok {
			return ok // another key, or a repeated one: json.Unmarshal's rules apply
		}
		switch i {
		case 0:
			s, ok := plainStringValue(value)
			r.JSONRPC = s
			return ok
		case 1:
			r.ID = value
		case 2:
			r.Result = value
		case 3:
			if value[0] != '{' && !isNull(value) {
				return false
			}
			if !isNull(value) {
				r.Error = new(RPCError)
				return json.Unmarshal(value, r.Error) == nil
			}
		}
		return true
	})
	return r, ok
}

// parseCallFast decodes the plain form of a request as decodeResponseFast
// does a response; ok false leaves it to json.Unmarshal.
func parseCallFast(raw []byte) (c Call, ok bool) {
	if !validJSON(raw) {
		return c, false
	}
	var seen [4]bool
	ok = eachMember(raw, func(key, value []byte) bool {
		i, known, ok := plainMember(key, &callMembers, &seen)
		if !known || !ok || string(key) != callMembers[i] {
			// Another key, a repeated one, or one written in another
			// case: ParseCall's slower rules apply (ambiguousMember).
			return ok && !known
		}
		switch i {
		case 0:
			c.JSONRPC, ok = plainStringValue(value)
		case 1:
			c.ID, ok = value, true
		case 2:
			c.Method, ok = plainStringValue(value)
		case 3:
			c.Params, ok = value, true
		}
		return ok
	})
	return c, ok
}

// The members the fast decoders know, in the order of their switch cases.
var (
	responseMembers = [4]string{"jsonrpc", "id", "result", "error"}
	callMembers     = [4]string{"jsonrpc", "id", "method", "params"}
)

// plainMember matches key against names as json.Unmarshal would (case
// folded) and marks it seen. known is false for another key, and ok then
// says whether that key is plain; for a known key ok is false when it is
// repeated or not plain (json.Unmarshal's rules apply then), else true.
func plainMember(key []byte, names *[4]string, seen *[4]bool) (i int, known, ok bool) {
	for i = range names {
		if equalFoldASCII(key, names[i]) {
			if seen[i] || !plainKey(key) {
				return i, true, false
			}
			seen[i] = true
			return i, true, true
		}
	}
	return 0, false, plainKey(key)
}

// plainKey reports whether a key as written is ASCII with no escape, so
// that comparing it as is matches what json.Unmarshal compares.
func plainKey(key []byte) bool {
	for _, c := range key {
		if c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// equalFoldASCII is encoding/json's key match (case-insensitive) for a
// plain key; name is lower-case ASCII.
func equalFoldASCII(key []byte, name string) bool {
	if len(key) != len(name) {
		return false
	}
	for i := range len(key) {
		c := key[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != name[i] {
			return false
		}
	}
	return true
}

func isNull(v []byte) bool { return len(v) == 4 && string(v) == "null" }

// plainStringValue decodes a string value with no escape and only ASCII
// in it, and null (as ""); false for anything else.
func plainStringValue(v []byte) (string, bool) {
	if isNull(v) {
		return "", true
	}
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	s := v[1 : len(v)-1]
	for _, c := range s {
		if c == '\\' || c >= utf8.RuneSelf {
			return "", false
		}
	}
	return string(s), true
}

// eachMember calls f with the key (as written, without its quotes) and
// the value of each member of the object obj, which must be valid JSON,
// until f returns false; it returns false then, and when obj is not an
// object.
func eachMember(obj []byte, f func(key, value []byte) bool) bool {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return true
	}
	for i < len(obj) {
		if obj[i] != '"' {
			return false
		}
		end := skipString(obj, i)
		key := obj[i+1 : end-1]
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return false
		}
		i = skipSpace(obj, i+1)
		start := i
		i = skipValue(obj, i)
		if i <= start || !f(key, obj[start:i]) {
			return false
		}
		i = skipSpace(obj, i)
		if i >= len(obj) {
			return false
		}
		switch obj[i] {
		case '}':
			return true
		case ',':
			i = skipSpace(obj, i+1)
		default:
			return false
		}
	}
	return false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i]: the
// first quote after it that no odd run of backslashes escapes (found with
// bytes.IndexByte, fast on the long hex strings of Ethereum answers).
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			break
		}
		i += j
		n := 0 // backslashes right before: the opening quote stops the count
		for k := i - 1; k >= 0 && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the index after the value starting at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	// A number, true, false or null.
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return i
		}
	}
	return i
}
