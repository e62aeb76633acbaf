package api

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/workmesh/workmesh/node/scrape"
)

// Metric descriptions of the work API.
var descAPIRefused = prometheus.NewDesc("workmesh_api_refused_total",
	"Requests to POST /v1/work refused before dispatch, by reason.", []string{"reason"}, nil)

// Collector returns a Prometheus collector of the requests the work API
// refused before dispatching them (bad_request, body_too_large,
// method_not_allowed). Dispatched requests are the dispatcher's
// workmesh_requests_total.
func (a *Work) Collector() prometheus.Collector {
	return scrape.Collector(a.collect, []*prometheus.Desc{descAPIRefused})
}

// collect sends the refusals counted so far.
func (a *Work) collect(ch chan<- prometheus.Metric) {
	st := a.Stats()
	for _, r := range []string{reasonBadRequest, reasonTooLarge, reasonMethod} {
		ch <- prometheus.MustNewConstMetric(descAPIRefused, prometheus.CounterValue, float64(st.ByReason[r]), r)
	}
}
