// Package custom is the operator's own work types, declared in the
// custom-types block of the configuration: a Command runs a program
// (payload on stdin, result from stdout, no shell, a clean environment,
// its process group killed when the request ends) and a Service POSTs the
// payload to a local HTTP service (the response body is the result).
// Failures carry a workers.Detail: the exit code and the end of stderr, or
// the HTTP status and the body. A Service with a health URL polls it and
// reports, per work type, whether it can work (TypeHealth).
package custom
