// Package httpwork is the http work type: fetch a URL and return its
// status, selected headers and body. Loopback, private and other special
// addresses are refused unless http-allow lists them (host, address or
// CIDR, each with an optional port), and the node's own API and listen
// ports are refused whatever it lists; the checks run on the address
// actually dialed.
//
// It imports config and the workers vocabulary; no libp2p.
package httpwork
