//go:build !race

package tests

// raceDetector is true when the tests run under the race detector (see
// hostile_race_test.go).
const raceDetector = false
