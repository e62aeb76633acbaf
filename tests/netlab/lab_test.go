package netlab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/tests/testkit"
)

// nsPrefix starts the name of every namespace the lab makes, followed by
// the pid of the test process that made it: leftovers of an earlier run
// that did not clean up (killed) are removed by it, and the namespaces of
// a lab another test process runs at the same time are left alone.
const nsPrefix = "wmn"

// The lab's address plan, all in documentation ranges: the internet is
// 198.51.100.0/24 (public hosts .10 and up, routers' uplinks .20 and up),
// site n is 192.0.2.(64n)/26 behind its router at 192.0.2.(64n+1).
const (
	internetNet  = "198.51.100.0/24"
	sitesNet     = "192.0.2.0/24"
	internetBits = "24"
)

var (
	// bin is the workmesh binary TestMain built; labErr why the lab
	// cannot run here.
	bin    string
	labErr error
	// buildErr fails every test: a binary that does not build is no
	// reason to skip.
	buildErr error
)

func TestMain(m *testing.M) {
	code := func() int {
		labErr = canRun()
		if labErr == nil {
			dir, err := os.MkdirTemp("", "netlab-bin-")
			if err != nil {
				labErr = err
			} else {
				defer os.RemoveAll(dir)
				bin = filepath.Join(dir, "workmesh")
				out, err := exec.Command("go", "build", "-o", bin, "github.com/workmesh/workmesh/cmd/workmesh").CombinedOutput()
				if err != nil {
					buildErr = fmt.Errorf("go build: %v\n%s", err, out)
				}
			}
		}
		if labErr == nil && buildErr == nil {
			removeLeftovers()
		}
		return m.Run()
	}()
	os.Exit(code)
}

// canRun says why the lab cannot run: not root, or ip or nft missing.
func canRun() error {
	if os.Geteuid() != 0 {
		return errors.New("the network lab needs root (network namespaces)")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("the network lab needs %s (Debian: iproute2, nftables): %v", tool, err)
		}
	}
	return nil
}

// requireLab skips the test when the lab cannot run, or fails it when
// WMTEST_NETNS=1 says it must (CI).
func requireLab(t *testing.T) {
	t.Helper()
	if labErr == nil && buildErr != nil {
		t.Fatal(buildErr)
	}
	if labErr == nil {
		return
	}
	if os.Getenv("WMTEST_NETNS") == "1" {
		t.Fatalf("WMTEST_NETNS=1 but %v", labErr)
	}
	t.Skip(labErr)
}

// removeLeftovers deletes the namespaces of an earlier run, stopping the
// processes that run in them (the lab's own node processes).
func removeLeftovers() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for line := range strings.Lines(string(out)) {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if rest, ok := strings.CutPrefix(name, nsPrefix); ok && !ownerRuns(rest) {
			deleteNS(name)
		}
	}
}

// ownerRuns reports whether the test process whose pid starts rest (a
// namespace name after nsPrefix, "<pid>-<lab>-<role>") still runs.
func ownerRuns(rest string) bool {
	s, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 1 {
		return false
	}
	err = syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// deleteNS stops the processes in a namespace, by their pids, and deletes
// it, which removes its interfaces with it.
func deleteNS(name string) {
	if out, err := exec.Command("ip", "netns", "pids", name).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	_ = exec.Command("ip", "netns", "del", name).Run()
}

// lab is one small internet in network namespaces: an "internet" bridge in
// a namespace of its own, hosts on it, and sites behind NAT routers.
type lab struct {
	t   *testing.T
	id  string
	mu  sync.Mutex
	nss []string // made, in order
}

func newLab(t *testing.T) *lab {
	t.Helper()
	requireLab(t)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	l := &lab{t: t, id: hex.EncodeToString(b)}
	t.Cleanup(l.teardown)
	l.addNS("inet")
	l.run("ip", "-n", l.ns("inet"), "link", "add", "br0", "type", "bridge")
	l.run("ip", "-n", l.ns("inet"), "link", "set", "br0", "up")
	return l
}

func (l *lab) ns(role string) string {
	return nsPrefix + strconv.Itoa(os.Getpid()) + "-" + l.id + "-" + role
}

// run runs a command and fails the test with its output when it fails.
func (l *lab) run(name string, args ...string) {
	l.t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		l.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// nft loads a ruleset into a namespace.
func (l *lab) nft(role, ruleset string) {
	l.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", l.ns(role), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		l.t.Fatalf("nft in %s: %v\n%s\n%s", role, err, out, ruleset)
	}
}

func (l *lab) addNS(role string) {
	l.t.Helper()
	name := l.ns(role)
	l.run("ip", "netns", "add", name)
	l.mu.Lock()
	l.nss = append(l.nss, name)
	l.mu.Unlock()
	l.run("ip", "-n", name, "link", "set", "lo", "up")
}

// teardown deletes every namespace the lab made, last first.
func (l *lab) teardown() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.nss) - 1; i >= 0; i-- {
		deleteNS(l.nss[i])
	}
	l.nss = nil
}

