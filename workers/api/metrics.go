package api

import "github.com/prometheus/client_golang/prometheus"

// Metric descriptions of the work API.
var descAPIRefused = prometheus.NewDesc("workmesh_api_refused_total",
	"Requests to POST /v1/work refused before dispatch, by reason.", []string{"reason"}, nil)

// Collector returns a Prometheus collector of the requests the work API
// refused before dispatching them (bad_request, body_too_large,
// method_not_allowed). Dispatched requests are the dispatcher's
// workmesh_requests_total.
func (a *Work) Collector() prometheus.Collector { return apiCollector{a} }

type apiCollector struct{ a *Work }

// Describe implements prometheus.Collector.
func (c apiCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descAPIRefused }

// Collect implements prometheus.Collector.
func (c apiCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.a.Stats()
	for _, r := range []string{reasonBadRequest, reasonTooLarge, reasonMethod} {
		ch <- prometheus.MustNewConstMetric(descAPIRefused, prometheus.CounterValue, float64(st.ByReason[r]), r)
	}
}
