package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	lpubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/node/authority"
	"github.com/workmesh/workmesh/pubsub"
	"github.com/workmesh/workmesh/tests/testkit"
	wworkers "github.com/workmesh/workmesh/workers"
	wprotocol "github.com/workmesh/workmesh/workers/protocol"
)

// membershipNetwork is the closed network of the membership tests.
const membershipNetwork = "trust"

// closedNet is a closed network run with the built binary: its authority
// key and public key line, and how to admit and start a node.
type closedNet struct {
	t    *testing.T
	bin  string
	dir  string
	key  string
	auth string
}

func newClosedNet(t *testing.T, bin string) *closedNet {
	t.Helper()
	c := &closedNet{t: t, bin: bin, dir: t.TempDir()}
	c.key = filepath.Join(c.dir, "authority.key")
	r := runCLI(t, bin, nil, "network", "init", "--out", c.key)
	if r.code != 0 {
		t.Fatalf("network init: exit %d\n%s", r.code, r.stderr)
	}
	c.auth = strings.TrimSpace(r.stdout)
	return c
}

// admitted is a node's data dir with its identity and certificate.
type admitted struct {
	dataDir, cert, id string
}

// admit makes a node identity and a certificate for it, attesting labels.
func (c *closedNet) admit(name string, labels ...string) admitted {
	c.t.Helper()
	a := admitted{dataDir: filepath.Join(c.dir, name), cert: filepath.Join(c.dir, name+".cert")}
	r := runCLI(c.t, c.bin, nil, "node", "id", "--data-dir", a.dataDir)
	if r.code != 0 {
		c.t.Fatalf("node id: exit %d\n%s", r.code, r.stderr)
	}
	a.id = strings.TrimSpace(r.stdout)
	args := []string{"network", "admit", "--key", c.key, "--peer", a.id, "--network", membershipNetwork, "--out", a.cert}
	if len(labels) > 0 {
		args = append(args, "--labels", strings.Join(labels, ","))
	}
	if r := runCLI(c.t, c.bin, nil, args...); r.code != 0 {
		c.t.Fatalf("network admit: exit %d\n%s", r.code, r.stderr)
	}
	return a
}

// start starts an admitted node of the network with args added.
func (c *closedNet) start(a admitted, args ...string) *nodeProcess {
	c.t.Helper()
	p := startNodeProcess(c.t, c.bin, append([]string{"--data-dir", a.dataDir, "--network", membershipNetwork,
		"--network-authority", c.auth, "--membership-cert", a.cert}, args...)...)
	if p.peerID != a.id {
		c.t.Fatalf("node started as %s, admitted as %s", p.peerID, a.id)
	}
	return p
}

// strangerHost is an identity nobody admitted: a real libp2p host with a
// correctly signed record that advertises every work type, every label and
// no load, joined to the network through its bootstrap peer and gossip. It
// counts every stream a workmesh node opens to it.
type strangerHost struct {
	h       host.Host
	topic   *lpubsub.Topic
	record  []byte
	work    atomic.Int64 // work streams opened to it
	streams atomic.Int64 // every workmesh stream opened to it
}

// everyType is every work type a stranger claims to serve.
var everyType = []string{"echo", "sha256", "sleep", "http", "jsonrpc"}

func startStranger(t *testing.T, ctx context.Context, boot *nodeProcess, cert []byte) *strangerHost {
	t.Helper()
	key, id := newIdentity(t)
	h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings(loopbackQUIC))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	s := &strangerHost{h: h}
	count := func(work bool) network.StreamHandler {
		return func(st network.Stream) {
			s.streams.Add(1)
			if work {
				s.work.Add(1)
			}
			st.Reset()
		}
	}
	h.SetStreamHandler(wprotocol.ProtocolID(membershipNetwork), count(true))
	h.SetStreamHandler(node.HealthProtocol(membershipNetwork), count(false))
	h.SetStreamHandler(node.NodeDataProtocol(membershipNetwork), count(false))
	var addrs []string
	for _, a := range h.Addrs() {
		addrs = append(addrs, a.String())
	}
	wts := make([]node.WorkType, len(everyType))
	for i, n := range everyType {
		wts[i] = node.WorkType{Name: n}
	}
	s.record, err = node.SignNodeData(node.NodeData{PeerID: id, Network: membershipNetwork, Version: "stranger", Addrs: addrs,
		WorkTypes: wts, Labels: []string{"staked", "archive", "full"}, Capacity: node.Capacity{MaxConcurrent: 1000, QueueSize: 1000},
		Sequence: uint64(time.Now().UnixNano()), StartTime: time.Now().UTC(), Cert: cert}, key)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := lpubsub.NewGossipSub(ctx, h, append(pubsub.MessageFormat(), lpubsub.WithFloodPublish(true))...)
	if err != nil {
		t.Fatal(err)
	}
	if s.topic, err = ps.Join(pubsub.TopicName(membershipNetwork)); err != nil {
		t.Fatal(err)
	}
	sub, err := s.topic.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Cancel)
	ai, err := peer.AddrInfoFromString(strings.Split(boot.join, ",")[0])
	if err != nil {
		t.Fatalf("bootstrap %q: %v", boot.join, err)
	}
	if err := h.Connect(ctx, *ai); err != nil {
		t.Fatalf("stranger connect: %v", err)
	}
	return s
}

