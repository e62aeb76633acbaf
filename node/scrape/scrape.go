package scrape

import "github.com/prometheus/client_golang/prometheus"

// Collector returns a Prometheus collector of metrics read at scrape
// time: it describes descs and the collectors in parts, and when scraped
// collects parts, then sends what read sends (constant metrics of descs,
// made from the state of the moment). It is the one shape of every
// workmesh collector: state is read when asked for, never copied into
// gauges as it changes.
func Collector(read func(ch chan<- prometheus.Metric), descs []*prometheus.Desc, parts ...prometheus.Collector) prometheus.Collector {
	return collector{read: read, descs: descs, parts: parts}
}

type collector struct {
	read  func(ch chan<- prometheus.Metric)
	descs []*prometheus.Desc
	parts []prometheus.Collector
}

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, p := range c.parts {
		p.Describe(ch)
	}
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.parts {
		p.Collect(ch)
	}
	if c.read != nil {
		c.read(ch)
	}
}
