package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The three writers share one encoder: WriteJSON indents, WriteCompactJSON
// and WriteError write one line, and all of them set the content type and
// the status.
func TestWriters(t *testing.T) {
	v := map[string]any{"jsonrpc": "2.0", "id": 1}
	for _, c := range []struct {
		name  string
		write func(w http.ResponseWriter)
		code  int
		body  string
	}{
		{"WriteJSON", func(w http.ResponseWriter) { _ = WriteJSON(w, http.StatusOK, v) }, http.StatusOK, "{\n  \"id\": 1,\n  \"jsonrpc\": \"2.0\"\n}\n"},
		{"WriteCompactJSON", func(w http.ResponseWriter) { _ = WriteCompactJSON(w, http.StatusMethodNotAllowed, v) }, http.StatusMethodNotAllowed, `{"id":1,"jsonrpc":"2.0"}` + "\n"},
		{"WriteError", func(w http.ResponseWriter) { WriteError(w, http.StatusBadRequest, "type", "type: %s", "required") }, http.StatusBadRequest, `{"error":"type: required","field":"type"}` + "\n"},
		{"WriteError without field", func(w http.ResponseWriter) { WriteError(w, http.StatusNotFound, "", "no such path") }, http.StatusNotFound, `{"error":"no such path"}` + "\n"},
	} {
		rec := httptest.NewRecorder()
		c.write(rec)
		if rec.Code != c.code || rec.Body.String() != c.body || rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %q (%s), want %d %q (application/json)", c.name, rec.Code, rec.Body.String(), rec.Header().Get("Content-Type"), c.code, c.body)
		}
	}
}

func TestDescribeJSONError(t *testing.T) {
	var n int
	typeErr := json.Unmarshal([]byte(`"seven"`), &n)
	syntaxErr := json.Unmarshal([]byte(`{`), &n)
	for _, c := range []struct {
		err  error
		want string
	}{
		{typeErr, "want int, got JSON string"},
		{syntaxErr, syntaxErr.Error()},
	} {
		if got := DescribeJSONError(c.err); got != c.want {
			t.Errorf("DescribeJSONError(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