// push hands the stranger's record to p on the nodedata protocol, as a
// joining node does, and reports whether p answered with any record.
func (s *strangerHost) push(ctx context.Context, p peer.ID) (bool, error) {
	st, err := s.h.NewStream(ctx, p, node.NodeDataProtocol(membershipNetwork))
	if err != nil {
		return false, err
	}
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(5 * time.Second))
	var out bytes.Buffer
	for _, b := range [][]byte{[]byte(`{"all":true,"push":true}`), s.record} {
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], uint32(len(b)))
		out.Write(hdr[:])
		out.Write(b)
	}
	if _, err := st.Write(out.Bytes()); err != nil {
		return false, err
	}
	_ = st.CloseWrite()
	answer, err := io.ReadAll(st)
	return len(answer) > 0, err
}

// workResult is one answer of the gateway's work API, with when it came.
type workResult struct {
	resp apiv1.WorkResponse
	at   time.Time
	took time.Duration
}

// postWork sends one request to a node's work API.
func postWorkHTTP(ctx context.Context, api string, req apiv1.WorkRequest) (workResult, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return workResult{}, err
	}
	start := time.Now()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+api+apiv1.WorkPath, bytes.NewReader(body))
	if err != nil {
		return workResult{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return workResult{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return workResult{}, err
	}
	var r workResult
	if err := json.Unmarshal(raw, &r.resp); err != nil {
		return workResult{}, fmt.Errorf("decode %q: %w", raw, err)
	}
	r.at = time.Now()
	r.took = r.at.Sub(start)
	return r, nil
}

// runWork sends count requests at once-per-worker concurrency conc and
// returns every answer.
func runWork(t *testing.T, api string, count, conc int, req apiv1.WorkRequest) []workResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := make([]workResult, count)
	errs := make([]error, count)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= count {
					return
				}
				out[i], errs[i] = postWorkHTTP(ctx, api, req)
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return out
}

func payload(s string) *string { return &s }

