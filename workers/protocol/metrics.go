package protocol

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/workmesh/workmesh/node/scrape"
)

// Metric descriptions of the work server.
var (
	descServed = prometheus.NewDesc("workmesh_served_total",
		"Work requests from peers answered by this node's work server, by outcome.", []string{"outcome"}, nil)
	descServedMalformed = prometheus.NewDesc("workmesh_served_malformed_total",
		"Work requests from peers that could not be read or decoded.", nil, nil)
	descServedDropped = prometheus.NewDesc("workmesh_served_dropped_total",
		"Work requests from peers that ended without a response for another reason.", nil, nil)
)

// Collector returns a Prometheus collector of the work server's counters
// (what this node did for its peers), read at scrape time.
func (s *Server) Collector() prometheus.Collector {
	return scrape.Collector(s.collect, []*prometheus.Desc{descServed, descServedMalformed, descServedDropped})
}

// collect sends the work server's counters now.
func (s *Server) collect(ch chan<- prometheus.Metric) {
	st := s.Stats()
	for o, n := range st.ByOutcome {
		ch <- prometheus.MustNewConstMetric(descServed, prometheus.CounterValue, float64(n), o.String())
	}
	ch <- prometheus.MustNewConstMetric(descServedMalformed, prometheus.CounterValue, float64(st.Malformed))
	ch <- prometheus.MustNewConstMetric(descServedDropped, prometheus.CounterValue, float64(st.Dropped))
}
