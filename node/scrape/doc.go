// Package scrape is the one shape of a workmesh Prometheus collector:
// metrics read from the state of the moment when /metrics is scraped,
// beside the counters a part keeps as things happen.
//
// It imports the Prometheus client only; node and the workers packages
// use it.
package scrape
