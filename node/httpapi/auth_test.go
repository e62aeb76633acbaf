package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

const goodToken = "0123456789abcdef-token"

func TestCheckExposure(t *testing.T) {
	tests := []struct {
		addr, token string
		want        string // "" means accepted
	}{
		{"127.0.0.1:7400", "", ""},
		{"127.0.0.2:7400", "", ""},
		{"[::1]:7400", "", ""},
		{"localhost:7400", "", ""},
		{"[::ffff:127.0.0.1]:7400", "", ""},
		{"", "", ""}, // no API at all
		{"0.0.0.0:7400", "", "api address 0.0.0.0:7400 listens on 0.0.0.0, not loopback: set api-token"},
		{":7400", "", "api address :7400 listens on every interface, not loopback"},
		{"[::]:7400", "", "api address [::]:7400 listens on ::, not loopback"},
		{"192.168.1.10:7400", "", "not loopback"},
		{"example.com:7400", "", "not loopback"}, // names are not resolved
		{"0.0.0.0:7400", goodToken, ""},
		{"127.0.0.1:7400", goodToken, ""},
		{"0.0.0.0:7400", "short", "api-token: 5 bytes, want at least 16"},
		{"127.0.0.1:7400", "short", "api-token: 5 bytes, want at least 16"},
		{"0.0.0.0:7400", "0123456789abcdef with space", "api-token: byte 17 is a space"},
		{"0.0.0.0:7400", "aaaaaaaaaaaaaaaa", "api-token: too easy to guess (1 different characters"},
		{"0.0.0.0:7400", "abababababababababababab", "api-token: too easy to guess (2 different characters"},
		{"0.0.0.0:7400", "passwordpassword", "too easy to guess"},
		{"0.0.0.0:7400", "3f9a1c07e45bd2a8", ""}, // 16 random hex characters
		{"0.0.0.0:7400", "a-secret-token-of-32-bytes-long!", ""},
		{"127.0.0.1", "", `api address "127.0.0.1": address 127.0.0.1: missing port in address`},
	}
	for _, tt := range tests {
		err := CheckExposure(tt.addr, tt.token)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("CheckExposure(%q, %q) = %v, want nil", tt.addr, tt.token, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("CheckExposure(%q, %q) = %v, want an error with %q", tt.addr, tt.token, err, tt.want)
		}
		if tt.token == "" && strings.Contains(tt.want, "not loopback") && !errors.Is(err, ErrExposed) {
			t.Errorf("CheckExposure(%q) error does not wrap ErrExposed", tt.addr)
		}
	}
}

// okHandler answers 200 "ok" and records that it ran.
type okHandler struct{ runs int }

func (h *okHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs++
	if _, err := io.ReadAll(r.Body); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge)
			return
		}
	}
	_, _ = io.WriteString(w, "ok")
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func TestRequireToken(t *testing.T) {
	next := &okHandler{}
	h := RequireToken(goodToken, nil, next)
	tests := []struct {
		name, header string
		code         int
		err          string
	}{
		{"right token", "Bearer " + goodToken, 200, ""},
		{"scheme in any case", "bearer " + goodToken, 200, ""},
		{"no header", "", 401, "missing bearer token"},
		{"other scheme", "Basic " + goodToken, 401, "missing bearer token"},
		{"empty token", "Bearer ", 401, "missing bearer token"},
		{"wrong token", "Bearer " + goodToken + "x", 401, "invalid bearer token"},
		{"prefix of the token", "Bearer " + goodToken[:10], 401, "invalid bearer token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := next.runs
			r := httptest.NewRequest(http.MethodGet, "/v1/info", nil)
			if tt.header != "" {
				r.Header.Set("Authorization", tt.header)
			}
			rec := serve(h, r)
			if rec.Code != tt.code {
				t.Fatalf("status %d, want %d (%s)", rec.Code, tt.code, rec.Body)
			}
			if tt.code == 200 {
				if next.runs != before+1 || rec.Body.String() != "ok" {
					t.Errorf("the handler did not answer: %q", rec.Body)
				}
				return
			}
			if next.runs != before {
				t.Error("the handler ran for an unauthorized request")
			}
			var body struct{ Error string }
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || !strings.Contains(body.Error, tt.err) {
				t.Errorf("body %q, want a JSON error with %q", rec.Body, tt.err)
			}
			if rec.Header().Get("Content-Type") != "application/json" || !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("headers %v", rec.Header())
			}
		})
	}
	// No token configured: nothing is required (CheckExposure keeps such
	// an API on loopback).
	if RequireToken("", nil, next) != http.Handler(next) {
		t.Error("RequireToken with no token wrapped the handler")
	}
}

func TestLimitBody(t *testing.T) {
	next := &okHandler{}
	h := LimitBody(8, next)

	rec := serve(h, httptest.NewRequest(http.MethodPost, "/v1/work", strings.NewReader("12345678")))
	if rec.Code != 200 || next.runs != 1 {
		t.Errorf("body at the limit: %d %q", rec.Code, rec.Body)
	}
	// Declared too long: refused before the handler runs.
	rec = serve(h, httptest.NewRequest(http.MethodPost, "/v1/work", strings.NewReader("123456789")))
	if rec.Code != http.StatusRequestEntityTooLarge || next.runs != 1 || !strings.Contains(rec.Body.String(), `"error":"body: 9 bytes, more than the 8 allowed"`) {
		t.Errorf("declared 9 bytes: %d %q, %d runs", rec.Code, rec.Body, next.runs)
	}
	// Not declared (chunked): the handler's read stops at the limit.
	r := httptest.NewRequest(http.MethodPost, "/v1/work", io.MultiReader(strings.NewReader("12345"), strings.NewReader("6789")))
	r.ContentLength = -1
	rec = serve(h, r)
	if rec.Code != http.StatusRequestEntityTooLarge || next.runs != 2 {
		t.Errorf("undeclared 9 bytes: %d %q", rec.Code, rec.Body)
	}
	defer func() {
		if recover() == nil {
			t.Error("LimitBody(0) did not panic")
		}
	}()
	LimitBody(0, next)
}

// TestRequireTokenSlowsRefusals: wrong tokens are answered at a bounded
// rate, after a burst, and the refusals are logged with their count.
func TestRequireTokenSlowsRefusals(t *testing.T) {
	var logged bytes.Buffer
	log := logrus.New()
	log.SetOutput(&logged)
	h := RequireToken(goodToken, log, &okHandler{})
	const n = failedTokenBurst + failedTokenRate // one second's worth beyond the burst
	start := time.Now()
	for range n {
		r := httptest.NewRequest(http.MethodGet, "/v1/info", nil)
		r.Header.Set("Authorization", "Bearer wrong")
		if rec := serve(h, r); rec.Code != http.StatusUnauthorized {
			t.Fatalf("wrong token: %d", rec.Code)
		}
	}
	// A lower bound only: a slow machine takes longer, never shorter.
	if took := time.Since(start); took < 800*time.Millisecond {
		t.Errorf("%d refusals took %s, want at least about a second (%d a second after a burst of %d)", n, took, failedTokenRate, failedTokenBurst)
	}
	if !strings.Contains(logged.String(), "refused requests without the right token") {
		t.Errorf("no log line of the refusals: %q", logged.String())
	}
	r := httptest.NewRequest(http.MethodGet, "/v1/info", nil)
	r.Header.Set("Authorization", "Bearer "+goodToken)
	if rec := serve(h, r); rec.Code != http.StatusOK {
		t.Errorf("the right token after the refusals: %d", rec.Code)
	}
}
