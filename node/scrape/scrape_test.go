package scrape

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestCollector: the descriptions and metrics of the parts and of read
// all reach a registry, and read runs at each scrape.
func TestCollector(t *testing.T) {
	desc := prometheus.NewDesc("workmesh_test_value", "A value read at scrape time.", nil, nil)
	counter := prometheus.NewCounter(prometheus.CounterOpts{Name: "workmesh_test_total", Help: "A counter."})
	value := 1.0
	c := Collector(func(ch chan<- prometheus.Metric) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, value)
	}, []*prometheus.Desc{desc}, counter)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	counter.Add(3)
	value = 7
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 2 {
		t.Fatalf("gathered %d families (%v), want 2", len(mfs), err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "workmesh_test_value":
			if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 7 {
				t.Errorf("value %v, want 7 (read at each scrape)", v)
			}
		case "workmesh_test_total":
			if v := mf.GetMetric()[0].GetCounter().GetValue(); v != 3 {
				t.Errorf("counter %v, want 3", v)
			}
		}
	}
}
