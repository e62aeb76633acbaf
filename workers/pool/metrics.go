package pool

import "github.com/prometheus/client_golang/prometheus"

// Metric descriptions of the local worker.
var (
	descLocalInFlight = prometheus.NewDesc("workmesh_local_in_flight", "Requests the local worker runs now.", nil, nil)
	descLocalQueued   = prometheus.NewDesc("workmesh_local_queued", "Requests waiting for the local worker.", nil, nil)
	descLocalCapacity = prometheus.NewDesc("workmesh_local_capacity",
		"What the local worker takes at most: kind=concurrent runs at once, kind=queue may wait.", []string{"kind"}, nil)
)

// Collector returns a Prometheus collector of the local worker's load and
// capacity, read at scrape time.
func (p *Pool) Collector() prometheus.Collector { return collector{p} }

type collector struct{ p *Pool }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLocalInFlight
	ch <- descLocalQueued
	ch <- descLocalCapacity
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.p.Stats()
	ch <- prometheus.MustNewConstMetric(descLocalInFlight, prometheus.GaugeValue, float64(st.InFlight))
	ch <- prometheus.MustNewConstMetric(descLocalQueued, prometheus.GaugeValue, float64(st.Queued))
	ch <- prometheus.MustNewConstMetric(descLocalCapacity, prometheus.GaugeValue, float64(st.MaxConcurrent), "concurrent")
	ch <- prometheus.MustNewConstMetric(descLocalCapacity, prometheus.GaugeValue, float64(st.QueueSize), "queue")
}
