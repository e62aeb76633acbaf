package workers

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sirupsen/logrus"
)

// Paths of the work API on a node's local HTTP API.
const (
	// WorkPath takes work: POST a JSON APIRequest, get an APIResponse.
	WorkPath = "/v1/work"
	// WorkStatsPath reports the API's counters: GET returns APIStats.
	WorkStatsPath = "/v1/work/stats"
)

// Defaults of the work API.
const (
	// DefaultAPIMaxBody bounds a request body. It leaves room for a payload
	// of DefaultMaxPayload bytes in base64 (a third larger) and JSON escapes.
	DefaultAPIMaxBody = 2 << 20
	// DefaultAPIMaxTimeout is the longest timeout a request may ask for; it
	// matches what a work server gives one request at most.
	DefaultAPIMaxTimeout = DefaultMaxWorkTime
	// maxLabels and maxLabelLen bound the labels of one request.
	maxLabels   = 32
	maxLabelLen = 64
)

// DispatchFunc runs one request to its one terminal result.
// (*Dispatcher).Dispatch is one; the API depends on nothing more, so its
// parsing and encoding can be tested without a network.
type DispatchFunc func(ctx context.Context, req WorkRequest) WorkResult

// APIRequest is the body of POST /v1/work. Payload and PayloadB64 are
// mutually exclusive; neither means an empty payload.
type APIRequest struct {
	// Type is the work type; required.
	Type string `json:"type"`
	// Payload is the work's input as text.
	Payload *string `json:"payload,omitempty"`
	// PayloadB64 is the work's input as standard base64, for bytes that are
	// not text.
	PayloadB64 *string `json:"payload_b64,omitempty"`
	// Timeout bounds the whole request, as a Go duration ("2s"); empty
	// means the dispatcher's default.
	Timeout string `json:"timeout,omitempty"`
	// Labels a remote worker must carry.
	Labels []string `json:"labels,omitempty"`
	// MinHead is the position the request names, if any.
	MinHead *uint64 `json:"min_head,omitempty"`
}

// apiFields lists the fields of APIRequest, in the order errors name them.
var apiFields = []string{"type", "payload", "payload_b64", "timeout", "labels", "min_head"}

// APIResponse is the answer to POST /v1/work for a request that was
// dispatched: its one terminal result.
type APIResponse struct {
	// RequestID names the request in logs.
	RequestID string `json:"request_id"`
	// Status is ok, empty, failed, timeout or unavailable.
	Status Status `json:"status"`
	// Result is the output when it is valid UTF-8 (status ok).
	Result *string `json:"result,omitempty"`
	// ResultB64 is the output, base64 in JSON, when it is not valid UTF-8.
	ResultB64 []byte `json:"result_b64,omitempty"`
	// Worker is "local" or the peer ID that produced the result.
	Worker string `json:"worker,omitempty"`
	// Attempts lists every attempt in the order they ended.
	Attempts []Attempt `json:"attempts"`
	// DurationMS is the time from submission to result, in milliseconds.
	DurationMS float64 `json:"duration_ms"`
	// Error says why the request did not succeed.
	Error string `json:"error,omitempty"`
	// Explanation says why no (further) remote worker was tried, counted by
	// reason.
	Explanation string `json:"explanation,omitempty"`
}

// Output returns the result's bytes, whichever field carries them.
func (r APIResponse) Output() []byte {
	if r.Result != nil {
		return []byte(*r.Result)
	}
	return r.ResultB64
}

// APIError is the answer when a request was not dispatched: a bad body, a
// wrong method, a body that is too large.
type APIError struct {
	// Error says what is wrong.
	Error string `json:"error"`
	// Field names the body field at fault, when there is one.
	Field string `json:"field,omitempty"`
}

