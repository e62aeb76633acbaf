package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/workmesh/workmesh/node/apiv1"
)

// ErrorBody is the body of every refusal of the API (a 4xx or 5xx for a
// request that was not carried out: a bad body, an unknown path, a wrong
// method, a missing token). A work request that was dispatched and did
// not succeed answers 422, 503 or 504 with its result (apiv1.WorkResponse),
// whose "error" field says why in the same words.
type ErrorBody = apiv1.Error

// WriteJSON answers with status code and v as JSON, indented for an
// operator reading it with curl. It returns the error of encoding or
// writing v, which the caller may log: the status line is sent by then.
func WriteJSON(w http.ResponseWriter, code int, v any) error {
	return write(w, code, v, "  ")
}

// WriteCompactJSON answers with status code and v as JSON on one line, for
// a body a program reads whose form a protocol of its own defines (a
// JSON-RPC 2.0 response), not the API's error shape. It returns the error
// of encoding or writing v, as WriteJSON does.
func WriteCompactJSON(w http.ResponseWriter, code int, v any) error {
	return write(w, code, v, "")
}

// WriteError answers with status code and an ErrorBody on one line: the
// message is fmt.Sprintf(format, args...), and field, when not empty, names
// the request field at fault. Every refusal of the API is written by it.
func WriteError(w http.ResponseWriter, code int, field, format string, args ...any) {
	_ = write(w, code, ErrorBody{Error: fmt.Sprintf(format, args...), Field: field}, "")
}

// DescribeJSONError turns the error of decoding one field of a request
// into a short message for the client: the type the field wants and the
// JSON kind it got, or the decoder's own message for any other error.
func DescribeJSONError(err error) string {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return fmt.Sprintf("want %s, got JSON %s", te.Type, te.Value)
	}
	return err.Error()
}

// write is the one JSON writer behind WriteJSON, WriteCompactJSON and
// WriteError.
func write(w http.ResponseWriter, code int, v any, indent string) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", indent)
	return enc.Encode(v)
}
