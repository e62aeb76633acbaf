package api

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
	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/node/httpapi"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
	"github.com/workmesh/workmesh/workers/protocol"
)

// Defaults of the work API.
const (
	// DefaultMaxTimeout is the longest timeout a request may ask for; it
	// matches what a work server gives one request at most.
	DefaultMaxTimeout = protocol.DefaultMaxWorkTime
	// maxLabels and maxLabelLen bound the labels of one request.
	maxLabels   = 32
	maxLabelLen = 64
)

// DispatchFunc runs one request to its one terminal result.
// (*Dispatcher).Dispatch is one; the API depends on nothing more, so its
// parsing and encoding can be tested without a network.
type DispatchFunc func(ctx context.Context, req dispatch.WorkRequest) dispatch.WorkResult

// apiFields lists the fields of APIRequest, in the order errors name them.
var apiFields = []string{"type", "payload", "payload_b64", "timeout", "labels", "min_head", "verify"}

// Reasons counted in APIStats.ByReason.
const (
	reasonBadRequest   = "bad_request"
	reasonTooLarge     = "body_too_large"
	reasonMethod       = "method_not_allowed"
	reasonNoWorker     = "no_worker"
	reasonBusy         = "all_workers_busy"
	reasonShutdown     = "shutting_down"
	reasonWorkFailed   = "work_failed"
	reasonAllFailed    = "all_attempts_failed"
	reasonTimeout      = "timeout"
	reasonClientGone   = "client_gone" // the client went away before the result
	reasonUnknownState = "unknown_status"
	reasonDisputed     = "disputed"
)

// Work is the HTTP face of a dispatcher: POST /v1/work submits work and
// waits for its result, GET /v1/work/stats reports counters. It is an
// http.Handler serving both paths.
type Work struct {
	dispatch DispatchFunc
	cfg      settings

	mu       sync.Mutex
	requests uint64
	byStatus map[apiv1.Status]uint64
	byReason map[string]uint64
}

// NewWork returns the work API in front of dispatch.
func NewWork(do DispatchFunc, opts ...Option) (*Work, error) {
	if do == nil {
		return nil, errors.New("work API: nil dispatch function")
	}
	cfg, err := apply(settings{
		maxBody:    apiv1.DefaultMaxBody,
		maxPayload: workers.DefaultMaxPayload,
		maxTimeout: DefaultMaxTimeout,
		log:        logrus.StandardLogger(),
	}, "work API", opts)
	if err != nil {
		return nil, err
	}
	return &Work{dispatch: do, cfg: cfg, byStatus: map[apiv1.Status]uint64{}, byReason: map[string]uint64{}}, nil
}

// Register mounts the work route's paths with handle; (*node.Node).HandleAPI fits.
func (a *Work) Register(handle func(pattern string, h http.Handler) error) error {
	for _, p := range []string{apiv1.WorkPath, apiv1.WorkStatsPath} {
		if err := handle(p, a); err != nil {
			return fmt.Errorf("work API: mount %s: %w", p, err)
		}
	}
	return nil
}

// ServeHTTP serves WorkPath and WorkStatsPath.
func (a *Work) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case apiv1.WorkPath:
		a.serveWork(w, r)
	case apiv1.WorkStatsPath:
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			httpapi.WriteError(w, http.StatusMethodNotAllowed, "", "%s %s: want GET", r.Method, apiv1.WorkStatsPath)
			return
		}
		a.writeJSON(w, http.StatusOK, a.Stats())
	default:
		httpapi.WriteError(w, http.StatusNotFound, "", "no such path: %s", r.URL.Path)
	}
}

// Stats returns a copy of the work route's counters.
func (a *Work) Stats() apiv1.WorkStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := apiv1.WorkStats{Requests: a.requests, ByStatus: make(map[apiv1.Status]uint64, len(a.byStatus)), ByReason: make(map[string]uint64, len(a.byReason))}
	for k, v := range a.byStatus {
		st.ByStatus[k] = v
	}
	for k, v := range a.byReason {
		st.ByReason[k] = v
	}
	return st
}

func (a *Work) count(status apiv1.Status, reason string) {
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
	apiv1.Error
}

func invalid(field, format string, args ...any) *badRequest {
	msg := fmt.Sprintf(format, args...)
	if field != "" {
		msg = field + ": " + msg
	}
	return &badRequest{code: http.StatusBadRequest, reason: reasonBadRequest, Error: apiv1.Error{Error: msg, Field: field}}
}