// APIStats is the body of GET /v1/work/stats: how the API's requests ended
// since the node started.
type APIStats struct {
	// Requests counts every request to WorkPath, dispatched or not.
	Requests uint64 `json:"requests"`
	// ByStatus counts dispatched requests by their result's status.
	ByStatus map[Status]uint64 `json:"by_status"`
	// ByReason counts requests that did not succeed by why:
	// bad_request, body_too_large, method_not_allowed (not dispatched);
	// no_worker (unavailable), shutting_down (unavailable: the node is
	// stopping), work_failed (a worker said the work cannot succeed),
	// all_attempts_failed, timeout.
	ByReason map[string]uint64 `json:"by_reason"`
}

// Reasons counted in APIStats.ByReason.
const (
	reasonBadRequest   = "bad_request"
	reasonTooLarge     = "body_too_large"
	reasonMethod       = "method_not_allowed"
	reasonNoWorker     = "no_worker"
	reasonShutdown     = "shutting_down"
	reasonWorkFailed   = "work_failed"
	reasonAllFailed    = "all_attempts_failed"
	reasonTimeout      = "timeout"
	reasonUnknownState = "unknown_status"
)

type apiConfig struct {
	maxBody    int64
	maxPayload int
	maxTimeout time.Duration
	log        logrus.FieldLogger
}

// APIOption adjusts an API.
type APIOption func(*apiConfig) error

// WithAPIMaxBody bounds a request body, in bytes (default DefaultAPIMaxBody).
func WithAPIMaxBody(n int64) APIOption {
	return func(c *apiConfig) error {
		if n < 64 {
			return fmt.Errorf("work API: max body %d bytes: want at least 64", n)
		}
		c.maxBody = n
		return nil
	}
}

// WithAPIMaxPayload bounds a request's decoded payload, in bytes (default
// DefaultMaxPayload, what the work protocol carries).
func WithAPIMaxPayload(n int) APIOption {
	return func(c *apiConfig) error {
		if n < 0 {
			return fmt.Errorf("work API: max payload %d bytes: want 0 or more", n)
		}
		c.maxPayload = n
		return nil
	}
}

// WithAPIMaxTimeout bounds the timeout a request may ask for (default
// DefaultAPIMaxTimeout).
func WithAPIMaxTimeout(d time.Duration) APIOption {
	return func(c *apiConfig) error {
		if d <= 0 {
			return fmt.Errorf("work API: max timeout %s: want more than 0", d)
		}
		c.maxTimeout = d
		return nil
	}
}

// WithAPILogger sets the logger for failures to write a response.
func WithAPILogger(log logrus.FieldLogger) APIOption {
	return func(c *apiConfig) error {
		if log == nil {
			return errors.New("work API: nil logger")
		}
		c.log = log
		return nil
	}
}

// API is the HTTP face of a dispatcher: POST /v1/work submits work and
// waits for its result, GET /v1/work/stats reports counters. It is an
// http.Handler serving both paths.
type API struct {
	dispatch DispatchFunc
	cfg      apiConfig

	mu       sync.Mutex
	requests uint64
	byStatus map[Status]uint64
	byReason map[string]uint64
}

// NewAPI returns the work API in front of dispatch.
func NewAPI(dispatch DispatchFunc, opts ...APIOption) (*API, error) {
	if dispatch == nil {
		return nil, errors.New("work API: nil dispatch function")
	}
	cfg := apiConfig{
		maxBody:    DefaultAPIMaxBody,
		maxPayload: DefaultMaxPayload,
		maxTimeout: DefaultAPIMaxTimeout,
		log:        logrus.StandardLogger(),
	}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	return &API{dispatch: dispatch, cfg: cfg, byStatus: map[Status]uint64{}, byReason: map[string]uint64{}}, nil
}

// Register mounts the API's paths with handle; (*node.Node).HandleAPI fits.
func (a *API) Register(handle func(pattern string, h http.Handler) error) error {
	for _, p := range []string{WorkPath, WorkStatsPath} {
		if err := handle(p, a); err != nil {
			return fmt.Errorf("work API: mount %s: %w", p, err)
		}
	}
	return nil
}

