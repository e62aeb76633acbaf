package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/node/authority"
)

// membershipFixture is an authority, a data dir with an identity and a
// certificate for it in network prod.
type membershipFixture struct {
	auth    *authority.Authority
	dataDir string
	id      peer.ID
	cert    string
	issued  time.Time
}

func newMembershipFixture(t *testing.T, lifetime time.Duration) membershipFixture {
	t.Helper()
	auth, err := authority.Generate()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key, err := node.LoadOrCreateIdentity(filepath.Join(dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	issued := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	c, err := auth.Admit("prod", id, []string{"staked"}, issued, issued.Add(lifetime))
	if err != nil {
		t.Fatal(err)
	}
	cert := filepath.Join(dir, "node.cert")
	if err := os.WriteFile(cert, c.Encode(), 0o644); err != nil {
		t.Fatal(err)
	}
	return membershipFixture{auth: auth, dataDir: filepath.Join(dir, "data"), id: id, cert: cert, issued: issued}
}

func (f membershipFixture) config() *config.Config {
	c := config.Defaults()
	c.Node.Network, c.Node.DataDir = "prod", f.dataDir
	c.Membership = config.MembershipConfig{NetworkAuthority: f.auth.Public().String(), MembershipCert: f.cert}
	return &c
}

// TestMembershipFindings breaks each rule of the settings' membership
// check once.
func TestMembershipFindings(t *testing.T) {
	f := newMembershipFixture(t, 720*time.Hour)
	now := f.issued.Add(time.Hour)
	other, err := authority.Generate()
	if err != nil {
		t.Fatal(err)
	}
	tampered := filepath.Join(t.TempDir(), "tampered.cert")
	b, _ := os.ReadFile(f.cert)
	b[bytes.Index(b, []byte("staked"))] = 'S'
	if err := os.WriteFile(tampered, b, 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(t.TempDir(), "fresh")
	strangerDir := t.TempDir()
	if _, err := node.LoadOrCreateIdentity(strangerDir); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		change  func(c *config.Config)
		at      time.Time
		key     string
		warning bool
		want    string
	}{
		{"good", func(*config.Config) {}, now, "", false, ""},
		{"open network", func(c *config.Config) { c.Membership = config.MembershipConfig{} }, now, "", false, ""},
		{"no identity yet", func(c *config.Config) { c.Node.DataDir = fresh }, now, "", false, ""},
		{"bad authority line", func(c *config.Config) { c.Membership.NetworkAuthority = "zKey" }, now, "network-authority", false, `starting with "u"`},
		{"authority without cert", func(c *config.Config) { c.Membership.MembershipCert = "" }, now, "network-authority", true, "membership-cert is not"},
		{"missing cert file", func(c *config.Config) { c.Membership.MembershipCert = filepath.Join(t.TempDir(), "none") }, now, "membership-cert", false, "no such file"},
		{"tampered", func(c *config.Config) { c.Membership.MembershipCert = tampered }, now, "membership-cert", false, "signature does not verify"},
		{"other authority", func(c *config.Config) { c.Membership.NetworkAuthority = other.Public().String() }, now, "membership-cert", false, "signed by another authority"},
		{"other network", func(c *config.Config) { c.Node.Network = "dev" }, now, "membership-cert", false, `for network "prod", not "dev"`},
		{"other peer", func(c *config.Config) { c.Node.DataDir = strangerDir }, now, "membership-cert", false, "wrong peer: it is for peer " + f.id.String()},
		{"expired", func(*config.Config) {}, f.issued.Add(720 * time.Hour), "membership-cert", false, "expired at 2026-12-31T00:00:00Z"},
		{"expires within a day", func(*config.Config) {}, f.issued.Add(700 * time.Hour), "membership-cert", true, "expires in 20h0m0s (at 2026-12-31T00:00:00Z)"},
	} {
		c := f.config()
		tc.change(c)
		got := membershipFindings(c, tc.at)
		if tc.want == "" {
			if len(got) != 0 {
				t.Errorf("%s: %+v", tc.name, got)
			}
			continue
		}
		if len(got) != 1 || got[0].Key != tc.key || got[0].Warning != tc.warning || !strings.Contains(got[0].Msg, tc.want) {
			t.Errorf("%s: %+v, want key %s warning %v with %q", tc.name, got, tc.key, tc.warning, tc.want)
		}
	}
	if _, err := os.Stat(fresh); err == nil {
		t.Error("the check made an identity")
	}
}

func TestInspectFile(t *testing.T) {
	f := newMembershipFixture(t, time.Hour)
	want := authority.Expect{Authority: f.auth.Public(), Network: "prod", Peer: f.id}
	v, err := inspectFile(f.cert, want, f.issued.Add(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if v.Kind != "membership-certificate" || v.Peer != f.id.String() || strings.Join(v.Labels, ",") != "staked" || !v.Expired ||
		strings.Join(v.Checked, ",") != "authority,network,peer" {
		t.Errorf("view %+v", v)
	}
	var text bytes.Buffer
	printStatement(&text, v, f.issued.Add(2*time.Hour))
	for _, line := range []string{"membership certificate\n", "labels:     staked\n", "(expired 1h0m0s ago)", "matches the given authority, network, peer"} {
		if !strings.Contains(text.String(), line) {
			t.Errorf("text lacks %q:\n%s", line, text.String())
		}
	}
	if _, err := inspectFile(f.cert, authority.Expect{Network: "dev"}, f.issued); err == nil || !strings.Contains(err.Error(), "wrong network") {
		t.Errorf("inspect for another network: %v", err)
	}
	r, err := f.auth.Revoke("prod", f.id, f.issued)
	if err != nil {
		t.Fatal(err)
	}
	rev := filepath.Join(t.TempDir(), "node.revocation")
	if err := os.WriteFile(rev, r.Encode(), 0o644); err != nil {
		t.Fatal(err)
	}
	v, err = inspectFile(rev, authority.Expect{}, f.issued)
	if err != nil || v.Kind != "revocation" || v.Expires != nil || len(v.Checked) != 0 {
		t.Errorf("revocation: %+v %v", v, err)
	}
}

// TestStatusOpenNetwork: the status says an open network when no
// authority is set, in JSON whoever filled the field and in the text.
func TestStatusOpenNetwork(t *testing.T) {
	for _, tc := range []struct {
		v        apiv1.StatusView
		wantOpen bool
		wantText string
	}{
		{apiv1.StatusView{OpenNetwork: false}, true, "membership: open network: any peer may join\n"},
		{apiv1.StatusView{NetworkAuthority: "uKey", OpenNetwork: true}, false, "membership: closed network: members certified by authority uKey\n"},
	} {
		b, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		var back apiv1.StatusView
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if back.OpenNetwork != tc.wantOpen {
			t.Errorf("%s: open_network %v, want %v", b, back.OpenNetwork, tc.wantOpen)
		}
		var text bytes.Buffer
		printStatus(&text, "127.0.0.1:7400", tc.v)
		if !strings.Contains(text.String(), tc.wantText) {
			t.Errorf("status text lacks %q:\n%s", tc.wantText, text.String())
		}
	}
}
