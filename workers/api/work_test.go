package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// fakeDispatch records the requests it is given and answers with res.
type fakeDispatch struct {
	got []dispatch.WorkRequest
	res dispatch.WorkResult
}

func (f *fakeDispatch) dispatch(_ context.Context, req dispatch.WorkRequest) dispatch.WorkResult {
	f.got = append(f.got, req)
	return f.res
}

func newTestAPI(t *testing.T, res dispatch.WorkResult, opts ...Option) (*Work, *fakeDispatch) {
	t.Helper()
	f := &fakeDispatch{res: res}
	a, err := NewWork(f.dispatch, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return a, f
}

func apiDo(t *testing.T, h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	return w
}

func apiU64(v uint64) *uint64 { return &v }

func TestAPIParsesRequests(t *testing.T) {
	okRes := dispatch.WorkResult{Status: apiv1.StatusOK, Output: []byte("x")}
	for _, tc := range []struct {
		name string
		body string
		want dispatch.WorkRequest
	}{
		{"type only", `{"type":"echo"}`, dispatch.WorkRequest{Type: "echo"}},
		{"text payload", `{"type":"sha256","payload":"hello"}`, dispatch.WorkRequest{Type: "sha256", Payload: []byte("hello")}},
		{"base64 payload", `{"type":"echo","payload_b64":"AAH/"}`, dispatch.WorkRequest{Type: "echo", Payload: []byte{0, 1, 255}}},
		{"everything", `{"type":"sleep","payload":"1s","timeout":"2.5s","labels":["full","eu"],"min_head":42}`,
			dispatch.WorkRequest{Type: "sleep", Payload: []byte("1s"), Timeout: 2500 * time.Millisecond, Labels: []string{"full", "eu"}, MinHead: apiU64(42)}},
		{"min_head zero is set", `{"type":"echo","min_head":0}`, dispatch.WorkRequest{Type: "echo", MinHead: apiU64(0)}},
		{"null payload is none", `{"type":"echo","payload":null}`, dispatch.WorkRequest{Type: "echo"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, f := newTestAPI(t, okRes)
			w := apiDo(t, a, http.MethodPost, apiv1.WorkPath, tc.body)
			if w.Code != http.StatusOK {
				t.Fatalf("code %d, want 200; body %s", w.Code, w.Body)
			}
			if len(f.got) != 1 {
				t.Fatalf("dispatched %d requests, want 1", len(f.got))
			}
			if !reflect.DeepEqual(f.got[0], tc.want) {
				t.Errorf("dispatched %+v, want %+v", f.got[0], tc.want)
			}
		})
	}
}

func TestAPIRejectsBadRequests(t *testing.T) {
	for _, tc := range []struct {
		name      string
		method    string
		body      string
		code      int
		field     string
		errSubstr string
	}{
		{"GET", http.MethodGet, "", http.StatusMethodNotAllowed, "", "want POST"},
		{"empty body", http.MethodPost, "", http.StatusBadRequest, "", "empty"},
		{"not JSON", http.MethodPost, "type=echo", http.StatusBadRequest, "", "JSON object"},
		{"array", http.MethodPost, `["echo"]`, http.StatusBadRequest, "", "JSON object"},
		{"null", http.MethodPost, `null`, http.StatusBadRequest, "", "null"},
		{"trailing data", http.MethodPost, `{"type":"echo"} {}`, http.StatusBadRequest, "", "after the JSON object"},
		{"unknown field", http.MethodPost, `{"type":"echo","payload":"x","priority":1}`, http.StatusBadRequest, "priority", "unknown field"},
		{"no type", http.MethodPost, `{"payload":"x"}`, http.StatusBadRequest, "type", "required"},
		{"bad type name", http.MethodPost, `{"type":"a b"}`, http.StatusBadRequest, "type", "not allowed"},
		{"type not a string", http.MethodPost, `{"type":7}`, http.StatusBadRequest, "type", "want string"},
		{"both payloads", http.MethodPost, `{"type":"echo","payload":"x","payload_b64":"eA=="}`, http.StatusBadRequest, "payload_b64", "not both"},
		{"bad base64", http.MethodPost, `{"type":"echo","payload_b64":"!!"}`, http.StatusBadRequest, "payload_b64", "base64"},
		{"payload bytes", http.MethodPost, `{"type":"echo","payload":[1,2]}`, http.StatusBadRequest, "payload", "want string"},
		{"bad timeout", http.MethodPost, `{"type":"echo","timeout":"soon"}`, http.StatusBadRequest, "timeout", "Go duration"},
		{"numeric timeout", http.MethodPost, `{"type":"echo","timeout":2}`, http.StatusBadRequest, "timeout", "want string"},
		{"negative timeout", http.MethodPost, `{"type":"echo","timeout":"-1s"}`, http.StatusBadRequest, "timeout", "out of range"},
		{"huge timeout", http.MethodPost, `{"type":"echo","timeout":"1h"}`, http.StatusBadRequest, "timeout", "at most"},
		{"empty label", http.MethodPost, `{"type":"echo","labels":["full",""]}`, http.StatusBadRequest, "labels", "entry 1"},
		{"negative min_head", http.MethodPost, `{"type":"echo","min_head":-1}`, http.StatusBadRequest, "min_head", "uint64"},
		{"payload too large", http.MethodPost, `{"type":"echo","payload":"` + strings.Repeat("x", 200) + `"}`, http.StatusRequestEntityTooLarge, "payload", "more than the 100"},
		{"body too large", http.MethodPost, `{"type":"echo","payload":"` + strings.Repeat("x", 2000) + `"}`, http.StatusRequestEntityTooLarge, "", "larger than 1024 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, f := newTestAPI(t, dispatch.WorkResult{Status: apiv1.StatusOK}, WithMaxBody(1024), WithMaxPayload(100), WithMaxTimeout(time.Minute))
			w := apiDo(t, a, tc.method, apiv1.WorkPath, tc.body)
			if w.Code != tc.code {
				t.Fatalf("code %d, want %d; body %s", w.Code, tc.code, w.Body)
			}
			if len(f.got) != 0 {
				t.Errorf("a refused request was dispatched: %+v", f.got)
			}
			var e apiv1.Error
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
				t.Fatalf("decode error body %q: %v", w.Body, err)
			}
			if e.Field != tc.field {
				t.Errorf("field %q, want %q (error %q)", e.Field, tc.field, e.Error)
			}
			if !strings.Contains(e.Error, tc.errSubstr) {
				t.Errorf("error %q does not say %q", e.Error, tc.errSubstr)
			}
			if tc.field != "" && !strings.HasPrefix(e.Error, tc.field+": ") {
				t.Errorf("error %q does not start by naming the field %q", e.Error, tc.field)
			}
			if tc.code == http.StatusMethodNotAllowed && w.Header().Get("Allow") != http.MethodPost {
				t.Errorf("Allow header %q, want POST", w.Header().Get("Allow"))
			}
		})
	}
}

