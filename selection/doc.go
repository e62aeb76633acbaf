// Package selection is workmesh's shared selection core: it decides which
// remote peer a request goes to next. A dispatcher hands it candidates (peer,
// group labels, heads, load) and the outcome of every attempt, and asks a
// per-request Plan for the next peer to try; the core answers with a peer, or
// with the reasons why none is left. The same decision, candidate by
// candidate (Plan.Candidates), is what views such as GET /v1/plan show, so
// no view decides again why a peer was left out.
//
// The core covers the rules of one dispatch: eligibility by label and head,
// the beyond-head rule (an empty answer above every head is final), priority
// groups by label with pass-on-error and include-default, rating from windowed
// outcomes, liveness polling with a decaying failure counter, and the
// per-request budget of remote peers, retries and hedges.
//
// selection is pure: of workmesh's packages it imports only config, it imports
// no libp2p, starts no goroutines and reads the time only through an injected
// Clock, so every rule is testable with a fake clock and usable by any
// transport. Ranking is computed off the request path (Selector.Refresh) and
// published as an immutable snapshot; a request does one atomic load and takes
// no lock shared with other requests.
package selection

import "time"

// Clock tells the time. Tests inject a fake one.
type Clock interface {
	Now() time.Time
}

// SystemClock is the Clock of the real world.
type SystemClock struct{}

// Now returns the current time.
func (SystemClock) Now() time.Time { return time.Now() }
