package config

import (
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"
)

// The settings of custom work types (custom-types): names, commands,
// services and their URLs, with the defaults of what is optional.

// Defaults of a custom type's optional settings.
const (
	// DefaultCustomTimeout bounds one run of a custom type.
	DefaultCustomTimeout = 30 * time.Second
	// DefaultCustomHealthInterval is the time between two health polls.
	DefaultCustomHealthInterval = 2 * time.Second
	// DefaultRetryableExitCode is EX_TEMPFAIL.
	DefaultRetryableExitCode = 75
)

// sortedCustomNames returns the names of the custom types in order.
func sortedCustomNames(m map[string]CustomTypeConfig) []string {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// validateCustomTypes reports the problems of the custom-types block:
// each type needs a command or a url (not both), URLs must be http or
// https, numbers and durations must not be negative.
func (c *Config) validateCustomTypes() error {
	var ch checks
	for _, name := range sortedCustomNames(c.CustomTypes) {
		t := c.CustomTypes[name]
		key := "custom-types." + name
		if bad := customNameProblem(name); bad != "" {
			ch.failf(key, "custom-types %q: %s", name, bad)
		}
		switch {
		case len(t.Command) == 0 && t.URL == "":
			ch.failf(key, "custom-types %s: needs a command (a list: [program, args...]) or a url", name)
		case len(t.Command) > 0 && t.URL != "":
			ch.pairf(key+".url", key+".command", "custom-types %s: has both a command and a url: give one", name)
		}
		if len(t.Command) > 0 && t.Command[0] == "" {
			ch.entryf(key+".command", 1, "custom-types %s: command entry 1 (the program) is empty", name)
		}
		if t.URL != "" {
			if why := httpURLProblem(t.URL); why != "" {
				ch.failf(key+".url", "custom-types %s: url %q %s", name, t.URL, why)
			}
		}
		if t.HealthURL != "" {
			if why := httpURLProblem(t.HealthURL); why != "" {
				ch.failf(key+".health-url", "custom-types %s: health-url %q %s", name, t.HealthURL, why)
			}
		}
		if len(t.Command) > 0 {
			for what, set := range map[string]bool{"headers": len(t.Headers) > 0, "health-url": t.HealthURL != ""} {
				if set {
					ch.pairf(key+"."+what, key+".command", "custom-types %s: %s is for a url, not a command", name, what)
				}
			}
		}
		if t.URL != "" {
			for what, set := range map[string]bool{"env": len(t.Env) > 0, "dir": t.Dir != "", "retryable-exit-code": t.RetryableExitCode != 0} {
				if set {
					ch.pairf(key+"."+what, key+".url", "custom-types %s: %s is for a command, not a url", name, what)
				}
			}
		}
		for k := range t.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				ch.failf(key+".env", "custom-types %s: env name %q is not a variable name", name, k)
			}
		}
		notNegative(&ch, key+".timeout", t.Timeout)
		notNegative(&ch, key+".health-interval", t.HealthInterval)
		if t.MaxOutput < 0 {
			ch.failf(key+".max-output", "custom-types %s: max-output %d must be >= 0", name, t.MaxOutput)
		}
		if t.Concurrency < 0 {
			ch.failf(key+".concurrency", "custom-types %s: concurrency %d must be >= 0", name, t.Concurrency)
		}
		if t.RetryableExitCode < 0 || t.RetryableExitCode > 255 {
			ch.failf(key+".retryable-exit-code", "custom-types %s: retryable-exit-code %d is not an exit code (1 to 255)", name, t.RetryableExitCode)
		}
	}
	return ch.join()
}

// customNameProblem says what is wrong with a custom type's name, or "".
// The name travels in requests and records: letters, digits, '_' and '-'
// ('.' would split the settings key).
func customNameProblem(name string) string {
	if name == "" {
		return "the name is empty"
	}
	if len(name) > 64 {
		return "the name is longer than 64 bytes"
	}
	for i := 0; i < len(name); i++ {
		ch := name[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '_' || ch == '-') {
			return fmt.Sprintf("character %q is not allowed in a work type name (letters, digits, '_', '-')", ch)
		}
	}
	return ""
}

// httpURLProblem says what is wrong with an http or https URL, or "".
func httpURLProblem(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "does not parse: " + err.Error()
	case u.Scheme != "http" && u.Scheme != "https":
		return "is not http or https"
	case u.Host == "":
		return "has no host"
	}
	return ""
}
