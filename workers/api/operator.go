package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/node/httpapi"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// Operator serves what an operator asks a node on its local HTTP API:
// Prometheus metrics, the dispatcher's view of its peers, the plan a
// request would get, and the node's status.
type Operator struct {
	d      *dispatch.Dispatcher
	gather prometheus.Gatherer
	cfg    settings
}

// NewOperator returns the operator endpoints of dispatcher d; /metrics
// serves what gather collects (the node's own registry).
func NewOperator(d *dispatch.Dispatcher, gather prometheus.Gatherer, opts ...Option) (*Operator, error) {
	if d == nil || gather == nil {
		return nil, errors.New("operator API: needs a dispatcher and a metrics gatherer")
	}
	cfg, err := apply(settings{log: logrus.StandardLogger()}, "operator API", opts)
	if err != nil {
		return nil, err
	}
	return &Operator{d: d, gather: gather, cfg: cfg}, nil
}

// Register mounts the operator endpoints with handle; (*node.Node).HandleAPI
// fits.
func (o *Operator) Register(handle func(pattern string, h http.Handler) error) error {
	routes := []struct {
		pattern string
		h       http.Handler
	}{
		{"GET " + apiv1.MetricsPath, promhttp.HandlerFor(o.gather, promhttp.HandlerOpts{ErrorLog: promLogger{o.cfg.log}})},
		{"GET " + apiv1.PeerStatusPath, http.HandlerFunc(o.servePeers)},
		{"GET " + apiv1.PlanPath, http.HandlerFunc(o.servePlan)},
		{"GET " + apiv1.StatusPath, http.HandlerFunc(o.serveStatus)},
	}
	for _, r := range routes {
		if err := handle(r.pattern, r.h); err != nil {
			return fmt.Errorf("operator API: mount %s: %w", r.pattern, err)
		}
	}
	return nil
}

// promLogger passes promhttp's errors to the logger.
type promLogger struct{ log logrus.FieldLogger }

// Println implements promhttp.Logger.
func (l promLogger) Println(v ...any) { l.log.Warn(append([]any{"metrics: "}, v...)...) }

func (o *Operator) servePeers(w http.ResponseWriter, _ *http.Request) {
	o.write(w, http.StatusOK, o.d.PeerStatuses())
}

// maxPlanQuery bounds the query string of GET /v1/plan.
const maxPlanQuery = 4 << 10

func (o *Operator) servePlan(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.RawQuery) > maxPlanQuery {
		httpapi.WriteError(w, http.StatusRequestURITooLong, "", "query: longer than %d bytes", maxPlanQuery)
		return
	}
	q := r.URL.Query()
	for k := range q {
		if k != "type" && k != "labels" && k != "min_head" {
			httpapi.WriteError(w, http.StatusBadRequest, k, "%s: unknown parameter (the parameters are type, labels, min_head)", k)
			return
		}
	}
	req := apiv1.PlanRequest{Type: q.Get("type")}
	if req.Type == "" {
		httpapi.WriteError(w, http.StatusBadRequest, "type", "type: required (e.g. ?type=sha256)")
		return
	}
	if err := workers.ValidateTypeName(req.Type); err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, "type", "type: %v", err)
		return
	}
	for _, s := range q["labels"] {
		for l := range strings.SplitSeq(s, ",") {
			if l = strings.TrimSpace(l); l != "" {
				req.Labels = append(req.Labels, l)
			}
		}
	}
	if len(req.Labels) > maxLabels {
		httpapi.WriteError(w, http.StatusBadRequest, "labels", "labels: %d labels, more than %d", len(req.Labels), maxLabels)
		return
	}
	for i, l := range req.Labels {
		if len(l) > maxLabelLen {
			httpapi.WriteError(w, http.StatusBadRequest, "labels", "labels: entry %d: longer than %d bytes", i, maxLabelLen)
			return
		}
	}
	if s := q.Get("min_head"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, "min_head", "min_head: %q: want a non-negative integer", s)
			return
		}
		req.MinHead = &n
	}
	o.write(w, http.StatusOK, o.d.Plan(req))
}

func (o *Operator) serveStatus(w http.ResponseWriter, _ *http.Request) {
	v := o.d.Status()
	if o.cfg.statusWork != nil {
		st := o.cfg.statusWork.Stats()
		v.Requests = &st
	}
	if o.cfg.statusServer != nil {
		v.Served = map[string]uint64{}
		for out, n := range o.cfg.statusServer.Stats().ByOutcome {
			v.Served[out.String()] = n
		}
	}
	o.write(w, http.StatusOK, v)
}

// write answers with a view of the node (its peers, a plan, its status).
func (o *Operator) write(w http.ResponseWriter, code int, v any) {
	if err := httpapi.WriteJSON(w, code, v); err != nil {
		o.cfg.log.Debugf("operator API: write response: %v", err)
	}
}