func TestAPIEncodesResults(t *testing.T) {
	attempts := []apiv1.Attempt{
		{Peer: "12D3KooWdead", Outcome: workers.Unreachable, DurationMS: 1000, Error: "connect: timeout", Group: "full"},
		{Peer: "12D3KooWlive", Outcome: workers.Success, DurationMS: 2.5, Group: "archive", Hedge: true},
	}
	for _, tc := range []struct {
		name   string
		res    dispatch.WorkResult
		code   int
		check  func(t *testing.T, r apiv1.WorkResponse)
		reason string
	}{
		{"ok text", dispatch.WorkResult{RequestID: "r1", Status: apiv1.StatusOK, Output: []byte("héllo"), Worker: "12D3KooWlive", Attempts: attempts, Duration: 1500 * time.Millisecond},
			http.StatusOK, func(t *testing.T, r apiv1.WorkResponse) {
				if r.Result == nil || *r.Result != "héllo" || r.ResultB64 != nil {
					t.Errorf("result %v / %v, want text héllo", r.Result, r.ResultB64)
				}
				if r.RequestID != "r1" || r.Worker != "12D3KooWlive" || r.DurationMS != 1500 {
					t.Errorf("got %+v", r)
				}
				if !reflect.DeepEqual(r.Attempts, attempts) {
					t.Errorf("attempts %+v, want %+v", r.Attempts, attempts)
				}
			}, ""},
		{"ok binary", dispatch.WorkResult{Status: apiv1.StatusOK, Output: []byte{0xff, 0xfe, 0}, Worker: dispatch.LocalWorker},
			http.StatusOK, func(t *testing.T, r apiv1.WorkResponse) {
				if r.Result != nil || !bytes.Equal(r.ResultB64, []byte{0xff, 0xfe, 0}) {
					t.Errorf("result %v / %v, want base64 of ff fe 00", r.Result, r.ResultB64)
				}
				if !bytes.Equal(r.Output(), []byte{0xff, 0xfe, 0}) {
					t.Errorf("Output() = %v", r.Output())
				}
			}, ""},
		{"ok empty output", dispatch.WorkResult{Status: apiv1.StatusOK, Worker: dispatch.LocalWorker},
			http.StatusOK, func(t *testing.T, r apiv1.WorkResponse) {
				if r.Result == nil || *r.Result != "" {
					t.Errorf("result %v, want an empty string", r.Result)
				}
			}, ""},
		{"empty", dispatch.WorkResult{Status: apiv1.StatusEmpty, Worker: "12D3KooWlive"}, http.StatusOK, func(t *testing.T, r apiv1.WorkResponse) {
			if r.Result != nil || r.Attempts == nil {
				t.Errorf("empty: result %v, attempts %v (want no result, a non-nil list)", r.Result, r.Attempts)
			}
		}, ""},
		{"failed by worker", dispatch.WorkResult{Status: apiv1.StatusFailed, Worker: "12D3KooWlive", Error: "bad payload"}, http.StatusUnprocessableEntity,
			func(t *testing.T, r apiv1.WorkResponse) {
				if r.Error != "bad payload" {
					t.Errorf("error %q", r.Error)
				}
			}, reasonWorkFailed},
		{"every attempt failed", dispatch.WorkResult{Status: apiv1.StatusFailed, Attempts: attempts[:1], Error: "every attempt failed"}, http.StatusUnprocessableEntity, nil, reasonAllFailed},
		{"unavailable", dispatch.WorkResult{Status: apiv1.StatusUnavailable, Error: "no worker could take the work", Explanation: "0 candidates for work type nosuch"},
			http.StatusServiceUnavailable, func(t *testing.T, r apiv1.WorkResponse) {
				if r.Explanation != "0 candidates for work type nosuch" {
					t.Errorf("explanation %q", r.Explanation)
				}
			}, reasonNoWorker},
		{"timeout", dispatch.WorkResult{Status: apiv1.StatusTimeout, Error: "no result within 1s"}, http.StatusGatewayTimeout, nil, reasonTimeout},
		// Every worker busy until the deadline could no longer be met: 503,
		// not 422, counted apart from "no worker", with the wait it had.
		{"every worker busy", dispatch.WorkResult{Status: apiv1.StatusUnavailable, Busy: true, Attempts: attempts[:1],
			Error: "every worker that could run it is busy: waited 800ms in the admission queue", Queued: 800 * time.Millisecond, BusyRefusals: 7},
			http.StatusServiceUnavailable, func(t *testing.T, r apiv1.WorkResponse) {
				if r.QueuedMS != 800 || r.BusyRefusals != 7 || !strings.Contains(r.Error, "busy") {
					t.Errorf("queued %vms, %d busy refusals, error %q; want 800ms, 7, and why", r.QueuedMS, r.BusyRefusals, r.Error)
				}
			}, reasonBusy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := newTestAPI(t, tc.res)
			w := apiDo(t, a, http.MethodPost, apiv1.WorkPath, `{"type":"echo"}`)
			if w.Code != tc.code {
				t.Fatalf("code %d, want %d; body %s", w.Code, tc.code, w.Body)
			}
			dec := json.NewDecoder(w.Body)
			dec.DisallowUnknownFields()
			var r apiv1.WorkResponse
			if err := dec.Decode(&r); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if r.Status != tc.res.Status {
				t.Errorf("status %q, want %q", r.Status, tc.res.Status)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
			st := a.Stats()
			if st.Requests != 1 || st.ByStatus[tc.res.Status] != 1 {
				t.Errorf("stats %+v, want one request with status %s", st, tc.res.Status)
			}
			if tc.reason != "" && st.ByReason[tc.reason] != 1 {
				t.Errorf("stats %+v, want reason %s counted", st, tc.reason)
			}
			if tc.reason == "" && len(st.ByReason) != 0 {
				t.Errorf("stats %+v: a success counted a reason", st)
			}
		})
	}
}