// p99 of the answers' times.
func p99(rs []workResult) time.Duration {
	d := make([]time.Duration, len(rs))
	for i, r := range rs {
		d[i] = r.took
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[(len(d)*99)/100]
}

// notMemberRejections sums workmesh_nodedata_rejections_total{reason=
// "not_member"} over every source at a node.
func notMemberRejections(t *testing.T, api string) float64 {
	t.Helper()
	mfs := testkit.Scrape(t, "http://"+api+"/metrics")
	sum := 0.0
	for _, src := range []string{"gossip", "sync", "dht", "other"} {
		if v, ok := testkit.MetricValue(mfs, "workmesh_nodedata_rejections_total", map[string]string{"source": src, "reason": "not_member"}); ok {
			sum += v
		}
	}
	return sum
}

// TestCLIMembershipStrangersGetNoWork: a closed network (an authority,
// three admitted workers and a gateway, real processes) and unadmitted
// identities (real libp2p hosts with fresh keys and correctly signed
// records that advertise every work type, every label and no load; half
// of them carry a certificate of another authority) that join through the
// bootstrap and gossip. They get no work stream, their records are refused
// and counted as not_member, their nodedata and health streams are
// refused, they are not listed, and honest work all succeeds on the
// members.
func TestCLIMembershipStrangersGetNoWork(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	strangers := 50
	if raceDetector {
		strangers = 10
	}
	bin := buildBinary(t)
	cn := newClosedNet(t, bin)
	gwA := cn.admit("gateway")
	ws := []admitted{cn.admit("w1"), cn.admit("w2"), cn.admit("w3")}
	gw := cn.start(gwA, "--work-types", "echo")
	var workers []*nodeProcess
	for _, w := range ws {
		workers = append(workers, cn.start(w, "--work-types", "sha256", "--bootstrap", gw.join))
	}
	awaitListed(t, bin, gw, workers...)
	honest := apiv1.WorkRequest{Type: "sha256", Payload: payload("hello")}
	before := runWork(t, gw.api, 200, 8, honest)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	other, err := authority.Generate()
	if err != nil {
		t.Fatal(err)
	}
	var fakes []*strangerHost
	for i := range strangers {
		s := startStranger(t, ctx, gw, nil)
		if i%2 == 1 {
			// A certificate, but of another authority.
			c, err := other.Admit(membershipNetwork, s.h.ID(), []string{"staked"}, time.Now(), time.Now().Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			s.resign(t, c.Encode())
		}
		fakes = append(fakes, s)
	}
	gwID, err := peer.Decode(gw.peerID)
	if err != nil {
		t.Fatal(err)
	}
	refusedPush, refusedHealth := 0, 0
	for _, s := range fakes {
		if got, _ := s.push(ctx, gwID); !got {
			refusedPush++
		}
		if err := s.ping(ctx, gwID); err != nil {
			refusedHealth++
		}
	}
	// Gossip: each stranger publishes its record a few times, as an
	// announcing node would, once its topic peers are there.
	testkit.WaitFor(t, 10*time.Second, "the strangers' gossip reaches the gateway", func() error {
		for _, s := range fakes {
			if err := s.topic.Publish(ctx, s.record); err != nil {
				return err
			}
		}
		if n := notMemberRejections(t, gw.api); n < float64(2*strangers) {
			return fmt.Errorf("%v not_member rejections at the gateway, want at least %d (pushed and gossiped)", n, 2*strangers)
		}
		return nil
	})
	// A stranger that sends work to a member is refused.
	w1ID, err := peer.Decode(workers[0].peerID)
	if err != nil {
		t.Fatal(err)
	}
	if err := fakes[0].h.Connect(ctx, peer.AddrInfo{ID: w1ID, Addrs: mustAddrs(t, workers[0].join)}); err != nil {
		t.Fatalf("stranger connect to a worker: %v", err)
	}
	wc, err := wprotocol.NewClient(fakes[0].h, membershipNetwork)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := wc.Do(ctx, w1ID, wprotocol.Request{ID: "stranger-1", Type: "sha256", Payload: []byte("hello")}); err != nil ||
		resp.Outcome != wworkers.Denied || !strings.Contains(resp.Error, "not a member") {
		t.Errorf("a stranger's work at a member: %+v, %v; want denied, not a member", resp, err)
	}
	if refusedPush != strangers || refusedHealth != strangers {
		t.Errorf("refused %d of %d nodedata pushes and %d health pings; want every one", refusedPush, strangers, refusedHealth)
	}
	after := runWork(t, gw.api, 300, 8, honest)
	served := map[string]int{}
	for _, r := range after {
		if r.resp.Status != apiv1.StatusOK {
			t.Fatalf("honest request failed: %+v", r.resp)
		}
		served[r.resp.Worker]++
	}
	for w := range served {
		if !slices.ContainsFunc(ws, func(a admitted) bool { return a.id == w }) {
			t.Errorf("a request went to %s, not a member", w)
		}
	}
	var work, streams int64
	for _, s := range fakes {
		work += s.work.Load()
		streams += s.streams.Load()
	}
	if work != 0 {
		t.Errorf("the strangers got %d work streams, want 0", work)
	}
	ids, err := peersOf(t, bin, gw.api)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != len(ws) {
		t.Errorf("the gateway lists %d peers, want the %d members: %v", len(ids), len(ws), ids)
	}
	for _, w := range workers {
		if n := notMemberRejections(t, w.api); n == 0 {
			t.Logf("worker %s counted no not_member rejection (the strangers' records may not have reached it by gossip)", w.peerID)
		}
	}
	t.Logf("%d strangers: %v not_member rejections at the gateway, %d streams to strangers (%d work); honest p99 %s before, %s with the strangers; served %v",
		strangers, notMemberRejections(t, gw.api), streams, work, p99(before), p99(after), served)
}

// mustAddrs is the address of a bootstrap multiaddr, without /p2p.
func mustAddrs(t *testing.T, join string) []ma.Multiaddr {
	t.Helper()
	ai, err := peer.AddrInfoFromString(strings.Split(join, ",")[0])
	if err != nil {
		t.Fatalf("join %q: %v", join, err)
	}
	return ai.Addrs
}

// resign replaces the stranger's record by one carrying cert.
func (s *strangerHost) resign(t *testing.T, cert []byte) {
	t.Helper()
	var nd node.NodeData
	sd, err := node.OpenNodeData(s.record, membershipNetwork)
	if err != nil {
		t.Fatal(err)
	}
	nd = sd.Data
	nd.Cert, nd.Sequence = cert, nd.Sequence+1
	if s.record, err = node.SignNodeData(nd, s.h.Peerstore().PrivKey(s.h.ID())); err != nil {
		t.Fatal(err)
	}
}

// ping sends a health ping to p; an error means it was refused.
func (s *strangerHost) ping(ctx context.Context, p peer.ID) error {
	st, err := s.h.NewStream(ctx, p, node.HealthProtocol(membershipNetwork))
	if err != nil {
		return err
	}
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(5 * time.Second))
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], 2)
	if _, err := st.Write(append(hdr[:], '{', '}')); err != nil {
		return err
	}
	_ = st.CloseWrite()
	answer, err := io.ReadAll(st)
	if err != nil {
		return err
	}
	if len(answer) == 0 {
		return fmt.Errorf("no answer")
	}
	return nil
}