// attach links role's namespace to the internet bridge as interface ifname
// with addr/24.
func (l *lab) attach(role, ifname, addr string) {
	l.t.Helper()
	inet, ns := l.ns("inet"), l.ns(role)
	port := "v" + role
	l.run("ip", "-n", inet, "link", "add", port, "type", "veth", "peer", "name", ifname, "netns", ns)
	l.run("ip", "-n", inet, "link", "set", port, "master", "br0", "up")
	l.run("ip", "-n", ns, "addr", "add", addr+"/"+internetBits, "dev", ifname)
	l.run("ip", "-n", ns, "link", "set", ifname, "up")
}

// uplink names the internet bridge's port of role.
func uplink(role string) string { return "v" + role }

// publicHost adds a host on the internet at 198.51.100.<n>. Its packets to
// the sites' private range leave through its interface (and nowhere), so
// that its counter sees every one it sends.
func (l *lab) publicHost(role string, n int) string {
	l.t.Helper()
	l.addNS(role)
	addr := fmt.Sprintf("198.51.100.%d", n)
	l.attach(role, "eth0", addr)
	l.run("ip", "-n", l.ns(role), "route", "add", sitesNet, "dev", "eth0")
	l.nft(role, `table ip wmlab {
	chain out_count {
		type filter hook output priority filter; policy accept;
		ip daddr `+sitesNet+` counter name private_dials
	}
	counter private_dials {}
}
`)
	return addr
}

// natKind is how a site's router treats traffic.
type natKind int

const (
	// natCone masquerades keeping the source port where it can: a
	// mapping reused for every destination, which hole punching gets through.
	natCone natKind = iota
	// natSymmetric masquerades with a random port per connection:
	// hole punching cannot guess it.
	natSymmetric
	// natNoUDP masquerades and drops every UDP packet.
	natNoUDP
)