func (a *Work) serveWork(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		a.count("", reasonMethod)
		w.Header().Set("Allow", http.MethodPost)
		httpapi.WriteError(w, http.StatusMethodNotAllowed, "", "%s %s: want POST with a JSON body", r.Method, apiv1.WorkPath)
		return
	}
	req, bad := a.parse(w, r)
	if bad != nil {
		a.count("", bad.reason)
		httpapi.WriteError(w, bad.code, bad.Field, "%s", bad.Error.Error)
		return
	}
	res := a.dispatch(r.Context(), req)
	if res.Invalid {
		// Refused as asked (verify of a type that is not deterministic).
		a.count("", reasonBadRequest)
		httpapi.WriteError(w, http.StatusBadRequest, "verify", "%s", res.Error)
		return
	}
	code, reason := classify(res)
	if reason == reasonTimeout && r.Context().Err() != nil {
		reason = reasonClientGone // not the network's doing
	}
	a.count(res.Status, reason)
	a.writeJSON(w, code, responseOf(res))
}

// classify maps a result to its HTTP status code and, when it did not
// succeed, the reason it is counted under.
func classify(res dispatch.WorkResult) (int, string) {
	switch res.Status {
	case apiv1.StatusOK, apiv1.StatusEmpty:
		return http.StatusOK, ""
	case apiv1.StatusFailed:
		// A deciding worker is named only when one answered for the
		// request; otherwise every attempt failed on its own account.
		if res.Worker != "" {
			return http.StatusUnprocessableEntity, reasonWorkFailed
		}
		return http.StatusUnprocessableEntity, reasonAllFailed
	case apiv1.StatusUnavailable:
		if res.Error == workers.ErrShuttingDown {
			return http.StatusServiceUnavailable, reasonShutdown
		}
		if res.Busy {
			// Every worker stayed busy until the request's deadline could
			// no longer be met: the network is overloaded, not broken.
			return http.StatusServiceUnavailable, reasonBusy
		}
		return http.StatusServiceUnavailable, reasonNoWorker
	case apiv1.StatusTimeout:
		return http.StatusGatewayTimeout, reasonTimeout
	case apiv1.StatusDisputed:
		// The workers answered, with results that conflict.
		return http.StatusConflict, reasonDisputed
	}
	return http.StatusInternalServerError, reasonUnknownState
}

