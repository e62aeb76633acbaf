package tests

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/selection"
	"github.com/workmesh/workmesh/tests/testkit"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// digestYAML is the config of a worker of the digest type: honest ones
// run sha256sum, the liar a command whose output is always the same wrong
// line, declared deterministic as the honest type is.
func digestYAML(command string) string {
	return `drain-timeout: 200ms
work-types: [digest]
custom-types:
  digest:
    command: ` + command + `
    deterministic: true
    idempotent: true
`
}

const (
	honestDigest = `["sha256sum"]`
	// slowDigest is an honest worker slower than the liar, which then
	// wins the rating and takes most of the work, as a fast liar would.
	slowDigest  = `["sh", "-c", "sleep 0.03; sha256sum"]`
	lyingDigest = `["sh", "-c", "cat >/dev/null; echo wrong"]`
)

// digestNet starts two honest digest workers, a liar and a gateway that
// knows the type (declared, not served) with extra flags, all real
// processes; it waits until the gateway lists the three.
func digestNet(t *testing.T, honestCommand string, gatewayFlags ...string) (bin string, g, liar *nodeProcess, honest []*nodeProcess) {
	t.Helper()
	bin = buildBinary(t)
	a := startNodeProcess(t, bin, "--config", writeCustomConfig(t, "a", digestYAML(honestCommand)), "--log-level", "info")
	b := startNodeProcess(t, bin, "--config", writeCustomConfig(t, "b", digestYAML(honestCommand)), "--bootstrap", a.join, "--log-level", "info")
	liar = startNodeProcess(t, bin, "--config", writeCustomConfig(t, "liar", digestYAML(lyingDigest)), "--bootstrap", a.join, "--log-level", "info")
	// The gateway also declares a type that is not deterministic.
	gwYAML := strings.Replace(digestYAML(honestDigest), "work-types: [digest]", "work-types: [echo]", 1) +
		"  stamp:\n    command: [\"date\", \"+%N\"]\n"
	g = startNodeProcess(t, bin, append([]string{"--config", writeCustomConfig(t, "gw", gwYAML), "--bootstrap", a.join, "--log-level", "info"}, gatewayFlags...)...)
	awaitListed(t, bin, g, a, b, liar)
	for _, p := range []*nodeProcess{a, b, liar} {
		awaitAdvertised(t, bin, g, p, "digest", true)
	}
	// The gateway's dispatcher takes a peer once its first poll answered.
	testkit.WaitFor(t, 10*time.Second, "the gateway's dispatcher sees the three workers alive", func() error {
		m, err := peersSelection(g.api)
		if err != nil {
			return err
		}
		for _, p := range []*nodeProcess{a, b, liar} {
			if st := m[p.peerID].State; st != "alive" {
				return fmt.Errorf("%s is %q", p.peerID, st)
			}
		}
		return nil
	})
	return bin, g, liar, []*nodeProcess{a, b}
}

// verifyAnswer is the part of POST /v1/work's answer these tests read.
type verifyAnswer struct {
	Status string       `json:"status"`
	Result *string      `json:"result"`
	Worker string       `json:"worker"`
	Error  string       `json:"error"`
	Verify *verifyVotes `json:"verify"`
	code   int
}

// verifyVotes is the answer's verify part: who agreed, every vote.
type verifyVotes struct {
	Agreed []string `json:"agreed"`
	Votes  []struct {
		Worker string `json:"worker"`
		Digest string `json:"digest"`
	} `json:"votes"`
}

func (v *verifyVotes) agreedOrNil() []string {
	if v == nil {
		return nil
	}
	return v.Agreed
}

// postWork sends one request to the node's API as a client would.
func postWorkJSON(ctx context.Context, api string, body map[string]any) (verifyAnswer, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+api+"/v1/work", bytes.NewReader(b))
	if err != nil {
		return verifyAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return verifyAnswer{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var a verifyAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		return verifyAnswer{}, fmt.Errorf("decode %q: %w", raw, err)
	}
	a.code = resp.StatusCode
	return a, nil
}

