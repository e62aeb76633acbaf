package dispatch_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers/api"
	"github.com/workmesh/workmesh/workers/dispatch"
	"github.com/workmesh/workmesh/workers/workertest"
)

// TestOperatorEndpoints serves the operator API over HTTP and reads it as
// a client would.
func TestOperatorEndpoints(t *testing.T) {
	p := dispatch.NewFakePeer([]string{"full"}, "sha256")
	d := dispatch.TestDispatcher(t, config.Defaults(), p)
	reg := prometheus.NewRegistry()
	workertest.Must(t, reg.Register(d.Collector()))
	op, err := api.NewOperator(d, reg, api.WithLogger(workertest.QuietLogger()))
	workertest.Must(t, err)
	mux := http.NewServeMux()
	workertest.Must(t, op.Register(func(pattern string, h http.Handler) error { mux.Handle(pattern, h); return nil }))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		workertest.Must(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		workertest.Must(t, err)
		return resp.StatusCode, b
	}
	code, body := get(apiv1.MetricsPath)
	if code != http.StatusOK || !strings.Contains(string(body), "workmesh_peers_by_liveness{state=\"alive\"} 1") {
		t.Errorf("GET /metrics: %d\n%s", code, body)
	}
	code, body = get(apiv1.PeerStatusPath)
	var peers []apiv1.PeerStatus
	if code != http.StatusOK || json.Unmarshal(body, &peers) != nil || len(peers) != 1 ||
		peers[0].ID != p.ID().String() || peers[0].State != "alive" || len(peers[0].Scores) != 1 || peers[0].Scores[0].WorkType != "sha256" {
		t.Errorf("GET %s: %d %s", apiv1.PeerStatusPath, code, body)
	}
	code, body = get(apiv1.PlanPath + "?type=sha256&labels=full")
	var plan apiv1.PlanView
	if code != http.StatusOK || json.Unmarshal(body, &plan) != nil || len(plan.Order) != 1 || !slices.Equal(plan.Labels, []string{"full"}) {
		t.Errorf("GET %s: %d %s", apiv1.PlanPath, code, body)
	}
	for _, bad := range []struct{ query, field string }{
		{"", "type"}, {"?type=a%20b", "type"}, {"?type=sha256&min_head=-1", "min_head"}, {"?type=sha256&label=x", "label"},
	} {
		code, body = get(apiv1.PlanPath + bad.query)
		var e apiv1.Error
		if code != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Field != bad.field {
			t.Errorf("GET %s%s: %d %s, want 400 naming %s", apiv1.PlanPath, bad.query, code, body, bad.field)
		}
	}
	code, body = get(apiv1.StatusPath)
	var st apiv1.StatusView
	if code != http.StatusOK || json.Unmarshal(body, &st) != nil || st.Peers.Fresh != 1 || st.Liveness.Alive != 1 || st.Local.MaxConcurrent == 0 {
		t.Errorf("GET %s: %d %s", apiv1.StatusPath, code, body)
	}
}
