// Package testkit holds the helpers workmesh's tests share: a clock tests
// move by hand, a wait for a condition with a deadline, the lookup of a
// metric's value in a scrape, and an HTTP server that answers in bursts.
//
// It imports the standard library, testing and the Prometheus client
// libraries only, nothing of workmesh, so that every package's tests can
// use it without an import cycle. Only test files may import it: non-test
// code must not, so that none of it reaches the binary (TestImports checks
// both rules).
package testkit