// ServeHTTP serves WorkPath and WorkStatsPath.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case WorkPath:
		a.serveWork(w, r)
	case WorkStatsPath:
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			a.writeJSON(w, http.StatusMethodNotAllowed, APIError{Error: r.Method + " " + WorkStatsPath + ": want GET"})
			return
		}
		a.writeJSON(w, http.StatusOK, a.Stats())
	default:
		a.writeJSON(w, http.StatusNotFound, APIError{Error: "no such path: " + r.URL.Path})
	}
}

// Stats returns a copy of the API's counters.
func (a *API) Stats() APIStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := APIStats{Requests: a.requests, ByStatus: make(map[Status]uint64, len(a.byStatus)), ByReason: make(map[string]uint64, len(a.byReason))}
	for k, v := range a.byStatus {
		st.ByStatus[k] = v
	}
	for k, v := range a.byReason {
		st.ByReason[k] = v
	}
	return st
}

func (a *API) count(status Status, reason string) {
	a.mu.Lock()
	a.requests++
	if status != "" {
		a.byStatus[status]++
	}
	if reason != "" {
		a.byReason[reason]++
	}
	a.mu.Unlock()
}

// badRequest is a request the API refuses before dispatching it.
type badRequest struct {
	code   int
	reason string
	APIError
}

func invalid(field, format string, args ...any) *badRequest {
	msg := fmt.Sprintf(format, args...)
	if field != "" {
		msg = field + ": " + msg
	}
	return &badRequest{code: http.StatusBadRequest, reason: reasonBadRequest, APIError: APIError{Error: msg, Field: field}}
}

func (a *API) serveWork(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		a.count("", reasonMethod)
		w.Header().Set("Allow", http.MethodPost)
		a.writeJSON(w, http.StatusMethodNotAllowed, APIError{Error: r.Method + " " + WorkPath + ": want POST with a JSON body"})
		return
	}
	req, bad := a.parse(w, r)
	if bad != nil {
		a.count("", bad.reason)
		a.writeJSON(w, bad.code, bad.APIError)
		return
	}
	res := a.dispatch(r.Context(), req)
	code, reason := classify(res)
	a.count(res.Status, reason)
	a.writeJSON(w, code, responseOf(res))
}

// classify maps a result to its HTTP status code and, when it did not
// succeed, the reason it is counted under.
func classify(res WorkResult) (int, string) {
	switch res.Status {
	case StatusOK, StatusEmpty:
		return http.StatusOK, ""
	case StatusFailed:
		// A deciding worker is named only when one answered for the
		// request; otherwise every attempt failed on its own account.
		if res.Worker != "" {
			return http.StatusUnprocessableEntity, reasonWorkFailed
		}
		return http.StatusUnprocessableEntity, reasonAllFailed
	case StatusUnavailable:
		if res.Error == ErrShuttingDown {
			return http.StatusServiceUnavailable, reasonShutdown
		}
		return http.StatusServiceUnavailable, reasonNoWorker
	case StatusTimeout:
		return http.StatusGatewayTimeout, reasonTimeout
	}
	return http.StatusInternalServerError, reasonUnknownState
}

// responseOf is the API form of a result.
func responseOf(res WorkResult) APIResponse {
	out := APIResponse{
		RequestID:   res.RequestID,
		Status:      res.Status,
		Worker:      res.Worker,
		Attempts:    res.Attempts,
		DurationMS:  ms(res.Duration),
		Error:       res.Error,
		Explanation: res.Explanation,
	}
	if out.Attempts == nil {
		out.Attempts = []Attempt{}
	}
	if res.Status == StatusOK {
		if utf8.Valid(res.Output) {
			s := string(res.Output)
			out.Result = &s
		} else {
			out.ResultB64 = res.Output
		}
	}
	return out
}

