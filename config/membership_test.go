package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMembership_Validate breaks each pure rule of the membership settings
// once.
func TestMembership_Validate(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    MembershipConfig
		want string
	}{
		{"open network", MembershipConfig{}, ""},
		{"authority alone", MembershipConfig{NetworkAuthority: "uKey"}, ""},
		{"both", MembershipConfig{NetworkAuthority: "uKey", MembershipCert: "node.cert"}, ""},
		{"cert without authority", MembershipConfig{MembershipCert: "node.cert"}, `membership-cert "node.cert" is set but network-authority is not`},
		{"authority with a space", MembershipConfig{NetworkAuthority: "uKey more"}, "holds white space"},
	} {
		err := tc.m.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestMembership_Check runs a LoadOptions.Membership check and sees its
// problems located at their source and its warnings passed to Warn.
func TestMembership_Check(t *testing.T) {
	file := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(file, []byte("network: prod\nnetwork-authority: uKey\nmembership-cert: node.cert\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var seen *Config
	var warned []string
	check := func(findings ...Finding) LoadOptions {
		return LoadOptions{
			File: file,
			Membership: func(c *Config) []Finding {
				seen = c
				return findings
			},
			Warn: func(s string) { warned = append(warned, s) },
		}
	}
	if _, err := Load(check()); err != nil {
		t.Fatalf("no findings: %v", err)
	}
	if seen == nil || seen.Membership.MembershipCert != "node.cert" || seen.Node.Network != "prod" {
		t.Fatalf("the check saw %+v", seen)
	}
	_, err := Load(check(Finding{Key: "membership-cert", Msg: "membership-cert: wrong peer"}))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "membership-cert: wrong peer (file "+file+" line 3)") {
		t.Errorf("a problem: %v, want it located at line 3", err)
	}
	warned = nil
	if _, err := Load(check(Finding{Key: "membership-cert", Msg: "expires soon", Warning: true})); err != nil {
		t.Errorf("a warning failed the load: %v", err)
	}
	if len(warned) != 1 || warned[0] != "expires soon (file "+file+" line 3)" {
		t.Errorf("warnings %q", warned)
	}
	// A membership setting already refused is not checked again.
	seen = nil
	opts := check(Finding{Key: "membership-cert", Msg: "should not run"})
	opts.File = ""
	opts.Environ = []string{"WORKMESH_MEMBERSHIP_CERT=node.cert"}
	_, err = Load(opts)
	if seen != nil || err == nil || strings.Contains(err.Error(), "should not run") || !strings.Contains(err.Error(), "network-authority is not") {
		t.Errorf("cert without authority: check ran %v, err %v", seen != nil, err)
	}
}
