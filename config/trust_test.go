package config

import (
	"strings"
	"testing"
)

func TestParseVerify(t *testing.T) {
	for in, want := range map[string]Verify{"2/3": {Replicas: 3, Agree: 2}, " 3/5 ": {Replicas: 5, Agree: 3}, "": {}, "off": {}, "2/2": {Replicas: 2, Agree: 2}} {
		if got, err := ParseVerify(in); err != nil || got != want {
			t.Errorf("ParseVerify(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for in, why := range map[string]string{"2": "not agree/replicas", "a/3": "not agree/replicas", "1/3": "more than half", "4/3": "at most replicas", "1/1": "from 2 to", "9/17": "from 2 to", "0/0": "or off for no check"} {
		if _, err := ParseVerify(in); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseVerify(%q) = %v, want an error saying %q", in, err, why)
		}
	}
}

func TestValidate_Trust(t *testing.T) {
	c := Defaults()
	c.CustomTypes = map[string]CustomTypeConfig{"digest": {Command: []string{"sha256sum"}, Verify: "2/3"}}
	c.WorkTypeDefaults = map[string]WorkTypeConfig{"sha256": {Verify: "5/3"}}
	c.Trust.AuditRate = 2
	err := c.Validate()
	for _, want := range []string{"custom-types digest: verify needs deterministic: true", "work-type-defaults sha256: verify \"5/3\"", "audit-rate 2 must be from 0 to 1"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want it to say %q", err, want)
		}
	}
	c = Defaults()
	c.CustomTypes = map[string]CustomTypeConfig{"digest": {Command: []string{"sha256sum"}, Deterministic: true, Verify: "2/3"}}
	c.WorkTypeDefaults = map[string]WorkTypeConfig{"sha256": {Verify: "3/5"}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if v := c.VerifyFor("digest"); v != (Verify{Replicas: 3, Agree: 2}) {
		t.Errorf("VerifyFor(digest) = %+v", v)
	}
	if v := c.VerifyFor("sha256"); v != (Verify{Replicas: 5, Agree: 3}) {
		t.Errorf("VerifyFor(sha256) = %+v", v)
	}
	if v := c.VerifyFor("echo"); v.On() {
		t.Errorf("VerifyFor(echo) = %+v, want none", v)
	}
}