// site adds router "r<role>" on the internet at 198.51.100.<20+n> and
// host role behind it at 192.0.2.<64n+2>, returning the host's address.
func (l *lab) site(role string, n int, kind natKind) string {
	l.t.Helper()
	router := "r" + role
	l.addNS(router)
	l.addNS(role)
	l.attach(router, "wan", fmt.Sprintf("198.51.100.%d", 20+n))
	rns, hns := l.ns(router), l.ns(role)
	gw, host := fmt.Sprintf("192.0.2.%d", 64*n+1), fmt.Sprintf("192.0.2.%d", 64*n+2)
	l.run("ip", "-n", rns, "link", "add", "lan", "type", "veth", "peer", "name", "eth0", "netns", hns)
	l.run("ip", "-n", rns, "addr", "add", gw+"/26", "dev", "lan")
	l.run("ip", "-n", rns, "link", "set", "lan", "up")
	l.run("ip", "-n", hns, "addr", "add", host+"/26", "dev", "eth0")
	l.run("ip", "-n", hns, "link", "set", "eth0", "up")
	l.run("ip", "-n", hns, "route", "add", "default", "via", gw)
	l.run("ip", "netns", "exec", rns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
	masq, extra := "masquerade", ""
	switch kind {
	case natSymmetric:
		masq = "masquerade random"
	case natNoUDP:
		extra = "meta l4proto udp drop"
	}
	l.nft(router, `table ip wmlab {
	chain nat_post {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "wan" `+masq+`
	}
	chain forward_filter {
		type filter hook forward priority filter; policy accept;
		`+extra+`
		iifname "wan" ct state established,related accept
		iifname "wan" drop
	}
	chain input_filter {
		# As home routers do: nothing from the internet reaches the
		# router itself, so that a packet arriving before its flow's
		# outbound one leaves no conntrack entry that would move the
		# flow's mapping to another port.
		type filter hook input priority filter; policy accept;
		iifname "wan" ct state established,related accept
		iifname "wan" drop
	}
}
`)
	return host
}

// cut takes role's uplink down (the internet bridge's side), heal brings
// it back.
func (l *lab) cut(role string)  { l.run("ip", "-n", l.ns("inet"), "link", "set", uplink(role), "down") }
func (l *lab) heal(role string) { l.run("ip", "-n", l.ns("inet"), "link", "set", uplink(role), "up") }

// block makes role's router drop every packet it forwards to or from the
// internet address addr (a table of its own); unblock removes the table.
// The relay, elsewhere on the internet, is not touched.
func (l *lab) block(router, addr string) {
	l.t.Helper()
	l.nft(router, `table ip wmblock {
	chain forward_drop {
		type filter hook forward priority filter - 10; policy accept;
		ip daddr `+addr+` drop
		ip saddr `+addr+` drop
	}
}
`)
}

func (l *lab) unblock(router string) {
	l.t.Helper()
	l.run("ip", "netns", "exec", l.ns(router), "nft", "delete", "table", "ip", "wmblock")
}

// counter reads a named nft counter's packets in role's namespace.
func (l *lab) counter(role, name string) int {
	l.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", l.ns(role), "nft", "-j", "list", "counter", "ip", "wmlab", name).Output()
	if err != nil {
		l.t.Fatalf("nft list counter %s in %s: %v", name, role, err)
	}
	var doc struct {
		Nftables []struct {
			Counter *struct {
				Packets int `json:"packets"`
			} `json:"counter"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		l.t.Fatalf("nft counter %s: %v\n%s", name, err, out)
	}
	for _, o := range doc.Nftables {
		if o.Counter != nil {
			return o.Counter.Packets
		}
	}
	l.t.Fatalf("nft counter %s not found in %s", name, out)
	return 0
}

// wmNode is a `workmesh node start` process in a namespace, with its API on
// the namespace's own loopback.
type wmNode struct {
	l       *lab
	role    string
	dir     string
	logPath string
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{}
}

const nodeAPI = "127.0.0.1:7400"

// start runs a node in role's namespace with the lab's common settings and
// args, stopped at cleanup. Every node treats the internet's range as
// public: libp2p counts documentation ranges as unroutable.
func (l *lab) start(role string, args ...string) *wmNode {
	l.t.Helper()
	dir := l.t.TempDir()
	n := &wmNode{l: l, role: role, dir: dir, logPath: filepath.Join(dir, "node.log"), done: make(chan struct{})}
	logf, err := os.Create(n.logPath)
	if err != nil {
		l.t.Fatal(err)
	}
	full := append([]string{"netns", "exec", l.ns(role), bin, "node", "start",
		"--network", "lab", "--api", nodeAPI, "--data-dir", filepath.Join(dir, "data"),
		"--public-ranges", internetNet, "--drain-timeout", "1s", "--log-level", "debug"}, args...)
	n.cmd = exec.Command("ip", full...)
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	if lv := os.Getenv("WMTEST_NETLAB_GOLOG"); lv != "" {
		n.cmd.Env = append(os.Environ(), "GOLOG_LOG_LEVEL="+lv)
	}
	n.started = time.Now()
	if err := n.cmd.Start(); err != nil {
		logf.Close()
		l.t.Fatalf("start node in %s: %v", role, err)
	}
	go func() { _ = n.cmd.Wait(); logf.Close(); close(n.done) }()
	l.t.Cleanup(n.stop)
	l.waitFor(20*time.Second, role+"'s API answers", func() error {
		_, err := n.status()
		return err
	})
	return n
}

// stop ends the node's process (by its pid) and waits for it: SIGTERM,
// on which it withdraws its work types from its record (others no longer
// send it work) and stops within its 1s drain-timeout. Its log goes to the
// test's output when the test failed, or always with WMTEST_NETLAB_LOGS=1.
func (n *wmNode) stop() {
	select {
	case <-n.done:
	default:
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.done:
		case <-time.After(5 * time.Second):
			_ = n.cmd.Process.Kill()
			<-n.done
		}
	}
	if n.l.t.Failed() || os.Getenv("WMTEST_NETLAB_LOGS") == "1" {
		if b, err := os.ReadFile(n.logPath); err == nil {
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			n.l.t.Logf("log of %s (end):\n%s", n.role, b)
		}
	}
}

// cli runs a workmesh client command against the node's API.
func (n *wmNode) cli(ctx context.Context, args ...string) ([]byte, []byte, error) {
	full := append([]string{"netns", "exec", n.l.ns(n.role), bin}, args...)
	full = append(full, "--api", nodeAPI)
	cmd := exec.CommandContext(ctx, "ip", full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.Bytes(), stderr.Bytes(), err
}

func (n *wmNode) getJSON(v any, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, stderr, err := n.cli(ctx, append(args, "--output", "json")...)
	if err != nil {
		return fmt.Errorf("%s %v: %v: %s", n.role, args, err, stderr)
	}
	return json.Unmarshal(out, v)
}

func (n *wmNode) status() (apiv1.StatusView, error) {
	var v apiv1.StatusView
	return v, n.getJSON(&v, "status")
}

func (n *wmNode) peers() ([]apiv1.PeerStatus, error) {
	var v []apiv1.PeerStatus
	return v, n.getJSON(&v, "peers")
}

// id returns the node's peer ID.
func (n *wmNode) id() string {
	n.l.t.Helper()
	st, err := n.status()
	if err != nil {
		n.l.t.Fatal(err)
	}
	return st.PeerID
}

// bootstrap returns the node's dial addresses as --bootstrap flags.
func (n *wmNode) bootstrap() []string {
	n.l.t.Helper()
	st, err := n.status()
	if err != nil {
		n.l.t.Fatal(err)
	}
	var out []string
	for _, a := range st.Addrs {
		if strings.Contains(a, "/198.51.100.") {
			out = append(out, "--bootstrap", a)
		}
	}
	if len(out) == 0 {
		n.l.t.Fatalf("%s has no internet address: %v", n.role, st.Addrs)
	}
	return out
}

// peer returns what n's API says of peer id.
func (n *wmNode) peer(id string) (apiv1.PeerStatus, error) {
	ps, err := n.peers()
	if err != nil {
		return apiv1.PeerStatus{}, err
	}
	for _, p := range ps {
		if p.ID == id {
			return p, nil
		}
	}
	return apiv1.PeerStatus{}, fmt.Errorf("%s does not list %s", n.role, id)
}

// submitResult is the part of `workmesh submit --output json` the lab reads.
type submitResult struct {
	Status string `json:"status"`
	Worker string `json:"worker"`
	Error  string `json:"error"`
	Result string `json:"result"`
}

// submit sends one request through the node and returns its result.
func (n *wmNode) submit(typ, payload string, timeout time.Duration) (submitResult, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout+10*time.Second)
	defer cancel()
	out, stderr, err := n.cli(ctx, "submit", "--type", typ, "--payload", payload, "--timeout", timeout.String(), "--output", "json")
	var r submitResult
	if jerr := json.Unmarshal(out, &r); jerr != nil {
		return r, string(stderr), fmt.Errorf("submit at %s: %v (%v): %s %s", n.role, err, jerr, out, stderr)
	}
	return r, string(stderr), nil
}

// waitFor waits until cond holds (testkit.WaitFor).
func (l *lab) waitFor(within time.Duration, what string, cond func() error) time.Duration {
	l.t.Helper()
	return testkit.WaitFor(l.t, within, what, cond)
}
