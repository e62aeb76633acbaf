package tests

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/tests/testkit"
)

// TestHTTPWorkCannotReachTheWorkersOwnAPI starts a worker that serves the
// http work type with loopback allowed (--http-allow 127.0.0.1, every
// port) and a gateway, as real processes, and submits at the gateway, as
// a peer of the worker would, http work that PUTs the worker's own
// /v1/faults. The worker refuses it as its own API port, and its fault
// injection stays off; http work to another loopback port is served.
func TestHTTPWorkCannotReachTheWorkersOwnAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	w := startNodeProcess(t, bin, "--work-types", "http", "--http-allow", "127.0.0.1")
	g := startNodeProcess(t, bin, "--work-types", "echo", "--bootstrap", w.join)
	other := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { io.WriteString(rw, "other service") }))
	defer other.Close()

	submit := func(payload string) (cliRun, cliResponse) {
		r := runCLI(t, bin, nil, "submit", "--api", g.api, "--type", "http", "--payload", payload, "--output", "json")
		return r, decodeResponse(t, r)
	}
	// The gateway serves no http work itself: wait until it knows the worker.
	awaitListed(t, bin, g, w)
	// The gateway's dispatcher takes the peer in a moment after its table:
	// only that moment may answer unavailable (exit 2).
	var r cliRun
	var resp cliResponse
	testkit.Poll(2*time.Second, func() error {
		if r, resp = submit(other.URL); r.code == 2 {
			return errors.New("unavailable")
		}
		return nil
	})
	if r.code != 0 || resp.Worker != w.peerID || resp.Result == nil || !strings.Contains(*resp.Result, "other service") {
		t.Fatalf("http work to another loopback port: exit %d, %+v; want it served by the worker %s\nstderr %s", r.code, resp, w.peerID, r.stderr)
	}

	for _, target := range []string{"http://" + w.api + "/v1/faults", strings.Replace("http://"+w.api+"/v1/faults", "127.0.0.1", "127.0.0.2", 1)} {
		payload := fmt.Sprintf(`{"url":%q,"method":"PUT","body":"{\"error_rate\":1}"}`, target)
		r, resp := submit(payload)
		if r.code != 1 || resp.Status != "failed" {
			t.Fatalf("PUT %s: exit %d, status %q, want 1 and failed\nstdout %s\nstderr %s", target, r.code, resp.Status, r.stdout, r.stderr)
		}
		var refused bool
		for _, at := range resp.Attempts {
			if at.Peer == w.peerID && strings.Contains(at.Error, "this node's own API port") && strings.Contains(at.Error, "destination refused") {
				refused = true
			}
		}
		if !refused {
			t.Errorf("PUT %s: attempts %+v, want the worker to refuse its own API port", target, resp.Attempts)
		}
	}

	res, err := http.Get("http://" + w.api + "/v1/faults")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var faults struct {
		ErrorRate float64 `json:"error_rate"`
	}
	if err := json.NewDecoder(res.Body).Decode(&faults); err != nil {
		t.Fatal(err)
	}
	if faults.ErrorRate != 0 {
		t.Fatalf("the worker's fault injection was switched on: error_rate %v", faults.ErrorRate)
	}
}