// parse reads and checks the body of POST /v1/work. Every field is decoded
// on its own so that an error names the field at fault.
func (a *API) parse(w http.ResponseWriter, r *http.Request) (WorkRequest, *badRequest) {
	limited := http.MaxBytesReader(w, r.Body, a.cfg.maxBody)
	raw, err := io.ReadAll(limited)
	if err != nil {
		if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return WorkRequest{}, &badRequest{code: http.StatusRequestEntityTooLarge, reason: reasonTooLarge,
				APIError: APIError{Error: fmt.Sprintf("body: larger than %d bytes", mbe.Limit)}}
		}
		return WorkRequest{}, invalid("", "body: read: %v", err)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return WorkRequest{}, invalid("", "body: empty; want a JSON object with at least \"type\"")
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&fields); err != nil {
		return WorkRequest{}, invalid("", "body: want a JSON object: %v", err)
	}
	if fields == nil {
		return WorkRequest{}, invalid("", "body: want a JSON object, got null")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return WorkRequest{}, invalid("", "body: unexpected data after the JSON object")
	}
	var unknown []string
	for k := range fields {
		if !slices.Contains(apiFields, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return WorkRequest{}, invalid(unknown[0], "unknown field (the fields are %s)", strings.Join(apiFields, ", "))
	}

	var in APIRequest
	targets := map[string]any{
		"type": &in.Type, "payload": &in.Payload, "payload_b64": &in.PayloadB64,
		"timeout": &in.Timeout, "labels": &in.Labels, "min_head": &in.MinHead,
	}
	for _, name := range apiFields {
		v, ok := fields[name]
		if !ok {
			continue
		}
		if err := json.Unmarshal(v, targets[name]); err != nil {
			return WorkRequest{}, invalid(name, "%s", describeJSONError(err))
		}
	}
	return a.check(in)
}

// describeJSONError turns a decode error of one field into a short
// message.
func describeJSONError(err error) string {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return fmt.Sprintf("want %s, got JSON %s", te.Type, te.Value)
	}
	return err.Error()
}

// check validates a decoded body and turns it into a WorkRequest.
func (a *API) check(b APIRequest) (WorkRequest, *badRequest) {
	if b.Type == "" {
		return WorkRequest{}, invalid("type", "required")
	}
	if err := ValidateTypeName(b.Type); err != nil {
		return WorkRequest{}, invalid("type", "%v", err)
	}
	req := WorkRequest{Type: b.Type, MinHead: b.MinHead}
	switch {
	case b.Payload != nil && b.PayloadB64 != nil:
		return WorkRequest{}, invalid("payload_b64", "give payload or payload_b64, not both")
	case b.Payload != nil:
		req.Payload = []byte(*b.Payload)
	case b.PayloadB64 != nil:
		p, err := base64.StdEncoding.DecodeString(*b.PayloadB64)
		if err != nil {
			return WorkRequest{}, invalid("payload_b64", "not standard base64: %v", err)
		}
		req.Payload = p
	}
	if len(req.Payload) > a.cfg.maxPayload {
		field := "payload"
		if b.PayloadB64 != nil {
			field = "payload_b64"
		}
		return WorkRequest{}, &badRequest{code: http.StatusRequestEntityTooLarge, reason: reasonTooLarge, APIError: APIError{
			Error: fmt.Sprintf("%s: %d bytes, more than the %d a request may carry", field, len(req.Payload), a.cfg.maxPayload),
			Field: field,
		}}
	}
	if b.Timeout != "" {
		d, err := time.ParseDuration(b.Timeout)
		if err != nil {
			return WorkRequest{}, invalid("timeout", "want a Go duration such as \"2s\" or \"500ms\": %v", err)
		}
		if d <= 0 || d > a.cfg.maxTimeout {
			return WorkRequest{}, invalid("timeout", "%s is out of range: want more than 0 and at most %s", d, a.cfg.maxTimeout)
		}
		req.Timeout = d
	}
	if len(b.Labels) > maxLabels {
		return WorkRequest{}, invalid("labels", "%d labels, more than %d", len(b.Labels), maxLabels)
	}
	for i, l := range b.Labels {
		if l == "" || len(l) > maxLabelLen {
			return WorkRequest{}, invalid("labels", "entry %d (%q): want 1 to %d bytes", i, l, maxLabelLen)
		}
	}
	req.Labels = b.Labels
	return req, nil
}

func (a *API) writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		a.cfg.log.Debugf("work API: write response: %v", err)
	}
}
