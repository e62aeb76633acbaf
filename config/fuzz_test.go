package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzLoadYAML feeds the config loader arbitrary files. It must never panic;
// a file it accepts must give a valid Config; a file it refuses must be
// named in the error, unless the error is about the settings' values
// together (ErrInvalid), which may come from any source.
func FuzzLoadYAML(f *testing.F) {
	for _, seed := range []string{
		"",
		"network: devnet\nworker-timeout: 2s\nmax-retries: 3\n",
		"accept-work-from: allowlist\nallow-peer: [12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo]\npeer-rate: 5\npeer-burst: 10\n",
		"fault-error-rate: 0.5\nfault-delay: 100ms\nfault-drop-rate: 0.1\n",
		"fault-error-rate: 1.5\n",
		"label-balancing: {order: [full, archive], pass-on-error: true, include-default: false}\n",
		"work-type-defaults: {sha256: {max-retries: 1, label-balancing: {order: [a]}}}\n",
		"worker-timout: 1s\n",   // unknown key
		"max-retries: abc\n",    // wrong type
		"worker-timeout: 5\n",   // a duration without a unit
		"labels: [full, 2]\n",   // a list with a wrong entry
		"worker-timeout: [1s\n", // broken YAML
		"- just\n- a list\n",    // not a mapping
		"a: &x [1, 2]\nb: *x\n", // aliases
		"label-balancing: ~\n",  // a block that is null
		"peer-rate: .nan\n",     // not a number
		"max-retries: 99999999999999999999\n",
		"\xff\xfe\x00binary",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, content string) {
		path := filepath.Join(t.TempDir(), "workmesh.yaml")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(LoadOptions{File: path})
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !strings.Contains(err.Error(), path) {
				t.Fatalf("error does not name the file %s: %v", path, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Load accepted a config that does not validate: %v", err)
		}
	})
}