// peerSelection is the part of GET /v1/peers/selection these tests read.
type peerSelection struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	Reason   string `json:"reason"`
	Disputes int    `json:"disputes"`
}

func peersSelection(api string) (map[string]peerSelection, error) {
	resp, err := http.Get("http://" + api + "/v1/peers/selection")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var ps []peerSelection
	if err := json.NewDecoder(resp.Body).Decode(&ps); err != nil {
		return nil, err
	}
	m := map[string]peerSelection{}
	for _, p := range ps {
		m[p.ID] = p
	}
	return m, nil
}

// sha256sumOf is what sha256sum prints for payload read from stdin.
func sha256sumOf(payload string) string {
	sum := sha256.Sum256([]byte(payload))
	return hex.EncodeToString(sum[:]) + "  -\n"
}

// cordoned waits for the liar to be cordoned for disputes, as the peers
// view says.
func cordonedForDisputes(api, liar string) error {
	m, err := peersSelection(api)
	if err != nil {
		return err
	}
	p, ok := m[liar]
	if !ok {
		return fmt.Errorf("liar not listed")
	}
	if p.Disputes < 1 || p.State != "unreachable" || !strings.HasPrefix(p.Reason, "disputed:") {
		return fmt.Errorf("liar %+v, want it unreachable with disputes and a disputed reason", p)
	}
	return nil
}

// TestVerifyOutvotesALiar: three workers serve a digest type, one of them
// lies; with verify 2/3 every one of 1,000 requests (16 at once) gets the
// correct digest, agreed by two honest workers, and the liar is cordoned
// for its disputes, as the peers view and `workmesh peers` say. A type
// that is not deterministic is refused verify with a 400 that says why.
func TestVerifyOutvotesALiar(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs 4 nodes")
	}
	bin, g, liar, honest := digestNet(t, honestDigest)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const n, parallel = 1000, 16
	var wrong, failed atomic.Int64
	var firstBad atomic.Value
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for i := range jobs {
				payload := "payload " + strconv.Itoa(i)
				a, err := postWorkJSON(ctx, g.api, map[string]any{"type": "digest", "payload": payload, "timeout": "10s",
					"verify": map[string]int{"replicas": 3, "agree": 2}})
				switch {
				case err != nil || a.Status != "ok" || a.Result == nil:
					failed.Add(1)
					firstBad.CompareAndSwap(nil, fmt.Sprintf("request %d: %v %+v", i, err, a))
				case *a.Result != sha256sumOf(payload) || a.Verify == nil || len(a.Verify.Agreed) < 2:
					wrong.Add(1)
					firstBad.CompareAndSwap(nil, fmt.Sprintf("request %d: %+v", i, a))
				}
				for _, w := range a.Verify.agreedOrNil() {
					if w == liar.peerID {
						wrong.Add(1)
						firstBad.CompareAndSwap(nil, fmt.Sprintf("request %d: the liar agreed: %+v", i, a))
					}
				}
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if wrong.Load()+failed.Load() > 0 {
		t.Fatalf("%d wrong and %d failed answers of %d; first: %v", wrong.Load(), failed.Load(), n, firstBad.Load())
	}
	testkit.WaitFor(t, 5*time.Second, "the liar cordoned for disputes", func() error { return cordonedForDisputes(g.api, liar.peerID) })
	m, _ := peersSelection(g.api)
	for _, h := range honest {
		if d := m[h.peerID].Disputes; d != 0 {
			t.Errorf("honest worker %s has %d disputes", h.peerID, d)
		}
	}
	r := runCLI(t, bin, nil, "peers", "--api", g.api)
	if !strings.Contains(r.stdout, "disputed:") || !strings.Contains(r.stdout, "disputes: ") {
		t.Errorf("workmesh peers does not show the dispute:\n%s", r.stdout)
	}
	r = runCLI(t, bin, nil, "submit", "--api", g.api, "--type", "digest", "--payload", "abc", "--verify", "2/3")
	if r.code != 0 || r.stdout != sha256sumOf("abc") || !strings.Contains(r.stderr, "verified 2/3: agreed by") {
		t.Errorf("submit --verify 2/3: exit %d stdout %q stderr %s", r.code, r.stdout, r.stderr)
	}
	a, err := postWorkJSON(ctx, g.api, map[string]any{"type": "stamp", "payload": "x", "verify": map[string]int{"replicas": 3, "agree": 2}})
	if err != nil || a.code != http.StatusBadRequest || !strings.Contains(a.Error, "not deterministic") {
		t.Errorf("verify of a type that is not deterministic: %v %d %+v, want a 400 saying why", err, a.code, a)
	}
	r = runCLI(t, bin, nil, "submit", "--api", g.api, "--type", "stamp", "--payload", "1ms", "--verify", "2/3")
	if r.code == 0 || !strings.Contains(r.stderr, "not deterministic") {
		t.Errorf("submit --verify of sleep: exit %d stderr %s, want a refusal saying it is not deterministic", r.code, r.stderr)
	}
}

