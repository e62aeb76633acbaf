package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// peerIDLine is a base58 libp2p peer ID of an Ed25519 key, alone on its
// line.
var peerIDLine = regexp.MustCompile(`^12D3KooW[1-9A-HJ-NP-Za-km-z]{44}\n$`)

// The membership preview end to end with the built binary: an authority
// key, a node's peer ID before its first start, a certificate, its
// inspection, and the settings' check of it.
func TestCLI_NetworkMembership(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "authority.key")

	var authority string
	t.Run("init prints one key line and writes a 0600 file", func(t *testing.T) {
		r := runCLI(t, bin, nil, "network", "init", "--out", key)
		if r.code != 0 || r.stderr != "" || !regexp.MustCompile(`^u[A-Za-z0-9_-]{40,}\n$`).MatchString(r.stdout) {
			t.Fatalf("exit %d\nstdout %q\nstderr %s", r.code, r.stdout, r.stderr)
		}
		authority = strings.TrimSpace(r.stdout)
		st, err := os.Stat(key)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("key file: %v, mode %v", err, st.Mode())
		}
		before, _ := os.ReadFile(key)
		r = runCLI(t, bin, nil, "network", "init", "--out", key)
		after, _ := os.ReadFile(key)
		if r.code != 2 || !strings.Contains(r.stderr, "refusing to overwrite it (pass --force") || !bytes.Equal(before, after) {
			t.Errorf("second init: exit %d, key kept %v\n%s", r.code, bytes.Equal(before, after), r.stderr)
		}
		other := filepath.Join(dir, "other.key")
		if r := runCLI(t, bin, nil, "network", "init", "--out", other); r.code != 0 {
			t.Fatal(r.stderr)
		}
		if r := runCLI(t, bin, nil, "network", "init", "--out", other, "--force"); r.code != 0 || strings.TrimSpace(r.stdout) == authority {
			t.Errorf("init --force: exit %d %s", r.code, r.stderr)
		}
	})
	if authority == "" {
		t.Fatal("no authority")
	}

	data := filepath.Join(dir, "node-data")
	var id string
	t.Run("node id makes the identity once", func(t *testing.T) {
		r := runCLI(t, bin, nil, "node", "id", "--data-dir", data)
		if r.code != 0 || !peerIDLine.MatchString(r.stdout) {
			t.Fatalf("exit %d stdout %q stderr %s", r.code, r.stdout, r.stderr)
		}
		id = strings.TrimSpace(r.stdout)
		if _, err := os.Stat(filepath.Join(data, "identity.key")); err != nil {
			t.Errorf("no identity made: %v", err)
		}
		if again := runCLI(t, bin, nil, "node", "id", "--data-dir", data); again.stdout != r.stdout {
			t.Errorf("second run printed %q, first %q", again.stdout, r.stdout)
		}
	})
	if id == "" {
		t.Fatal("no peer ID")
	}

	cert := filepath.Join(dir, "node.cert")
	t.Run("admit and inspect show the labels and expiry", func(t *testing.T) {
		start := time.Now().Truncate(time.Second)
		r := runCLI(t, bin, nil, "network", "admit", "--key", key, "--peer", id, "--labels", "staked,archive",
			"--expires", "48h", "--network", "prod", "--out", cert)
		if r.code != 0 || !strings.Contains(r.stdout, "admitted "+id+" to network prod, labels archive,staked") {
			t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		r = runCLI(t, bin, nil, "network", "inspect", cert, "--network-authority", authority, "--network", "prod", "--peer", id)
		for _, line := range []string{"membership certificate\n", "network:    prod\n", "peer:       " + id + "\n",
			"labels:     archive,staked\n", "authority:  " + authority + "\n", "signature:  ok"} {
			if !strings.Contains(r.stdout, line) {
				t.Errorf("inspect lacks %q: exit %d\n%s%s", line, r.code, r.stdout, r.stderr)
			}
		}
		r = runCLI(t, bin, nil, "network", "inspect", cert, "--output", "json")
		var v struct {
			Kind, Network, Peer, Authority, Signature string
			Labels                                    []string
			Expires                                   time.Time
		}
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || r.code != 0 {
			t.Fatalf("inspect --output json: exit %d %v\n%s", r.code, err, r.stdout)
		}
		if v.Kind != "membership-certificate" || v.Peer != id || strings.Join(v.Labels, ",") != "archive,staked" ||
			v.Signature != "ok" || v.Authority != authority {
			t.Errorf("inspect json %+v", v)
		}
		if d := v.Expires.Sub(start); d < 48*time.Hour || d > 48*time.Hour+time.Minute {
			t.Errorf("expires %s, %s after the start, want 48h", v.Expires, d)
		}
	})

	validate := func(t *testing.T, network, dataDir, certFile string) cliRun {
		t.Helper()
		cfg := writeConfig(t, "network: "+network+"\ndata-dir: "+dataDir+"\nnetwork-authority: "+authority+"\nmembership-cert: "+certFile+"\n")
		return runCLI(t, bin, nil, "config", "validate", "--config", cfg)
	}

	t.Run("config validate takes the node's own certificate", func(t *testing.T) {
		if r := validate(t, "prod", data, cert); r.code != 0 || r.stderr != "" {
			t.Errorf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
	})

	t.Run("a tampered certificate fails inspect and validate", func(t *testing.T) {
		b, err := os.ReadFile(cert)
		if err != nil {
			t.Fatal(err)
		}
		// "staked" becomes "stakez": still a well-formed certificate.
		b[bytes.Index(b, []byte("staked"))+5] = 'z'
		tampered := filepath.Join(dir, "tampered.cert")
		if err := os.WriteFile(tampered, b, 0o644); err != nil {
			t.Fatal(err)
		}
		const reason = "the signature does not verify (the certificate was changed after signing)"
		if r := runCLI(t, bin, nil, "network", "inspect", tampered); r.code != 2 || !strings.Contains(r.stderr, reason) || r.stdout != "" {
			t.Errorf("inspect: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		r := validate(t, "prod", data, tampered)
		if r.code != 2 || !strings.Contains(r.stderr, reason) || !strings.Contains(r.stderr, "line 4)") {
			t.Errorf("validate: exit %d\n%s", r.code, r.stderr)
		}
		cut := filepath.Join(dir, "cut.cert")
		if err := os.WriteFile(cut, b[:40], 0o644); err != nil {
			t.Fatal(err)
		}
		if r := runCLI(t, bin, nil, "network", "inspect", cut); r.code != 2 || !regexp.MustCompile(`malformed at byte \d+ \(field \w+\)`).MatchString(r.stderr) {
			t.Errorf("inspect of a cut file: exit %d\n%s", r.code, r.stderr)
		}
	})

	t.Run("config validate refuses a certificate for another network or peer", func(t *testing.T) {
		r := validate(t, "staging", data, cert)
		if r.code != 2 || !strings.Contains(r.stderr, `wrong network: it is for network "prod", not "staging"`) {
			t.Errorf("other network: exit %d\n%s", r.code, r.stderr)
		}
		stranger := filepath.Join(dir, "stranger-data")
		if r := runCLI(t, bin, nil, "node", "id", "--data-dir", stranger); r.code != 0 {
			t.Fatal(r.stderr)
		}
		r = validate(t, "prod", stranger, cert)
		if r.code != 2 || !strings.Contains(r.stderr, "wrong peer: it is for peer "+id) {
			t.Errorf("other peer: exit %d\n%s", r.code, r.stderr)
		}
	})

	t.Run("a certificate that expires within a day warns", func(t *testing.T) {
		soon := filepath.Join(dir, "soon.cert")
		if r := runCLI(t, bin, nil, "network", "admit", "--key", key, "--peer", id, "--expires", "2h", "--network", "prod", "--out", soon); r.code != 0 {
			t.Fatal(r.stderr)
		}
		r := validate(t, "prod", data, soon)
		want := regexp.MustCompile(`warning: membership-cert "` + regexp.QuoteMeta(soon) + `" expires in (1h59m\d+s|2h0m0s) \(at `)
		if r.code != 0 || strings.Count(r.stderr, "warning: ") != 1 || !want.MatchString(r.stderr) {
			t.Errorf("exit %d\n%s", r.code, r.stderr)
		}
	})

	t.Run("bad input exits 2 naming it", func(t *testing.T) {
		junk := filepath.Join(dir, "junk.key")
		if err := os.WriteFile(junk, []byte("not a key"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"network", "admit", "--key", key, "--peer", "nope", "--out", filepath.Join(dir, "x")}, `--peer "nope" is not a peer ID`},
			{[]string{"network", "admit", "--key", key, "--peer", id, "--expires", "-1h", "--out", filepath.Join(dir, "x")}, "--expires -1h0m0s"},
			{[]string{"network", "admit", "--key", key, "--peer", id, "--labels", "a,,b", "--out", filepath.Join(dir, "x")}, "label 2 is empty"},
			{[]string{"network", "admit", "--peer", id}, "missing --key FILE and --out FILE"},
			{[]string{"network", "revoke", "--key", cert, "--peer", id, "--out", filepath.Join(dir, "x")}, "mode 0644 lets others read or write it"},
			{[]string{"network", "revoke", "--key", junk, "--peer", id, "--out", filepath.Join(dir, "x")}, "not a private key"},
			{[]string{"network", "inspect", key}, "not a workmesh membership certificate"},
			{[]string{"network", "init"}, "--out FILE is required"},
		} {
			r := runCLI(t, bin, nil, tc.args...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("%s: exit %d, want 2 with %q\n%s", strings.Join(tc.args, " "), r.code, tc.want, r.stderr)
			}
		}
	})

	t.Run("revoke and inspect", func(t *testing.T) {
		rev := filepath.Join(dir, "node.revocation")
		r := runCLI(t, bin, nil, "network", "revoke", "--key", key, "--peer", id, "--network", "prod", "--out", rev)
		if r.code != 0 {
			t.Fatal(r.stderr)
		}
		r = runCLI(t, bin, nil, "network", "inspect", rev, "--network-authority", authority)
		if r.code != 0 || !strings.HasPrefix(r.stdout, "revocation\n") || !strings.Contains(r.stdout, "peer:       "+id) {
			t.Errorf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
	})
}

// A node without a network authority says so in its status: text and
// JSON.
func TestCLI_StatusOpenNetwork(t *testing.T) {
	bin := buildBinary(t)
	n := startNodeProcess(t, bin, "--work-types", "echo")
	r := runCLI(t, bin, nil, "status", "--api", n.api)
	if r.code != 0 || !strings.Contains(r.stdout, "membership: open network: any peer may join\n") {
		t.Errorf("status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, bin, nil, "status", "--api", n.api, "--output", "json")
	var v struct {
		OpenNetwork *bool `json:"open_network"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.OpenNetwork == nil || !*v.OpenNetwork {
		t.Errorf("status json: %v open_network %v\n%s", err, v.OpenNetwork, r.stdout)
	}
}
