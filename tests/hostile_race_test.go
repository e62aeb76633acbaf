//go:build race

package tests

// raceDetector is true when the tests run under the race detector, which
// slows every goroutine several times over: timing bounds are not judged
// then (the races still are).
const raceDetector = true