// TestAuditCordonsALiar: the same network without verify, the gateway
// auditing a tenth of the results, the liar faster than the honest
// workers (so that it wins the rating and most of the work): it is
// cordoned within 200 requests.
func TestAuditCordonsALiar(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs 4 nodes")
	}
	_, g, liar, _ := digestNet(t, slowDigest, "--audit-rate", "0.1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sent := 0
	for sent < 200 && cordonedForDisputes(g.api, liar.peerID) != nil {
		if _, err := postWorkJSON(ctx, g.api, map[string]any{"type": "digest", "payload": "p" + strconv.Itoa(sent), "timeout": "10s"}); err != nil {
			t.Fatal(err)
		}
		sent++
	}
	// The audits of the last requests may still run.
	testkit.WaitFor(t, 10*time.Second, fmt.Sprintf("the liar cordoned after %d requests", sent), func() error { return cordonedForDisputes(g.api, liar.peerID) })
	t.Logf("liar cordoned after %d requests", sent)
}

// TestExploreBudgetNewcomer: a newcomer with zero load joins a network
// whose two workers have proven themselves (rating-min-samples 50 at the
// gateway); while it has not, it gets at most explore-share 0.1 of any
// 200 requests' first attempts: 20. Real libp2p hosts in this
// process.
func TestExploreBudgetNewcomer(t *testing.T) {
	const minSamples = 50
	hits := newHitCounter()
	echo := func(name string) map[string]workers.Handler {
		return map[string]workers.Handler{"work": counting(name, hits, workers.HandlerFunc(func(_ context.Context, p []byte) workers.Result {
			return workers.OK(p)
		}))}
	}
	gw := startMember(t, hits, memberSpec{name: "gw", cfg: func(c *config.Config) { c.Rating.MinSamples = minSamples }}, nil)
	a := startMember(t, hits, memberSpec{name: "a", handlers: echo("a")}, gw)
	b := startMember(t, hits, memberSpec{name: "b", handlers: echo("b")}, gw)
	waitRanked(t, gw, "work", 2)
	allRated := func(want int) func() error {
		return func() error {
			gw.disp.Selector().Refresh()
			rated := 0
			for _, r := range gw.disp.Selector().Ranking("work") {
				if r.Rated {
					rated++
				}
			}
			if rated < want {
				return fmt.Errorf("%d rated", rated)
			}
			return nil
		}
	}
	// a and b prove themselves (the second one within the budget too).
	for i := 0; allRated(2)() != nil; i++ {
		if i == 2000 {
			t.Fatal("a and b not both rated after 2000 requests")
		}
		if res := gw.submit(t, dispatch.WorkRequest{Type: "work", Payload: []byte(strconv.Itoa(i))}); res.Status != "ok" {
			t.Fatalf("warm-up %d: %s", i, describe(res, peerName(a, b)))
		}
	}
	newcomer := startMember(t, hits, memberSpec{name: "new", handlers: echo("new")}, gw)
	waitRanked(t, gw, "work", 3)
	// Fewer requests than it takes the newcomer to prove itself at the
	// budget's pace: it stays unproven for the whole run.
	const n = 150
	firstToNew := 0
	for i := range n {
		res := gw.submit(t, dispatch.WorkRequest{Type: "work", Payload: []byte(strconv.Itoa(i))})
		if res.Status != "ok" || len(res.Attempts) == 0 {
			t.Fatalf("request %d: %s", i, describe(res, peerName(a, b, newcomer)))
		}
		if res.Attempts[0].Peer == newcomer.node.ID().String() {
			firstToNew++
		}
	}
	t.Logf("first attempts to the newcomer: %d of %d", firstToNew, n)
	if firstToNew == 0 {
		t.Fatal("the newcomer was never explored")
	}
	// Any config.ExploreWindow requests in a row spend at most a tenth of
	// them on exploring; n is less than that.
	if limit := config.ExploreWindow / 10; firstToNew > limit {
		t.Fatalf("the unproven newcomer took %d of %d first attempts, want at most %d", firstToNew, n, limit)
	}
}

