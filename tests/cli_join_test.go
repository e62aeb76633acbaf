package tests

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/tests/testkit"
)

// TestJoinFailsLoudly runs the binary as an operator joining a network on
// the first day: a second node on a data dir in use, bootstrap peers that
// cannot be reached or are on another network, and the join line and
// status of a node listening on every interface.
func TestJoinFailsLoudly(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	t.Run("data dir in use", func(t *testing.T) { testJoinDataDirInUse(t, bin) })
	t.Run("bootstrap unreachable", func(t *testing.T) { testJoinBootstrapUnreachable(t, bin) })
	t.Run("bootstrap on another network", func(t *testing.T) { testJoinBootstrapOtherNetwork(t, bin) })
	t.Run("join line and status", func(t *testing.T) { testJoinLineAndStatus(t, bin) })
}

// testJoinDataDirInUse starts a node, then a second one on its data dir,
// which must exit 2 naming the dir and the first one's pid; once the first
// is killed (its lock file left behind), a node starts on the dir again.
func testJoinDataDirInUse(t *testing.T, bin string) {
	dir := t.TempDir()
	first := startNodeProcess(t, bin, "--data-dir", dir)
	r := runCLI(t, bin, nil, "node", "start", "--data-dir", dir, "--listen", loopbackQUIC, "--api", "127.0.0.1:0")
	want := fmt.Sprintf("data dir %s in use by pid %d", dir, first.cmd.Process.Pid)
	if r.code != 2 || !strings.Contains(r.stderr, want) || strings.Contains(r.stdout, "ready") {
		t.Fatalf("second node on %s: exit %d, stdout %q, stderr %q; want exit 2 and %q", dir, r.code, r.stdout, r.stderr, want)
	}
	t.Logf("second node: exit %d: %s", r.code, strings.TrimSpace(r.stderr))

	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.done
	if _, err := os.Stat(filepath.Join(dir, node.LockFile)); err != nil {
		t.Fatalf("the killed node left no lock file: %v", err)
	}
	again := startNodeProcess(t, bin, "--data-dir", dir)
	if again.peerID != first.peerID {
		t.Fatalf("node after the kill has peer ID %s, want the data dir's %s", again.peerID, first.peerID)
	}
}

// testJoinBootstrapUnreachable starts a node whose bootstrap address has
// nothing listening (a free loopback UDP port): it must say so, naming the
// address and the cause, within a few seconds of ready, and again with a
// growing gap, without libp2p's aggregate dial text.
func testJoinBootstrapUnreachable(t *testing.T, bin string) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()
	addr := fmt.Sprintf("/ip4/127.0.0.1/udp/%d/quic-v1/p2p/%s", port, randomPeerID(t))

	p := startLoggedNode(t, bin, "--listen", loopbackQUIC, "--api", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--log-level", "info", "--bootstrap", addr)
	want := "bootstrap " + addr + ": unreachable: no answer within"
	var at []time.Duration
	testkit.WaitFor(t, 30*time.Second, "three warnings naming "+addr, func() error {
		at = p.since(want)
		if len(at) < 3 {
			return fmt.Errorf("%d so far; stderr:\n%s", len(at), p.stderrText())
		}
		return nil
	})
	for _, l := range p.lines(want)[:3] {
		t.Logf("%s", l)
	}
	if at[0] > 5*time.Second {
		t.Errorf("first warning %s after ready, want within 5s", at[0])
	}
	if gap1, gap2 := at[1]-at[0], at[2]-at[1]; gap2 <= gap1 {
		t.Errorf("warnings at %v after ready: the gap does not grow (%s, then %s)", at[:3], gap1, gap2)
	}
	for _, bad := range []string{"all dials failed", "dial backoff", "failed to dial"} {
		if strings.Contains(p.stderrText(), bad) {
			t.Errorf("stderr has libp2p's %q:\n%s", bad, p.stderrText())
		}
	}
}

