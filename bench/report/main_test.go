package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/workmesh/workmesh/config"
)

// verifyLines is what BenchmarkVerifyVsSingle prints (go test -bench).
const verifyLines = `BenchmarkVerifyVsSingle/sha256-2         	    1000	    374973 ns/op	         2.047 cpu-ratio	         2.069 p50-ratio	       144.1 single-cpu-µs/req	        83.00 single-p50-µs	       295.0 verify-cpu-µs/req	       171.0 verify-p50-µs
BenchmarkVerifyVsSingle/work-1ms-2       	    1000	   3262816 ns/op	         1.558 cpu-ratio	         1.144 p50-ratio	       449.1 single-cpu-µs/req	      1440 single-p50-µs	       699.6 verify-cpu-µs/req	      1646 verify-p50-µs
`

// findRow returns the row named name.
func findRow(t *testing.T, rows []row, name string) row {
	t.Helper()
	i := slices.IndexFunc(rows, func(r row) bool { return r.Figure == name })
	if i < 0 {
		t.Fatalf("no row %q", name)
	}
	return rows[i]
}

// TestVerifyRows: the verify benchmark's lines make its four rows, each
// with the benchmark's own ratio and its goal decided; without them the
// rows are there, not run, and named missing.
func TestVerifyRows(t *testing.T) {
	results, failed, err := parse(strings.NewReader("goos: linux\n" + verifyLines + "PASS\n"))
	if err != nil || len(failed) > 0 {
		t.Fatalf("parse: %v %v", err, failed)
	}
	rows, _ := build(results)
	for _, want := range []struct {
		name        string
		w, b, ratio float64
		met         bool
	}{
		{"verify 2/3 vs a single attempt, sha256: CPU per request", 295, 144.1, 2.047, true},
		{"verify 2/3 vs a single attempt, sha256: p50", 171, 83, 2.069, false},
		{"verify 2/3 vs a single attempt, 1 ms of work: CPU per request", 699.6, 449.1, 1.558, true},
		{"verify 2/3 vs a single attempt, 1 ms of work: p50", 1646, 1440, 1.144, true},
	} {
		r := findRow(t, rows, want.name)
		if r.Workmesh == nil || r.Baseline == nil || r.Ratio == nil || r.Met == nil {
			t.Errorf("%s: %+v, want every value", want.name, r)
			continue
		}
		if *r.Workmesh != want.w || *r.Baseline != want.b || *r.Ratio != want.ratio || *r.Met != want.met {
			t.Errorf("%s: %v vs %v ratio %v met %v, want %v vs %v ratio %v met %v", want.name,
				*r.Workmesh, *r.Baseline, *r.Ratio, *r.Met, want.w, want.b, want.ratio, want.met)
		}
	}

	results, _, err = parse(strings.NewReader("BenchmarkNetworkJoinVsRawGossip-2   30   1 ns/op  7.6 join-ms  3.6 raw-ms  2.0 join/raw\n"))
	if err != nil {
		t.Fatal(err)
	}
	rows, missing := build(results)
	name := "verify 2/3 vs a single attempt, sha256: p50"
	if r := findRow(t, rows, name); r.Workmesh != nil || r.Ratio != nil {
		t.Errorf("%s without the benchmark's lines: %+v, want not run", name, r)
	}
	if !slices.Contains(missing, name) {
		t.Errorf("missing %q, want it to name %q", missing, name)
	}
}

// TestInternetTable: the table is worked out from the run's per-message
// costs and the shipped settings, and a run without them names what is
// missing.
func TestInternetTable(t *testing.T) {
	results := map[string]map[string]float64{
		"BenchmarkPerMessageCosts/gossip-validate":  {"µs/record": 40, "gossip-msg-bytes": 700},
		"BenchmarkPerMessageCosts/members-validate": {"µs/record": 90},
		"BenchmarkPerMessageCosts/health-ping":      {"ping-cpu-µs": 60, "ping-bytes": 12, "answer-bytes": 80},
		"BenchmarkRecordPublishRate":                {"publish/s-load": 0},
	}
	c, missing := internetCosts(results)
	if len(missing) != 0 {
		t.Fatalf("missing %v", missing)
	}
	var out strings.Builder
	writeInternetTable(&out, c)
	md := out.String()
	announce := config.Defaults().Node.AnnounceInterval.Seconds()
	for _, want := range []string{
		"| per node per second | 1000 nodes | 10000 nodes | 100000 nodes |",
		// 100,000 nodes, every node a new chain head each 12s.
		"| " + num(100_000*(1/announce+1.0/12)) + " |",
		// A dispatcher polls at most poll-budget of the 9,900 workers of
		// 10,000 nodes every 2s, each of them every 2s x 9,900/512.
		"| " + num(float64(config.Defaults().Liveness.PollBudget)/config.Defaults().Liveness.PollInterval.Seconds()) + " |",
		"| 4s | 39s | 6m27s |",
		"Where it breaks first:",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
	delete(results, "BenchmarkRecordPublishRate")
	if _, missing := internetCosts(results); len(missing) != 1 {
		t.Errorf("missing %v, want the publish rate alone", missing)
	}
}
