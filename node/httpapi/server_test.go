package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

func quietLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// testServer mounts a GET route, a POST route and a route that panics.
func testServer(t *testing.T, token string) *Server {
	t.Helper()
	s := New(token, quietLogger())
	for pattern, h := range map[string]http.HandlerFunc{
		"GET /v1/info": func(w http.ResponseWriter, _ *http.Request) {
			_ = WriteJSON(w, http.StatusOK, map[string]string{"peer_id": "p"})
		},
		"POST /v1/work": func(w http.ResponseWriter, _ *http.Request) {
			WriteError(w, http.StatusBadRequest, "type", "type: required")
		},
		"GET /v1/boom": func(http.ResponseWriter, *http.Request) { panic("boom") },
	} {
		if err := s.Handle(pattern, h); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestServerAnswers(t *testing.T) {
	tests := []struct {
		name          string
		token, bearer string
		method, path  string
		code          int
		body          string // the exact body
		allow         string // the Allow header wanted
	}{
		{"mounted route", "", "", "GET", "/v1/info", 200, "{\n  \"peer_id\": \"p\"\n}\n", ""},
		{"error with a field", "", "", "POST", "/v1/work", 400, `{"error":"type: required","field":"type"}` + "\n", ""},
		{"unknown path", "", "", "GET", "/v1/nothing", 404, `{"error":"no such path: /v1/nothing"}` + "\n", ""},
		{"wrong method", "", "", "DELETE", "/v1/info", 405, `{"error":"DELETE /v1/info: method not allowed, want GET, HEAD"}` + "\n", "GET, HEAD"},
		{"wrong method of a POST route", "", "", "GET", "/v1/work", 405, `{"error":"GET /v1/work: method not allowed, want POST"}` + "\n", "POST"},
		{"panic", "", "", "GET", "/v1/boom", 500, `{"error":"internal error"}` + "\n", ""},
		{"token refused", goodToken, "wrong", "GET", "/v1/info", 401, `{"error":"invalid bearer token"}` + "\n", ""},
		{"token missing on an unknown path", goodToken, "", "GET", "/v1/nothing", 401, `{"error":"missing bearer token: send Authorization: Bearer \u003capi-token\u003e"}` + "\n", ""},
		{"token accepted, unknown path", goodToken, goodToken, "GET", "/v1/nothing", 404, `{"error":"no such path: /v1/nothing"}` + "\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(tt.method, tt.path, nil)
			if tt.bearer != "" {
				r.Header.Set("Authorization", "Bearer "+tt.bearer)
			}
			rec := serve(testServer(t, tt.token), r)
			if rec.Code != tt.code || rec.Body.String() != tt.body {
				t.Errorf("%s %s: %d %q, want %d %q", tt.method, tt.path, rec.Code, rec.Body, tt.code, tt.body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			if got := rec.Header().Get("Allow"); got != tt.allow {
				t.Errorf("Allow %q, want %q", got, tt.allow)
			}
			if tt.code >= 400 {
				var e ErrorBody
				dec := json.NewDecoder(rec.Body)
				dec.DisallowUnknownFields()
				if err := dec.Decode(&e); err != nil || e.Error == "" {
					t.Errorf("body is not an ErrorBody: %v", err)
				}
			}
		})
	}
}

// The mux's redirect to a clean path is not an error and passes through.
func TestServerRedirectPassesThrough(t *testing.T) {
	rec := serve(testServer(t, ""), httptest.NewRequest("GET", "/v1/../v1/info", nil))
	if rec.Code/100 != 3 || rec.Header().Get("Location") != "/v1/info" {
		t.Errorf("%d, Location %q; want a redirect to /v1/info", rec.Code, rec.Header().Get("Location"))
	}
}

func TestServerHandleRefusesConflicts(t *testing.T) {
	s := testServer(t, "")
	for _, pattern := range []string{"GET /v1/info", "GET /v1/{x}info{", ""} {
		if err := s.Handle(pattern, http.NotFoundHandler()); err == nil {
			t.Errorf("Handle(%q) accepted", pattern)
		}
	}
}

// A started server answers on loopback, and Close stops it.
func TestServerStartClose(t *testing.T) {
	s := testServer(t, "")
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + s.Addr() + "/v1/nothing")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), `"error":"no such path: /v1/nothing"`) {
		t.Errorf("%d %q", resp.StatusCode, body)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := http.Get("http://" + s.Addr() + "/v1/info"); err == nil {
		t.Error("the server still answers after Close")
	}
	if err := New("", quietLogger()).Close(); err != nil {
		t.Errorf("Close of a server never started: %v", err)
	}
}

// A panic with http.ErrAbortHandler aborts the answer rather than being
// answered as a 500.
func TestRecoverPassesAbort(t *testing.T) {
	h := Recover(quietLogger(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }))
	defer func() {
		if v := recover(); !errors.Is(v.(error), http.ErrAbortHandler) {
			t.Errorf("recovered %v, want http.ErrAbortHandler", v)
		}
	}()
	serve(h, httptest.NewRequest("GET", "/", nil))
}