// TestVerifyDisputedByDefault: a work type's verify default (here
// work-type-defaults sha256 verify 2/3) applies to requests that ask
// nothing; three workers that each answer differently end the request
// disputed, naming every worker's digest; two that agree against one make
// the answer, and the one outvoted gets a dispute. Real libp2p hosts in
// this process.
func TestVerifyDisputedByDefault(t *testing.T) {
	hits := newHitCounter()
	answer := func(out string) map[string]workers.Handler {
		return map[string]workers.Handler{"sha256": fixedResult(workers.OK([]byte(out)))}
	}
	gw := startMember(t, hits, memberSpec{name: "gw", cfg: func(c *config.Config) {
		c.WorkTypeDefaults = map[string]config.WorkTypeConfig{"sha256": {Verify: "2/3"}}
	}}, nil)
	x := startMember(t, hits, memberSpec{name: "x", handlers: answer("x")}, gw)
	y := startMember(t, hits, memberSpec{name: "y", handlers: answer("y")}, gw)
	z := startMember(t, hits, memberSpec{name: "z", handlers: answer("z")}, gw)
	waitRanked(t, gw, "sha256", 3)
	name := peerName(x, y, z)
	res := gw.submit(t, dispatch.WorkRequest{Type: "sha256", Payload: []byte("p")})
	if res.Status != "disputed" || res.Verify == nil || len(res.Verify.Votes) != 3 {
		t.Fatalf("three different answers: %s, want disputed with three votes", describe(res, name))
	}
	for _, out := range []string{"x", "y", "z"} {
		sum := sha256.Sum256([]byte(out))
		if !strings.Contains(res.Error, hex.EncodeToString(sum[:])) {
			t.Errorf("the error does not name the digest of %q: %s", out, res.Error)
		}
	}
	// y and z now agree against x.
	z.stop()
	z2 := startMember(t, hits, memberSpec{name: "z2", handlers: answer("y")}, gw)
	// The stopped worker's record stays (record-ttl); what takes it out of
	// the choice is its failed polls.
	testkit.WaitFor(t, 10*time.Second, "the stopped worker out of the choice and its successor in", func() error {
		live := gw.disp.Selector().Liveness()
		if st := live.State(string(z.node.ID())); st == selection.StateAlive {
			return fmt.Errorf("the stopped worker is %s", st)
		}
		if st := live.State(string(z2.node.ID())); st != selection.StateAlive {
			return fmt.Errorf("its successor is %s", st)
		}
		return nil
	})
	name = peerName(x, y, z2)
	xID := x.node.ID()
	testkit.WaitFor(t, 10*time.Second, "x outvoted", func() error {
		res := gw.submit(t, dispatch.WorkRequest{Type: "sha256", Payload: []byte("p")})
		if res.Status != "ok" || string(res.Output) != "y" || len(res.Verify.Agreed) != 2 {
			return fmt.Errorf("%s", describe(res, name))
		}
		if gw.disp.Selector().Liveness().Disputes(string(xID)) == 0 {
			return fmt.Errorf("x has no dispute yet")
		}
		return nil
	})
}
