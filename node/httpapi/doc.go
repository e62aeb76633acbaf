// Package httpapi is the one HTTP server of a workmesh process: the mux that
// every package mounts its routes on, the API token check, panic recovery,
// the request body limit, and the one JSON writer and error shape of every
// answer, {"error": "...", "field": "..."} for any 4xx or 5xx, including
// the mux's own answers to an unknown path or a wrong method.
//
// httpapi may import the standard library and logrus only. It must not
// import libp2p or any workmesh package: node mounts its views on it, and
// the workers packages use its writer and error helper, so it sits below
// both and knows neither.
package httpapi
