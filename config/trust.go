package config

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// TrustConfig drives the checks of results: disputes (a worker outvoted by
// others), audits and the exploration budget of unproven peers (README,
// "Checked results").
type TrustConfig struct {
	// ExploreShare bounds the share of any ExploreWindow requests in a row
	// whose first attempt goes to a peer that has not proven itself (fewer
	// than rating-min-samples outcomes) while a proven peer could take it;
	// 1 means no bound.
	ExploreShare float64 `koanf:"explore-share"`
	// AuditRate is the share (0 to 1) of a deterministic type's successful
	// results that are run again on one other worker after the answer, to
	// compare; 0 turns audits off.
	AuditRate float64 `koanf:"audit-rate"`
	// DisputeThreshold is the number of disputes (results outvoted by
	// other workers) within DisputeWindow at which a peer is cordoned; 0
	// never cordons for disputes (they are still counted).
	DisputeThreshold int `koanf:"dispute-threshold"`
	// DisputeWindow is how far back disputes count toward DisputeThreshold.
	DisputeWindow time.Duration `koanf:"dispute-window"`
	// DisputeCordon is how long a peer cordoned for disputes gets no work
	// before it is redialed and probed.
	DisputeCordon time.Duration `koanf:"dispute-cordon"`
}

// ExploreWindow is the number of requests in a row over which
// explore-share is counted.
const ExploreWindow = 200

// MaxReplicas bounds a verify setting's replicas.
const MaxReplicas = 16

// Verify asks for a request's result from Replicas distinct workers, of
// which Agree must give the same bytes. The zero value asks for no check.
type Verify struct {
	Replicas int `json:"replicas"`
	Agree    int `json:"agree"`
}

// On reports whether v asks for a check.
func (v Verify) On() bool { return v.Replicas > 0 }

// String is v as "agree/replicas", or "" for no check.
func (v Verify) String() string {
	if !v.On() {
		return ""
	}
	return strconv.Itoa(v.Agree) + "/" + strconv.Itoa(v.Replicas)
}

// Problem says what is wrong with v ("" when nothing is): replicas from 2
// to MaxReplicas, agree more than half of them (two disjoint groups can
// never both agree) and at most all of them.
func (v Verify) Problem() string {
	if !v.On() && v.Agree == 0 {
		return ""
	}
	switch {
	case v.Replicas < 2 || v.Replicas > MaxReplicas:
		return fmt.Sprintf("replicas %d must be from 2 to %d", v.Replicas, MaxReplicas)
	case v.Agree > v.Replicas:
		return fmt.Sprintf("agree %d must be at most replicas %d", v.Agree, v.Replicas)
	case 2*v.Agree <= v.Replicas:
		return fmt.Sprintf("agree %d must be more than half of replicas %d", v.Agree, v.Replicas)
	}
	return ""
}

// ParseVerify reads "agree/replicas" (such as "2/3"); "" and "off" mean no
// check.
func ParseVerify(s string) (Verify, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "off" {
		return Verify{}, nil
	}
	a, r, ok := strings.Cut(s, "/")
	agree, err1 := strconv.Atoi(strings.TrimSpace(a))
	replicas, err2 := strconv.Atoi(strings.TrimSpace(r))
	if !ok || err1 != nil || err2 != nil {
		return Verify{}, fmt.Errorf("verify %q is not agree/replicas (such as 2/3)", s)
	}
	v := Verify{Replicas: replicas, Agree: agree}
	if v == (Verify{}) {
		return Verify{}, fmt.Errorf("verify %q asks for no replicas: want agree/replicas such as 2/3, or off for no check", s)
	}
	if p := v.Problem(); p != "" {
		return Verify{}, fmt.Errorf("verify %q: %s", s, p)
	}
	return v, nil
}

// VerifyFor returns the verify default of workType: its custom type's
// verify, else its work-type-defaults verify, else none. Validate has
// checked both.
func (c *Config) VerifyFor(workType string) Verify {
	if t, ok := c.CustomTypes[workType]; ok && t.Verify != "" {
		v, _ := ParseVerify(t.Verify)
		return v
	}
	if w, ok := c.WorkTypeDefaults[workType]; ok && w.Verify != "" {
		v, _ := ParseVerify(w.Verify)
		return v
	}
	return Verify{}
}

// Validate reports the trust settings that are out of bounds, and every
// verify default that does not parse.
func (c *Config) validateTrust() error {
	var ch checks
	t := c.Trust
	if t.ExploreShare < 0 || t.ExploreShare > 1 {
		ch.failf("explore-share", "explore-share %g must be from 0 to 1", t.ExploreShare)
	}
	if t.AuditRate < 0 || t.AuditRate > 1 {
		ch.failf("audit-rate", "audit-rate %g must be from 0 to 1", t.AuditRate)
	}
	atLeast(&ch, "dispute-threshold", t.DisputeThreshold, 0)
	if t.DisputeThreshold > 0 {
		positive(&ch, "dispute-window", t.DisputeWindow)
		positive(&ch, "dispute-cordon", t.DisputeCordon)
	} else {
		notNegative(&ch, "dispute-window", t.DisputeWindow)
		notNegative(&ch, "dispute-cordon", t.DisputeCordon)
	}
	names := make([]string, 0, len(c.CustomTypes))
	for n := range c.CustomTypes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ct := c.CustomTypes[n]
		if ct.Verify == "" {
			continue
		}
		if _, err := ParseVerify(ct.Verify); err != nil {
			ch.failf("custom-types."+n+".verify", "custom-types %s: %v", n, err)
		} else if !ct.Deterministic {
			ch.pairf("custom-types."+n+".verify", "custom-types."+n+".deterministic", "custom-types %s: verify needs deterministic: true (results of a type that is not deterministic cannot be compared)", n)
		}
	}
	names = names[:0]
	for n := range c.WorkTypeDefaults {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if s := c.WorkTypeDefaults[n].Verify; s != "" {
			if _, err := ParseVerify(s); err != nil {
				ch.failf("work-type-defaults."+n+".verify", "work-type-defaults %s: %v", n, err)
			}
		}
	}
	return ch.join()
}