func TestAPIStatsEndpoint(t *testing.T) {
	a, _ := newTestAPI(t, dispatch.WorkResult{Status: apiv1.StatusUnavailable})
	apiDo(t, a, http.MethodPost, apiv1.WorkPath, `{"type":"nosuch"}`)
	apiDo(t, a, http.MethodPost, apiv1.WorkPath, `{"payload":"x"}`)
	apiDo(t, a, http.MethodPut, apiv1.WorkPath, `{}`)

	w := apiDo(t, a, http.MethodGet, apiv1.WorkStatsPath, "")
	if w.Code != http.StatusOK {
		t.Fatalf("GET stats: code %d", w.Code)
	}
	var st apiv1.WorkStats
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	want := apiv1.WorkStats{
		Requests: 3,
		ByStatus: map[apiv1.Status]uint64{apiv1.StatusUnavailable: 1},
		ByReason: map[string]uint64{reasonNoWorker: 1, reasonBadRequest: 1, reasonMethod: 1},
	}
	if !reflect.DeepEqual(st, want) {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	if w := apiDo(t, a, http.MethodPost, apiv1.WorkStatsPath, ""); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST stats: code %d, want 405", w.Code)
	}
}

// TestAPIShuttingDownCountedApart: a request a stopping node refused is a
// 503 counted as shutting_down, not as a missing worker.
func TestAPIShuttingDownCountedApart(t *testing.T) {
	a, _ := newTestAPI(t, dispatch.WorkResult{RequestID: "r1", Status: apiv1.StatusUnavailable, Error: workers.ErrShuttingDown})
	w := apiDo(t, a, http.MethodPost, apiv1.WorkPath, `{"type":"echo","payload":"x"}`)
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "shutting down") {
		t.Errorf("code %d, body %s; want 503 saying the node is shutting down", w.Code, w.Body)
	}
	if st := a.Stats(); st.ByReason[reasonShutdown] != 1 || st.ByReason[reasonNoWorker] != 0 {
		t.Errorf("by reason %v, want shutting_down 1", st.ByReason)
	}
}