// responseOf is the API form of a result.
func responseOf(res dispatch.WorkResult) apiv1.WorkResponse {
	out := apiv1.WorkResponse{
		RequestID:    res.RequestID,
		Status:       res.Status,
		Worker:       res.Worker,
		Attempts:     res.Attempts,
		DurationMS:   apiv1.Millis(res.Duration),
		Error:        res.Error,
		Explanation:  res.Explanation,
		QueuedMS:     apiv1.Millis(res.Queued),
		BusyRefusals: res.BusyRefusals,
		Verify:       res.Verify,
	}
	if out.Attempts == nil {
		out.Attempts = []apiv1.Attempt{}
	}
	if d := res.Detail; d != nil && res.Status != apiv1.StatusOK {
		out.FailureDetail = detailOf(d)
	}
	if res.Status == apiv1.StatusOK {
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
func (a *Work) parse(w http.ResponseWriter, r *http.Request) (dispatch.WorkRequest, *badRequest) {
	limited := http.MaxBytesReader(w, r.Body, a.cfg.maxBody)
	raw, err := io.ReadAll(limited)
	if err != nil {
		if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return dispatch.WorkRequest{}, &badRequest{code: http.StatusRequestEntityTooLarge, reason: reasonTooLarge,
				Error: apiv1.Error{Error: fmt.Sprintf("body: larger than %d bytes", mbe.Limit)}}
		}
		return dispatch.WorkRequest{}, invalid("", "body: read: %v", err)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return dispatch.WorkRequest{}, invalid("", "body: empty; want a JSON object with at least \"type\"")
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&fields); err != nil {
		return dispatch.WorkRequest{}, invalid("", "body: want a JSON object: %v", err)
	}
	if fields == nil {
		return dispatch.WorkRequest{}, invalid("", "body: want a JSON object, got null")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return dispatch.WorkRequest{}, invalid("", "body: unexpected data after the JSON object")
	}
	var unknown []string
	for k := range fields {
		if !slices.Contains(apiFields, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return dispatch.WorkRequest{}, invalid(unknown[0], "unknown field (the fields are %s)", strings.Join(apiFields, ", "))
	}

	var in apiv1.WorkRequest
	targets := map[string]any{
		"type": &in.Type, "payload": &in.Payload, "payload_b64": &in.PayloadB64,
		"timeout": &in.Timeout, "labels": &in.Labels, "min_head": &in.MinHead,
		"verify": &in.Verify,
	}
	for _, name := range apiFields {
		v, ok := fields[name]
		if !ok {
			continue
		}
		if err := json.Unmarshal(v, targets[name]); err != nil {
			return dispatch.WorkRequest{}, invalid(name, "%s", httpapi.DescribeJSONError(err))
		}
	}
	return a.check(in)
}

// check validates a decoded body and turns it into a WorkRequest.
func (a *Work) check(b apiv1.WorkRequest) (dispatch.WorkRequest, *badRequest) {
	if b.Type == "" {
		return dispatch.WorkRequest{}, invalid("type", "required")
	}
	if err := workers.ValidateTypeName(b.Type); err != nil {
		return dispatch.WorkRequest{}, invalid("type", "%v", err)
	}
	req := dispatch.WorkRequest{Type: b.Type, MinHead: b.MinHead}
	switch {
	case b.Payload != nil && b.PayloadB64 != nil:
		return dispatch.WorkRequest{}, invalid("payload_b64", "give payload or payload_b64, not both")
	case b.Payload != nil:
		req.Payload = []byte(*b.Payload)
	case b.PayloadB64 != nil:
		p, err := base64.StdEncoding.DecodeString(*b.PayloadB64)
		if err != nil {
			return dispatch.WorkRequest{}, invalid("payload_b64", "not standard base64: %v", err)
		}
		req.Payload = p
	}
	if len(req.Payload) > a.cfg.maxPayload {
		field := "payload"
		if b.PayloadB64 != nil {
			field = "payload_b64"
		}
		return dispatch.WorkRequest{}, &badRequest{code: http.StatusRequestEntityTooLarge, reason: reasonTooLarge, Error: apiv1.Error{
			Error: fmt.Sprintf("%s: %d bytes, more than the %d a request may carry", field, len(req.Payload), a.cfg.maxPayload),
			Field: field,
		}}
	}
	if b.Timeout != "" {
		d, err := time.ParseDuration(b.Timeout)
		if err != nil {
			return dispatch.WorkRequest{}, invalid("timeout", "want a Go duration such as \"2s\" or \"500ms\": %v", err)
		}
		if d <= 0 || d > a.cfg.maxTimeout {
			return dispatch.WorkRequest{}, invalid("timeout", "%s is out of range: want more than 0 and at most %s", d, a.cfg.maxTimeout)
		}
		req.Timeout = d
	}
	if len(b.Labels) > maxLabels {
		return dispatch.WorkRequest{}, invalid("labels", "%d labels, more than %d", len(b.Labels), maxLabels)
	}
	for i, l := range b.Labels {
		if l == "" || len(l) > maxLabelLen {
			return dispatch.WorkRequest{}, invalid("labels", "entry %d (%q): want 1 to %d bytes", i, l, maxLabelLen)
		}
	}
	req.Labels = b.Labels
	if v := b.Verify; v != nil {
		req.Verify = config.Verify{Replicas: v.Replicas, Agree: v.Agree}
		if p := req.Verify.Problem(); p != "" || !req.Verify.On() {
			if p == "" {
				p = "replicas 0: give replicas and agree, such as {\"replicas\": 3, \"agree\": 2}"
			}
			return dispatch.WorkRequest{}, invalid("verify", "%s", p)
		}
	}
	return req, nil
}

// writeJSON answers with a body that is not an error of the request: the
// route's counters, or a work result (which carries its own status, and
// an HTTP status of 4xx or 5xx when the work did not succeed).
func (a *Work) writeJSON(w http.ResponseWriter, code int, v any) {
	if err := httpapi.WriteJSON(w, code, v); err != nil {
		a.cfg.log.Debugf("work API: write response: %v", err)
	}
}

// detailOf is the API form of a failure's detail.
func detailOf(d *workers.Detail) apiv1.FailureDetail {
	f := apiv1.FailureDetail{Stderr: d.Stderr, HTTPStatus: d.HTTPStatus, HTTPBody: d.Body, RetryAfterMS: apiv1.Millis(d.RetryAfter)}
	if d.HasExitCode {
		code := d.ExitCode
		f.ExitCode = &code
	}
	return f
}
