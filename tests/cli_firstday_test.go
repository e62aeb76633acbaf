package tests

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLI_FirstDayMistakes makes the mistakes of an operator's first day
// with the binary and checks that each gets a clear error saying what and
// where, with the documented exit code (2: bad usage or configuration),
// and never a Go panic, a made-up address or a silent surprise.
func TestCLI_FirstDayMistakes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	noPanic := func(t *testing.T, r cliRun) {
		t.Helper()
		if strings.Contains(r.stderr, "panic:") || strings.Contains(r.stderr, "goroutine ") {
			t.Fatalf("a Go panic instead of an error:\n%s", r.stderr)
		}
	}
	start := func(t *testing.T, args ...string) cliRun {
		t.Helper()
		return runCLI(t, bin, nil, append([]string{"node", "start", "--data-dir", t.TempDir(), "--api", "127.0.0.1:0", "--log-level", "error"}, args...)...)
	}

	t.Run("a listen port another process holds", func(t *testing.T) {
		held, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		addr := fmt.Sprintf("/ip4/127.0.0.1/udp/%d/quic-v1", held.LocalAddr().(*net.UDPAddr).Port)
		r := start(t, "--listen", addr)
		noPanic(t, r)
		if r.code != 2 || !strings.Contains(r.stderr, "cannot listen") || !strings.Contains(r.stderr, "address already in use") {
			t.Fatalf("exit %d, want 2 saying the listen address is in use:\n%s", r.code, r.stderr)
		}
	})

	t.Run("an API port another process holds", func(t *testing.T) {
		held, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		r := runCLI(t, bin, nil, "node", "start", "--data-dir", t.TempDir(), "--listen", loopbackQUIC, "--api", held.Addr().String())
		noPanic(t, r)
		if r.code != 2 || !strings.Contains(r.stderr, "api listen "+held.Addr().String()) {
			t.Fatalf("exit %d, want 2 naming the API address:\n%s", r.code, r.stderr)
		}
	})

	t.Run("listen addresses no node can use", func(t *testing.T) {
		for _, c := range []struct{ listen, want string }{
			{"/ip4/127.0.0.1/udp/5", "a node listens on /ip4/<address>/udp/<port>/quic-v1"},
			{"/ip4/127.0.0.1/tcp/0/ws", "a node listens on"},
			{loopbackQUIC + "," + loopbackQUIC, "is given twice (entries 1 and 2)"},
		} {
			for _, args := range [][]string{{"config", "validate"}, {"node", "start", "--data-dir", t.TempDir()}} {
				r := runCLI(t, bin, nil, append(args, "--listen", c.listen)...)
				noPanic(t, r)
				if r.code != 2 || !strings.Contains(r.stderr, c.want) {
					t.Errorf("%s --listen %s: exit %d, want 2 saying %q:\n%s", strings.Join(args[:2], " "), c.listen, r.code, c.want, r.stderr)
				}
			}
		}
	})

	t.Run("settings node start would refuse, named all at once", func(t *testing.T) {
		args := []string{"--accept-work-from", "allowlist", "--allow-peer", "bad", "--work-types", "echo,http", "--http-allow", "300.1.1.1/8",
			"--jsonrpc-chain-id", "xyz", "--bootstrap", "/ip4/127.0.0.1/udp/1/quic-v1/p2p/notapeer", "--listen", loopbackQUIC}
		want := []string{`allow-peer entry 1 "bad"`, `http-allow entry 1 ("300.1.1.1/8")`, `jsonrpc-chain-id "xyz"`, "notapeer"}
		for _, cmd := range [][]string{{"config", "validate"}, {"node", "start", "--data-dir", t.TempDir(), "--api", "127.0.0.1:0"}} {
			r := runCLI(t, bin, nil, append(cmd, args...)...)
			noPanic(t, r)
			for _, w := range want {
				if r.code != 2 || !strings.Contains(r.stderr, w) {
					t.Errorf("%s: exit %d, want 2 naming %s:\n%s", strings.Join(cmd[:2], " "), r.code, w, r.stderr)
				}
			}
		}
		r := runCLI(t, bin, nil, "config", "validate", "--api", "127.0.0.1:99999")
		if r.code != 2 || !strings.Contains(r.stderr, `port "99999" is not a number from 0 to 65535 (flag --api)`) {
			t.Errorf("--api 127.0.0.1:99999: exit %d, want 2 naming the port and the flag:\n%s", r.code, r.stderr)
		}
	})

	t.Run("a command at a path that is not there", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "enrich.sh")
		path := writeConfig(t, fmt.Sprintf("work-types: [echo, enrich]\ncustom-types:\n  enrich:\n    command: [%q]\n", missing))
		r := start(t, "--config", path, "--listen", loopbackQUIC)
		if r.code != 2 || !strings.Contains(r.stderr, "custom-types enrich") || !strings.Contains(r.stderr, missing) {
			t.Fatalf("exit %d, want 2 naming the type and its program:\n%s", r.code, r.stderr)
		}
	})

	t.Run("list flags read as the environment reads them", func(t *testing.T) {
		r := runCLI(t, bin, nil, "config", "print", "--labels", " a , b ", "--work-types", "echo, sha256")
		if r.code != 0 || !strings.Contains(r.stdout, " a,b ") || !strings.Contains(r.stdout, " echo,sha256 ") {
			t.Fatalf("exit %d, want the lists trimmed (a,b and echo,sha256):\n%s%s", r.code, r.stdout, r.stderr)
		}
	})

	t.Run("an API address that is not host:port", func(t *testing.T) {
		// A URL is what a browser shows: taken as the host:port it names.
		r := runCLI(t, bin, nil, "submit", "--api", "http://127.0.0.1:1", "--type", "echo", "--payload", "x")
		if r.code != 2 || !strings.Contains(r.stderr, "cannot reach the node's API at http://127.0.0.1:1") || strings.Contains(r.stderr, "lookup") {
			t.Errorf("--api http://127.0.0.1:1: exit %d, want 2 saying it cannot reach 127.0.0.1:1:\n%s", r.code, r.stderr)
		}
		for _, api := range []string{"127.0.0.1", "https://127.0.0.1:7400", "127.0.0.1:7400/v1", "127.0.0.1:99999", ""} {
			r := runCLI(t, bin, nil, "submit", "--api", api, "--type", "echo", "--payload", "x")
			if r.code != 2 || !strings.Contains(r.stderr, "want the node's API as host:port") || strings.Contains(r.stderr, "lookup") {
				t.Errorf("--api %q: exit %d, want 2 asking for host:port:\n%s", api, r.code, r.stderr)
			}
		}
	})

	t.Run("commands and arguments that do not exist", func(t *testing.T) {
		for _, args := range [][]string{{"bogus"}, {"submit", "--type", "echo", "--payload", "x", "extra"}, {"network", "inspect"}} {
			if r := runCLI(t, bin, nil, args...); r.code != 2 {
				t.Errorf("workmesh %s: exit %d, want 2:\n%s", strings.Join(args, " "), r.code, r.stderr)
			}
		}
		dir := t.TempDir()
		for _, args := range [][]string{{"--payload-file", dir}, {"--file", dir}} {
			r := runCLI(t, bin, nil, append([]string{"submit", "--api", "127.0.0.1:1", "--type", "echo"}, args...)...)
			if r.code != 2 || !strings.Contains(r.stderr, dir) {
				t.Errorf("submit %s: exit %d, want 2 naming the directory:\n%s", strings.Join(args, " "), r.code, r.stderr)
			}
		}
	})

	t.Run("a batch the API cannot take stops at once", func(t *testing.T) {
		lines := strings.Repeat(`{"type":"echo","payload":"x"}`+"\n", 200)
		file := filepath.Join(t.TempDir(), "batch.jsonl")
		if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
			t.Fatal(err)
		}
		r := runCLI(t, bin, nil, "submit", "--api", "127.0.0.1:1", "--file", file, "--progress", "off")
		results := strings.Count(r.stdout, "\n")
		if r.code != 2 || !strings.Contains(r.stderr, "batch stopped after") || results >= 20 {
			t.Fatalf("exit %d, %d results, want 2 and a stop within the first few lines:\n%s", r.code, results, r.stderr)
		}
	})

	t.Run("an empty --payload is an empty payload", func(t *testing.T) {
		n := startNodeProcess(t, bin, "--work-types", "echo")
		r := runCLI(t, bin, []byte("from stdin"), "submit", "--api", n.api, "--type", "echo", "--payload", "", "--output", "json")
		if r.code != 0 || strings.Contains(r.stdout, "from stdin") {
			t.Errorf("exit %d, want the empty payload echoed, not stdin:\n%s%s", r.code, r.stdout, r.stderr)
		}
		r = runCLI(t, bin, nil, "submit", "--api", n.api, "--type", "echo", "--payload", "", "--payload-file", "/dev/null")
		if r.code != 2 || !strings.Contains(r.stderr, "give one, not both") {
			t.Errorf("--payload '' with --payload-file: exit %d, want 2:\n%s", r.code, r.stderr)
		}
		r = runCLI(t, bin, []byte("from stdin"), "submit", "--api", n.api, "--type", "echo", "--payload-file", "-")
		if r.code != 0 || strings.TrimSpace(r.stdout) != "from stdin" {
			t.Errorf("--payload-file -: exit %d, want stdin echoed:\n%s%s", r.code, r.stdout, r.stderr)
		}
	})
}