// TestCLIMembershipRevocationStopsWork: a worker revoked by a revocation
// published through another member's API stops getting work within one
// second of the publication (from just before `workmesh network
// publish-revocation` runs to the last answer it produced), and the
// gateway no longer lists it.
func TestCLIMembershipRevocationStopsWork(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	cn := newClosedNet(t, bin)
	gw := cn.start(cn.admit("gateway"), "--work-types", "echo")
	w1A, w2A, w3A := cn.admit("w1"), cn.admit("w2"), cn.admit("w3", "archive")
	w1 := cn.start(w1A, "--work-types", "sha256", "--bootstrap", gw.join)
	w2 := cn.start(w2A, "--work-types", "sha256", "--bootstrap", gw.join)
	w3 := cn.start(w3A, "--work-types", "sha256", "--bootstrap", gw.join, "--labels", "archive")
	awaitListed(t, bin, gw, w1, w2, w3)

	// Load that only w3 can serve (its certificate alone attests
	// archive), and load any worker serves, until stopped.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var mu sync.Mutex
	var got []workResult
	var wg sync.WaitGroup
	for i := range 4 {
		req := apiv1.WorkRequest{Type: "sha256", Payload: payload("hello"), Timeout: "2s"}
		if i%2 == 0 {
			req.Labels = []string{"archive"}
		}
		wg.Go(func() {
			for n := 0; n < 100000; n++ {
				select {
				case <-stop:
					return
				default:
				}
				r, err := postWorkHTTP(ctx, gw.api, req)
				if err != nil {
					return
				}
				mu.Lock()
				got = append(got, r)
				mu.Unlock()
			}
		})
	}
	servedBy := func(id string, since time.Time) (n int, last time.Time) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range got {
			if r.resp.Worker == id && r.resp.Status == apiv1.StatusOK && !r.at.Before(since) {
				n++
				if r.at.After(last) {
					last = r.at
				}
			}
		}
		return n, last
	}
	testkit.WaitFor(t, 10*time.Second, "w3 serves work", func() error {
		if n, _ := servedBy(w3.peerID, time.Time{}); n < 20 {
			return fmt.Errorf("w3 served %d", n)
		}
		return nil
	})
	rev := filepath.Join(cn.dir, "w3.revocation")
	if r := runCLI(t, bin, nil, "network", "revoke", "--key", cn.key, "--peer", w3.peerID, "--network", membershipNetwork, "--out", rev); r.code != 0 {
		t.Fatalf("network revoke: exit %d\n%s", r.code, r.stderr)
	}
	published := time.Now()
	r := runCLI(t, bin, nil, "network", "publish-revocation", rev, "--api", w1.api)
	if r.code != 0 || !strings.Contains(r.stdout, "revocation of "+w3.peerID+" published") {
		t.Fatalf("publish-revocation: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	returned := time.Now()
	// Keep the load on for two seconds more: w3 must serve none of it.
	select {
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
	}
	close(stop)
	wg.Wait()
	_, last := servedBy(w3.peerID, time.Time{})
	lag := last.Sub(published)
	if lag > time.Second && !raceDetector {
		t.Errorf("w3 served work until %s after the revocation's publication, want at most 1s", lag)
	}
	afterAll, _ := servedBy(w1.peerID, returned)
	if afterAll == 0 {
		n2, _ := servedBy(w2.peerID, returned)
		afterAll = n2
	}
	if afterAll == 0 {
		t.Error("the other workers served nothing after the revocation")
	}
	if ids, err := peersOf(t, bin, gw.api); err != nil || slices.Contains(ids, w3.peerID) {
		t.Errorf("the gateway still lists the revoked worker: %v %v", ids, err)
	}
	t.Logf("publish-revocation took %s; w3's last answer came %s after the publication started", returned.Sub(published), lag)
}

// TestCLIMembershipAttestedLabels: with an authority, a worker that
// declares staked without its certificate saying so is not in the staked
// group: a request requiring staked goes only to the worker whose
// certificate attests it, and `peers` marks the declared label.
func TestCLIMembershipAttestedLabels(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	cn := newClosedNet(t, bin)
	gw := cn.start(cn.admit("gateway"), "--work-types", "echo")
	vouched := cn.start(cn.admit("vouched", "staked"), "--work-types", "sha256", "--bootstrap", gw.join, "--labels", "staked")
	claims := cn.start(cn.admit("claims"), "--work-types", "sha256", "--bootstrap", gw.join, "--labels", "staked")
	awaitListed(t, bin, gw, vouched, claims)
	rs := runWork(t, gw.api, 60, 4, apiv1.WorkRequest{Type: "sha256", Payload: payload("hello"), Labels: []string{"staked"}})
	for _, r := range rs {
		if r.resp.Status != apiv1.StatusOK || r.resp.Worker != vouched.peerID {
			t.Fatalf("a staked request: status %s worker %s, want ok from %s (the vouched worker), not %s\n%+v",
				r.resp.Status, r.resp.Worker, vouched.peerID, claims.peerID, r.resp)
		}
	}
	// Without labels both serve.
	unlabelled := runWork(t, gw.api, 60, 4, apiv1.WorkRequest{Type: "sha256", Payload: payload("hello")})
	seen := map[string]bool{}
	for _, r := range unlabelled {
		seen[r.resp.Worker] = true
	}
	if !seen[claims.peerID] {
		t.Logf("unlabelled work went to %v only", seen)
	}
	out := runCLI(t, bin, nil, "peers", "--api", gw.api, "--output", "json")
	var peers []apiv1.PeerView
	if err := json.Unmarshal([]byte(out.stdout), &peers); err != nil {
		t.Fatalf("peers: %v\n%s", err, out.stdout)
	}
	for _, p := range peers {
		switch p.ID {
		case claims.peerID:
			if !slices.Contains(p.Labels, "staked") || slices.Contains(p.AttestedLabels, "staked") || !slices.Contains(p.DeclaredLabels, "staked") {
				t.Errorf("the claiming worker's view: labels %v attested %v declared only %v; want staked declared, not attested", p.Labels, p.AttestedLabels, p.DeclaredLabels)
			}
		case vouched.peerID:
			if !slices.Contains(p.AttestedLabels, "staked") || len(p.DeclaredLabels) != 0 {
				t.Errorf("the vouched worker's view: attested %v declared only %v; want staked attested", p.AttestedLabels, p.DeclaredLabels)
			}
		}
	}
	text := runCLI(t, bin, nil, "peers", "--api", gw.api)
	if !strings.Contains(text.stdout, "staked(self-declared)") {
		t.Errorf("peers does not mark the self-declared label:\n%s", text.stdout)
	}
	st := runCLI(t, bin, nil, "status", "--api", gw.api)
	if !strings.Contains(st.stdout, "membership: closed network: members certified by authority "+cn.auth) {
		t.Errorf("status:\n%s", st.stdout)
	}
	stj := runCLI(t, bin, nil, "status", "--api", gw.api, "--output", "json")
	if !strings.Contains(stj.stdout, `"open_network": false`) && !strings.Contains(stj.stdout, `"open_network":false`) {
		t.Errorf("status json does not say open_network false:\n%s", stj.stdout)
	}
}