// testJoinBootstrapOtherNetwork joins a node of the default network through
// a node of another: the warning names the peer's address and both networks.
func testJoinBootstrapOtherNetwork(t *testing.T, bin string) {
	other := startNodeProcess(t, bin, "--network", "elsewhere", "--work-types", "echo")
	p := startLoggedNode(t, bin, "--listen", loopbackQUIC, "--api", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--log-level", "info", "--bootstrap", other.join)
	want := "bootstrap peer " + other.join + " is on network elsewhere, this node is on workmesh"
	testkit.WaitFor(t, 10*time.Second, "a warning naming the other network", func() error {
		if at := p.since(want); len(at) == 0 {
			return fmt.Errorf("none; stderr:\n%s", p.stderrText())
		} else if at[0] > 5*time.Second {
			t.Errorf("first warning %s after ready, want within 5s", at[0])
		}
		return nil
	})
	t.Logf("%s", p.lines(want)[0])
	if ids, err := peersOf(t, bin, p.api); err != nil || len(ids) != 0 {
		t.Errorf("peers of a node whose only bootstrap peer is on another network: %v %v, want none", ids, err)
	}
}

// testJoinLineAndStatus checks the join line of a node listening on
// 0.0.0.0 (the machine's interface addresses, loopback only when it has no
// other) and of one listening on loopback only, joins a second node with
// the latter (tests dial loopback only), and checks `workmesh status`
// shows each node's addresses and join line.
func testJoinLineAndStatus(t *testing.T, bin string) {
	all := startLoggedNode(t, bin, "--listen", "/ip4/0.0.0.0/udp/0/quic-v1", "--api", "127.0.0.1:0",
		"--data-dir", t.TempDir(), "--log-level", "info")
	t.Logf("0.0.0.0 node: join with: %s", all.joinLine)
	addrs := joinAddrs(t, all.joinLine)
	ifaces := interfaceIPv4s(t)
	for _, a := range addrs {
		ip, err := manet.ToIP(a)
		if err != nil || ip.IsUnspecified() {
			t.Fatalf("join address %s of a node on 0.0.0.0 is not dialable (%v)", a, err)
		}
		if len(ifaces) > 0 && !ifaces[ip.String()] {
			t.Errorf("join address %s: %s is not one of the machine's non-loopback addresses %v", a, ip, ifaces)
		}
		if len(ifaces) == 0 && !ip.IsLoopback() {
			t.Errorf("join address %s on a machine with loopback only", a)
		}
	}
	if len(addrs) == 0 || (len(ifaces) > 0 && len(addrs) < len(ifaces)) {
		t.Errorf("join line %q lists %d addresses, want one for each of %v", all.joinLine, len(addrs), ifaces)
	}
	checkStatusJoin(t, bin, all.api, all.joinLine, addrs)

	// Loopback only: the join line lists the loopback address, and a
	// second node joins with it.
	lo := startNodeProcess(t, bin, "--work-types", "echo")
	loAddrs := joinAddrs(t, "workmesh node start --bootstrap "+lo.join)
	for _, a := range loAddrs {
		if !manet.IsIPLoopback(a) {
			t.Fatalf("join address %s of a node on loopback only", a)
		}
	}
	second := startNodeProcess(t, bin, "--work-types", "sha256", "--bootstrap", lo.join)
	testkit.WaitFor(t, 10*time.Second, "the second node lists the first", func() error {
		ids, err := peersOf(t, bin, second.api)
		if err != nil || len(ids) != 1 || ids[0] != lo.peerID {
			return fmt.Errorf("peers %v %v", ids, err)
		}
		return nil
	})
	checkStatusJoin(t, bin, lo.api, "workmesh node start --bootstrap "+lo.join, loAddrs)
}

// checkStatusJoin checks `workmesh status` (text and JSON) shows the
// node's addresses and join line.
func checkStatusJoin(t *testing.T, bin, api, join string, addrs []ma.Multiaddr) {
	t.Helper()
	r := runCLI(t, bin, nil, "status", "--api", api)
	if r.code != 0 {
		t.Fatalf("workmesh status: exit %d: %s", r.code, r.stderr)
	}
	var text []string
	for _, a := range addrs {
		text = append(text, a.String())
	}
	for _, want := range []string{"addrs:      " + strings.Join(text, " ") + "\n", "join with:  " + join + "\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("workmesh status does not show %q:\n%s", want, r.stdout)
		}
	}
	t.Logf("workmesh status:\n%s", r.stdout)
	r = runCLI(t, bin, nil, "status", "--api", api, "--output", "json")
	var v struct {
		Addrs []string `json:"addrs"`
		Join  string   `json:"join"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("workmesh status --output json: %v: %s", err, r.stdout)
	}
	if strings.Join(v.Addrs, " ") != strings.Join(text, " ") || v.Join != join {
		t.Errorf("status JSON addrs %v join %q, want %v and %q", v.Addrs, v.Join, text, join)
	}
}

// joinAddrs parses the comma-separated --bootstrap list of a join line.
func joinAddrs(t *testing.T, line string) []ma.Multiaddr {
	t.Helper()
	i := strings.Index(line, "--bootstrap ")
	if i < 0 {
		t.Fatalf("join line without --bootstrap: %q", line)
	}
	var out []ma.Multiaddr
	for _, s := range strings.Split(strings.TrimSpace(line[i+len("--bootstrap "):]), ",") {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			t.Fatalf("join line %q: %v", line, err)
		}
		if _, err := peer.AddrInfoFromP2pAddr(a); err != nil {
			t.Fatalf("join address %s has no /p2p/<id>: %v", a, err)
		}
		out = append(out, a)
	}
	return out
}

// interfaceIPv4s returns the machine's IPv4 addresses that are neither
// loopback nor link-local: what a node on 0.0.0.0 can be dialed at.
func interfaceIPv4s(t *testing.T) map[string]bool {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.To4() == nil || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() {
			continue
		}
		out[ipn.IP.String()] = true
	}
	return out
}

func randomPeerID(t *testing.T) peer.ID {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// loggedNode is a `workmesh node start` run with exactly the arguments
// given, whose log lines are kept with the time they arrived.
type loggedNode struct {
	ready    time.Time
	api      string
	joinLine string

	mu  sync.Mutex
	log []loggedLine
}

type loggedLine struct {
	at   time.Time
	text string
}

// startLoggedNode starts `workmesh node start args...` and waits for ready.
func startLoggedNode(t *testing.T, bin string, args ...string) *loggedNode {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"node", "start"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WORKMESH_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "HOME="+t.TempDir())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &loggedNode{}
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log = append(p.log, loggedLine{time.Now(), sc.Text()})
			p.mu.Unlock()
		}
		close(done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		cmd.Wait()
	})
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "api: "):
				p.api = strings.TrimPrefix(line, "api: ")
			case strings.HasPrefix(line, "join with: "):
				p.joinLine = strings.TrimPrefix(line, "join with: ")
			case line == "ready":
				p.ready = time.Now()
				ready <- nil
				for sc.Scan() {
				}
				return
			}
		}
		ready <- fmt.Errorf("exited before ready")
	}()
	select {
	case err := <-ready:
		if err != nil {
			<-done
			t.Fatalf("workmesh node start %s: %v; stderr:\n%s", strings.Join(args, " "), err, p.stderrText())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("workmesh node start %s: not ready within 15s; stderr:\n%s", strings.Join(args, " "), p.stderrText())
	}
	return p
}

// since returns, for each log line containing s, how long after ready it
// arrived.
func (p *loggedNode) since(s string) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Duration
	for _, l := range p.log {
		if strings.Contains(l.text, s) {
			out = append(out, l.at.Sub(p.ready).Round(10*time.Millisecond))
		}
	}
	return out
}

// lines returns the log lines containing s.
func (p *loggedNode) lines(s string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, l := range p.log {
		if strings.Contains(l.text, s) {
			out = append(out, l.text)
		}
	}
	return out
}

func (p *loggedNode) stderrText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, l := range p.log {
		b.WriteString(l.text + "\n")
	}
	return b.String()
}
