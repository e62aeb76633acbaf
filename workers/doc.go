// Package workers holds work types and their handlers, the local worker pool, the work protocol (client and server) and the dispatcher that turns a submitted request into attempts on remote workers or the local one.
package workers