func TestAPIRegisterMountsBothPaths(t *testing.T) {
	a, _ := newTestAPI(t, dispatch.WorkResult{Status: apiv1.StatusOK})
	mux := http.NewServeMux()
	var patterns []string
	err := a.Register(func(p string, h http.Handler) error {
		patterns = append(patterns, p)
		mux.Handle(p, h)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(patterns, []string{apiv1.WorkPath, apiv1.WorkStatsPath}) {
		t.Errorf("mounted %v", patterns)
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Post(srv.URL+apiv1.WorkPath, "application/json", strings.NewReader(`{"type":"echo","payload":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("POST through a mux: %s", resp.Status)
	}
}

func TestNewAPIRejectsBadOptions(t *testing.T) {
	d := func(context.Context, dispatch.WorkRequest) dispatch.WorkResult { return dispatch.WorkResult{} }
	for name, opt := range map[string]Option{
		"tiny body":        WithMaxBody(1),
		"negative payload": WithMaxPayload(-1),
		"zero timeout":     WithMaxTimeout(0),
		"nil logger":       WithLogger(nil),
	} {
		if _, err := NewWork(d, opt); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := NewWork(nil); err == nil {
		t.Error("nil dispatch accepted")
	}
}

// A request whose client went away before its result (Ctrl-C on submit,
// a client's own timeout) is counted as the client's doing, not as a
// timeout of the network.
func TestAPIClientGoneCountedApart(t *testing.T) {
	a, err := NewWork(func(ctx context.Context, _ dispatch.WorkRequest) dispatch.WorkResult {
		<-ctx.Done()
		return dispatch.WorkResult{Status: apiv1.StatusTimeout, Error: "cancelled before a result"}
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the client is gone
	r := httptest.NewRequest(http.MethodPost, apiv1.WorkPath, strings.NewReader(`{"type":"echo","payload":"x"}`)).WithContext(ctx)
	a.ServeHTTP(httptest.NewRecorder(), r)
	if st := a.Stats(); st.ByReason[reasonClientGone] != 1 || st.ByReason[reasonTimeout] != 0 {
		t.Errorf("by reason %v, want client_gone 1 and no timeout", st.ByReason)
	}
}
