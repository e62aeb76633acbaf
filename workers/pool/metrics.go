package pool

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/workmesh/workmesh/node/scrape"
)

// Metric descriptions of the local worker.
var (
	descLocalInFlight = prometheus.NewDesc("workmesh_local_in_flight", "Requests the local worker runs now.", nil, nil)
	descLocalQueued   = prometheus.NewDesc("workmesh_local_queued", "Requests waiting for the local worker.", nil, nil)
	descLocalCapacity = prometheus.NewDesc("workmesh_local_capacity",
		"What the local worker takes at most: kind=concurrent runs at once, kind=queue may wait.", []string{"kind"}, nil)
)

// Collector returns a Prometheus collector of the local worker's load and
// capacity, read at scrape time.
func (p *Pool) Collector() prometheus.Collector {
	return scrape.Collector(p.collect, []*prometheus.Desc{descLocalInFlight, descLocalQueued, descLocalCapacity})
}

// collect sends the local worker's load and capacity now.
func (p *Pool) collect(ch chan<- prometheus.Metric) {
	st := p.Stats()
	ch <- prometheus.MustNewConstMetric(descLocalInFlight, prometheus.GaugeValue, float64(st.InFlight))
	ch <- prometheus.MustNewConstMetric(descLocalQueued, prometheus.GaugeValue, float64(st.Queued))
	ch <- prometheus.MustNewConstMetric(descLocalCapacity, prometheus.GaugeValue, float64(st.MaxConcurrent), "concurrent")
	ch <- prometheus.MustNewConstMetric(descLocalCapacity, prometheus.GaugeValue, float64(st.QueueSize), "queue")
}
