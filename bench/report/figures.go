package main

// The figures of the table: for each row, the benchmark metrics it is made
// of and the goal it is held to.

// figure says where one row of the table comes from and what it must meet.
type figure struct {
	name               string
	workmesh, baseline source
	// ratio is the metric holding the ratio; empty means workmesh/baseline.
	ratio source
	unit  string
	goal  string
	// met decides the goal from the row; nil means the row has no goal.
	met func(r row) bool
	// scale, when set, is a metric of the scaling run: the row compares
	// the largest network size run with the smallest, and name is a
	// format taking the two sizes.
	scale string
	// perSize, when set, is a metric of the scaling run reported as is,
	// one row per network size run (smallest first); name is a format
	// taking the size.
	perSize string
}

// source is one metric of one benchmark.
type source struct{ bench, metric string }

// row is one line of the table, as printed and as written to JSON.
type row struct {
	Figure   string   `json:"figure"`
	Workmesh *float64 `json:"workmesh"`
	Baseline *float64 `json:"baseline"`
	Unit     string   `json:"unit"`
	Ratio    *float64 `json:"ratio"`
	Goal     string   `json:"goal"`
	Met      *bool    `json:"met"`
}

func ratioAtMost(limit float64) func(row) bool {
	return func(r row) bool { return *r.Ratio <= limit }
}

// addedAtMost is met when workmesh exceeds baseline by at most limit.
func addedAtMost(limit float64) func(row) bool {
	return func(r row) bool { return *r.Workmesh-*r.Baseline <= limit }
}

func ratioAtLeast(limit float64) func(row) bool {
	return func(r row) bool { return *r.Ratio >= limit }
}

// figures is the table of issue 6, in its order. Every ratio is workmesh
// over baseline.
var figures = []figure{
	{
		name:     "remote echo round trip via dispatcher vs bare libp2p stream (median)",
		workmesh: source{"BenchmarkDispatchEchoVsBareStream", "dispatch-new-median-us"},
		baseline: source{"BenchmarkDispatchEchoVsBareStream", "bare-median-us"},
		ratio:    source{"BenchmarkDispatchEchoVsBareStream", "ratio"},
		unit:     "µs", goal: "<= 1.25", met: ratioAtMost(1.25),
	},
	{
		name:     "requests/s, 1 dispatcher + 2 workers, 64 callers vs bare stream echo",
		workmesh: source{"BenchmarkPerfThroughputVsBareStream", "workmesh-req/s"},
		baseline: source{"BenchmarkPerfThroughputVsBareStream", "baseline-req/s"},
		ratio:    source{"BenchmarkPerfThroughputVsBareStream", "ratio"},
		unit:     "req/s", goal: ">= 1.5", met: ratioAtLeast(1.5),
	},
	{
		name:     "p99, 3 of 10 workers dead (rating's top 3): rating vs round-robin",
		workmesh: source{"BenchmarkPerfDeadWorkersP99/dead=top3", "workmesh-ms"},
		baseline: source{"BenchmarkPerfDeadWorkersP99/dead=top3", "baseline-ms"},
		ratio:    source{"BenchmarkPerfDeadWorkersP99/dead=top3", "ratio"},
		unit:     "ms", goal: "<= 0.2 (5x lower)", met: ratioAtMost(0.2),
	},
	{
		name:     "p99, 3 of 10 workers dead (not rating's favourite): rating vs round-robin",
		workmesh: source{"BenchmarkPerfDeadWorkersP99/dead=others", "workmesh-ms"},
		baseline: source{"BenchmarkPerfDeadWorkersP99/dead=others", "baseline-ms"},
		ratio:    source{"BenchmarkPerfDeadWorkersP99/dead=others", "ratio"},
		unit:     "ms", goal: "<= 0.2 (5x lower)", met: ratioAtMost(0.2),
	},
	{
		name:     "share of requests reaching a half-failing worker: rating vs round-robin",
		workmesh: source{"BenchmarkPerfFlakyWorkerShare", "workmesh-%"},
		baseline: source{"BenchmarkPerfFlakyWorkerShare", "baseline-%"},
		ratio:    source{"BenchmarkPerfFlakyWorkerShare", "ratio"},
		unit:     "%", goal: "<= 0.2", met: ratioAtMost(0.2),
	},
	{
		name:     "new node eligible at 19 dispatchers vs raw gossipsub to 19 hosts",
		workmesh: source{"BenchmarkPerfEligibleVsRawGossip", "workmesh-ms"},
		baseline: source{"BenchmarkPerfEligibleVsRawGossip", "baseline-ms"},
		ratio:    source{"BenchmarkPerfEligibleVsRawGossip", "ratio"},
		unit:     "ms", goal: "<= 3", met: ratioAtMost(3),
	},
	{
		name:     "new node eligible at 19 dispatchers vs raw gossipsub then 19 cold first exchanges (its first polls' floor)",
		workmesh: source{"BenchmarkPerfEligibleVsRawGossip", "workmesh-ms"},
		baseline: source{"BenchmarkPerfEligibleVsRawGossip", "floor-ms"},
		ratio:    source{"BenchmarkPerfEligibleVsRawGossip", "floor-ratio"},
		unit:     "ms", goal: "<= 3", met: ratioAtMost(3),
	},
	{
		name:     "new node in 19 peer tables vs raw gossipsub to 19 hosts",
		workmesh: source{"BenchmarkNetworkJoinVsRawGossip", "join-ms"},
		baseline: source{"BenchmarkNetworkJoinVsRawGossip", "raw-ms"},
		ratio:    source{"BenchmarkNetworkJoinVsRawGossip", "join/raw"},
		unit:     "ms", goal: "<= 3", met: ratioAtMost(3),
	},
	{
		name:     "selection first pick, 1,000 vs 100 peers",
		workmesh: source{"BenchmarkPerfSelectionFirstPick", "workmesh-1000-ns/op"},
		baseline: source{"BenchmarkPerfSelectionFirstPick", "baseline-ns/op"},
		ratio:    source{"BenchmarkPerfSelectionFirstPick", "ratio-1000"},
		unit:     "ns", goal: "<= 1.5", met: ratioAtMost(1.5),
	},
	{
		name:     "selection first pick, 10,000 vs 100 peers",
		workmesh: source{"BenchmarkPerfSelectionFirstPick", "workmesh-ns/op"},
		baseline: source{"BenchmarkPerfSelectionFirstPick", "baseline-ns/op"},
		ratio:    source{"BenchmarkPerfSelectionFirstPick", "ratio"},
		unit:     "ns", goal: "<= 1.5", met: ratioAtMost(1.5),
	},
	{
		name:     "selection first pick, 5 peers rated, 10,000 vs 100 peers",
		workmesh: source{"BenchmarkPerfSelectionFirstPickFewRated", "workmesh-ns/op"},
		baseline: source{"BenchmarkPerfSelectionFirstPickFewRated", "baseline-ns/op"},
		ratio:    source{"BenchmarkPerfSelectionFirstPickFewRated", "ratio"},
		unit:     "ns", goal: "<= 1.5", met: ratioAtMost(1.5),
	},
	{
		name:     "resident memory, node tracking 1,000 peers vs none",
		workmesh: source{"BenchmarkPerfMemoryThousandPeers", "workmesh-MiB"},
		baseline: source{"BenchmarkPerfMemoryThousandPeers", "baseline-MiB"},
		ratio:    source{"BenchmarkPerfMemoryThousandPeers", "ratio"},
		unit:     "MiB", goal: "<= +16 MiB",
		met: func(r row) bool { return *r.Workmesh-*r.Baseline <= 16 },
	},
	{
		name:     "verify 2/3 vs a single attempt, sha256: CPU per request",
		workmesh: source{"BenchmarkVerifyVsSingle/sha256", "verify-cpu-µs/req"},
		baseline: source{"BenchmarkVerifyVsSingle/sha256", "single-cpu-µs/req"},
		ratio:    source{"BenchmarkVerifyVsSingle/sha256", "cpu-ratio"},
		unit:     "µs", goal: "<= 3.2", met: ratioAtMost(3.2),
	},
	{
		name:     "verify 2/3 vs a single attempt, sha256: p50",
		workmesh: source{"BenchmarkVerifyVsSingle/sha256", "verify-p50-µs"},
		baseline: source{"BenchmarkVerifyVsSingle/sha256", "single-p50-µs"},
		ratio:    source{"BenchmarkVerifyVsSingle/sha256", "p50-ratio"},
		unit:     "µs", goal: "<= 1.5", met: ratioAtMost(1.5),
	},
	{
		name:     "verify 2/3 vs two plain requests sent at once, sha256: p50 (what verifying adds)",
		workmesh: source{"BenchmarkVerifyVsSingle/sha256", "verify-p50-µs"},
		baseline: source{"BenchmarkVerifyVsSingle/sha256", "pair-p50-µs"},
		ratio:    source{"BenchmarkVerifyVsSingle/sha256", "pair-ratio"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "verify 2/3 vs a single attempt, 1 ms of work: CPU per request",
		workmesh: source{"BenchmarkVerifyVsSingle/work-1ms", "verify-cpu-µs/req"},
		baseline: source{"BenchmarkVerifyVsSingle/work-1ms", "single-cpu-µs/req"},
		ratio:    source{"BenchmarkVerifyVsSingle/work-1ms", "cpu-ratio"},
		unit:     "µs", goal: "<= 3.2", met: ratioAtMost(3.2),
	},
	{
		name:     "verify 2/3 vs a single attempt, 1 ms of work: p50",
		workmesh: source{"BenchmarkVerifyVsSingle/work-1ms", "verify-p50-µs"},
		baseline: source{"BenchmarkVerifyVsSingle/work-1ms", "single-p50-µs"},
		ratio:    source{"BenchmarkVerifyVsSingle/work-1ms", "p50-ratio"},
		unit:     "µs", goal: "<= 1.5", met: ratioAtMost(1.5),
	},
	{
		name:     "JSON-RPC /v1/rpc via a gateway, 1 client: p50 added over the upstream vs bare stream",
		workmesh: source{"BenchmarkRPCVsDirectUpstream/clients=1", "remote-added-p50-µs"},
		baseline: source{"BenchmarkRPCVsDirectUpstream/clients=1", "bare-p50-µs"},
		ratio:    source{"BenchmarkRPCVsDirectUpstream/clients=1", "ratio"},
		unit:     "µs", goal: "<= bare + 300 µs", met: addedAtMost(300),
	},
	{
		name:     "JSON-RPC /v1/rpc via a gateway, 32 clients: p50 added over the upstream vs bare stream",
		workmesh: source{"BenchmarkRPCVsDirectUpstream/clients=32", "remote-added-p50-µs"},
		baseline: source{"BenchmarkRPCVsDirectUpstream/clients=32", "bare-p50-µs"},
		ratio:    source{"BenchmarkRPCVsDirectUpstream/clients=32", "ratio"},
		unit:     "µs", goal: "<= bare + 300 µs", met: addedAtMost(300),
	},
	{
		name:     "JSON-RPC /v1/rpc via a gateway, 32 clients: cores other processes kept busy during the run vs the host's",
		workmesh: source{"BenchmarkRPCVsDirectUpstream/clients=32", "other-load-cores"},
		baseline: source{"BenchmarkRPCVsDirectUpstream/clients=32", "host-cores"},
		unit:     "cores", goal: "(reported)",
	},
	{
		name:     "JSON-RPC /v1/rpc via a gateway, 32 clients, local-concurrency 4: p50 added vs bare stream",
		workmesh: source{"BenchmarkRPCVsDirectUpstream/clients=32/local-concurrency=4", "remote-added-p50-µs"},
		baseline: source{"BenchmarkRPCVsDirectUpstream/clients=32/local-concurrency=4", "bare-p50-µs"},
		ratio:    source{"BenchmarkRPCVsDirectUpstream/clients=32/local-concurrency=4", "ratio"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "JSON-RPC /v1/rpc via a gateway, 1 client: p99 vs the upstream directly",
		workmesh: source{"BenchmarkRPCVsDirectUpstream/clients=1", "remote-p99-µs"},
		baseline: source{"BenchmarkRPCVsDirectUpstream/clients=1", "direct-p99-µs"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "JSON-RPC /v1/rpc via a gateway, 32 clients: p99 vs the upstream directly",
		workmesh: source{"BenchmarkRPCVsDirectUpstream/clients=32", "remote-p99-µs"},
		baseline: source{"BenchmarkRPCVsDirectUpstream/clients=32", "direct-p99-µs"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "JSON-RPC /v1/rpc in the node serving it, 1 client: p50 vs the upstream directly",
		workmesh: source{"BenchmarkRPCVsDirectUpstream/clients=1", "node-p50-µs"},
		baseline: source{"BenchmarkRPCVsDirectUpstream/clients=1", "direct-p50-µs"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "JSON-RPC /v1/rpc in the node serving it, 32 clients: p50 vs the upstream directly",
		workmesh: source{"BenchmarkRPCVsDirectUpstream/clients=32", "node-p50-µs"},
		baseline: source{"BenchmarkRPCVsDirectUpstream/clients=32", "direct-p50-µs"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "JSON-RPC /v1/rpc via a gateway, 512 KiB eth_getLogs answer: p50 vs the upstream directly",
		workmesh: source{"BenchmarkRPCVsDirectUpstream/clients=1/result=512KiB", "remote-p50-µs"},
		baseline: source{"BenchmarkRPCVsDirectUpstream/clients=1/result=512KiB", "direct-p50-µs"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "JSON-RPC /v1/rpc in the node serving it, 512 KiB eth_getLogs answer: p50 vs the upstream directly",
		workmesh: source{"BenchmarkRPCVsDirectUpstream/clients=1/result=512KiB", "node-p50-µs"},
		baseline: source{"BenchmarkRPCVsDirectUpstream/clients=1/result=512KiB", "direct-p50-µs"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "remote echo round trip via dispatcher vs bare long-lived libp2p stream (median)",
		workmesh: source{"BenchmarkDispatchEchoVsBareStream", "dispatch-median-us"},
		baseline: source{"BenchmarkDispatchEchoVsBareStream", "long-median-us"},
		ratio:    source{"BenchmarkDispatchEchoVsBareStream", "ratio-long"},
		unit:     "µs", goal: "<= 1.3", met: ratioAtMost(1.3),
	},
	{
		name:     "requests/s, 1 dispatcher + 2 workers, 64 callers vs bare long-lived-stream echo",
		workmesh: source{"BenchmarkPerfThroughputVsBareStream", "workmesh-req/s"},
		baseline: source{"BenchmarkPerfThroughputVsBareStream", "long-req/s"},
		ratio:    source{"BenchmarkPerfThroughputVsBareStream", "ratio-long"},
		unit:     "req/s", goal: "(reported)",
	},
	{
		name:     "CPU per request (both ends), 64 callers: dispatcher vs bare new-stream echo",
		workmesh: source{"BenchmarkPerfThroughputVsBareStream", "workmesh-cpu-us/req"},
		baseline: source{"BenchmarkPerfThroughputVsBareStream", "baseline-cpu-us/req"},
		ratio:    source{"BenchmarkPerfThroughputVsBareStream", "cpu-ratio"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "CPU per request (both ends), 64 callers: dispatcher vs bare long-lived-stream echo",
		workmesh: source{"BenchmarkPerfThroughputVsBareStream", "workmesh-cpu-us/req"},
		baseline: source{"BenchmarkPerfThroughputVsBareStream", "long-cpu-us/req"},
		ratio:    source{"BenchmarkPerfThroughputVsBareStream", "cpu-ratio-long"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "echo of 64 B via dispatcher vs bare long-lived stream (median)",
		workmesh: source{"BenchmarkPayloadEchoVsLongLivedStream/size=64B", "workmesh-us"},
		baseline: source{"BenchmarkPayloadEchoVsLongLivedStream/size=64B", "baseline-us"},
		ratio:    source{"BenchmarkPayloadEchoVsLongLivedStream/size=64B", "ratio"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "echo of 4 KiB via dispatcher vs bare long-lived stream (median)",
		workmesh: source{"BenchmarkPayloadEchoVsLongLivedStream/size=4KiB", "workmesh-us"},
		baseline: source{"BenchmarkPayloadEchoVsLongLivedStream/size=4KiB", "baseline-us"},
		ratio:    source{"BenchmarkPayloadEchoVsLongLivedStream/size=4KiB", "ratio"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "echo of 64 KiB via dispatcher vs bare long-lived stream (median)",
		workmesh: source{"BenchmarkPayloadEchoVsLongLivedStream/size=64KiB", "workmesh-us"},
		baseline: source{"BenchmarkPayloadEchoVsLongLivedStream/size=64KiB", "baseline-us"},
		ratio:    source{"BenchmarkPayloadEchoVsLongLivedStream/size=64KiB", "ratio"},
		unit:     "µs", goal: "(reported)",
	},
	{
		name:     "echo of 1 MiB via dispatcher vs bare long-lived stream (median)",
		workmesh: source{"BenchmarkPayloadEchoVsLongLivedStream/size=1MiB", "workmesh-us"},
		baseline: source{"BenchmarkPayloadEchoVsLongLivedStream/size=1MiB", "baseline-us"},
		ratio:    source{"BenchmarkPayloadEchoVsLongLivedStream/size=1MiB", "ratio"},
		unit:     "µs", goal: "<= 1.3", met: ratioAtMost(1.3),
	},
	{name: "scaling: requests/s at %d nodes, 20 dispatching (mocknet)", perSize: "req/s", unit: "req/s", goal: "(reported)"},
	{name: "scaling: p99 at %d nodes, 20 dispatching (mocknet)", perSize: "p99-ms", unit: "ms", goal: "(reported)"},
	{name: "scaling: failed requests at %d nodes, of 20,000 (mocknet)", perSize: "failed", unit: "requests", goal: "(reported)"},
	{name: "scaling: gossip messages dropped, validation queue full, while forming, %d nodes (mocknet)", perSize: "dropped-validation", unit: "messages", goal: "(reported)"},
	{name: "scaling: gossip messages dropped, peer queue full, while forming, %d nodes (mocknet)", perSize: "dropped-peer-queue", unit: "messages", goal: "(reported)"},
	{name: "scaling: gossip messages dropped, no stream to the peer yet, while forming, %d nodes (mocknet)", perSize: "dropped-no-stream", unit: "messages", goal: "(reported)"},
	{name: "scaling: own publications gossipsub had no send queue to a topic peer for (pushed at the peer's greeting instead; not in the drops), %d nodes (mocknet)", perSize: "left-out", unit: "messages", goal: "(reported)"},
	{name: "scaling: CPU the process spent until every worker was alive everywhere, %d nodes (mocknet)", perSize: "form-cpu-s", unit: "s", goal: "(reported)"},
	{name: "scaling: that CPU over the machine's cores, the shortest forming could take here, %d nodes (mocknet)", perSize: "form-floor-s", unit: "s", goal: "(reported; above 15, alive-15s cannot reach 100)"},
	{name: "scaling: requests per CPU-second of the process, %d vs %d nodes, 20 dispatching (mocknet)", scale: "req/cpu-s", unit: "req/cpu-s", goal: "(reported)"},
	{name: "scaling: requests/s, %d vs %d nodes, 20 dispatching (mocknet)", scale: "req/s", unit: "req/s", goal: "(reported)"},
	{name: "scaling: p99, %d vs %d nodes, 20 dispatching (mocknet)", scale: "p99-ms", unit: "ms", goal: "(reported)"},
	{name: "scaling: idle network CPU, %d vs %d nodes (mocknet)", scale: "background-cores", unit: "cores", goal: "(reported)"},
	{
		name:     "hedging, 1 of 3 workers 50x slower on 10%, 10ms work: p99, measured hedging vs none",
		workmesh: source{"BenchmarkPerfHedgeMeasured/work=10ms", "measured-p99-ms"},
		baseline: source{"BenchmarkPerfHedgeMeasured/work=10ms", "none-p99-ms"},
		ratio:    source{"BenchmarkPerfHedgeMeasured/work=10ms", "p99-ratio"},
		unit:     "ms", goal: "<= 0.2 (5x lower)", met: ratioAtMost(0.2),
	},
	{
		name:     "hedging, same: hedges fired, measured (p95) vs fixed hedge-delay 100ms",
		workmesh: source{"BenchmarkPerfHedgeMeasured/work=10ms", "measured-hedges"},
		baseline: source{"BenchmarkPerfHedgeMeasured/work=10ms", "fixed-hedges"},
		ratio:    source{"BenchmarkPerfHedgeMeasured/work=10ms", "hedge-ratio"},
		unit:     "hedges", goal: "<= 1.1", met: ratioAtMost(1.1),
	},
	{
		name:     "hedging, same: p99, fixed hedge-delay 100ms vs none",
		workmesh: source{"BenchmarkPerfHedgeMeasured/work=10ms", "fixed-p99-ms"},
		baseline: source{"BenchmarkPerfHedgeMeasured/work=10ms", "none-p99-ms"},
		unit:     "ms", goal: "(reported)",
	},
	{
		name:     "hedging, same: hedges fired, measured at hedge-quantile 0.99 vs fixed",
		workmesh: source{"BenchmarkPerfHedgeMeasured/work=10ms", "measured-q99-hedges"},
		baseline: source{"BenchmarkPerfHedgeMeasured/work=10ms", "fixed-hedges"},
		ratio:    source{"BenchmarkPerfHedgeMeasured/work=10ms", "hedge-ratio-q99"},
		unit:     "hedges", goal: "(reported)",
	},
	{
		name:     "hedging, 1 of 3 workers 50x slower on 10%, 120ms work: p99, measured hedging vs none",
		workmesh: source{"BenchmarkPerfHedgeMeasured/work=120ms", "measured-p99-ms"},
		baseline: source{"BenchmarkPerfHedgeMeasured/work=120ms", "none-p99-ms"},
		ratio:    source{"BenchmarkPerfHedgeMeasured/work=120ms", "p99-ratio"},
		unit:     "ms", goal: "<= 0.2 (5x lower)", met: ratioAtMost(0.2),
	},
	{
		name:     "hedging, same: hedges fired, measured (p95) vs fixed hedge-delay 100ms",
		workmesh: source{"BenchmarkPerfHedgeMeasured/work=120ms", "measured-hedges"},
		baseline: source{"BenchmarkPerfHedgeMeasured/work=120ms", "fixed-hedges"},
		ratio:    source{"BenchmarkPerfHedgeMeasured/work=120ms", "hedge-ratio"},
		unit:     "hedges", goal: "<= 1.1", met: ratioAtMost(1.1),
	},

	{name: "scaling: workers ranked alive at every dispatcher 15s after the start, %d nodes (mocknet)", perSize: "alive-15s-%", unit: "%", goal: "(reported; goal 100)"},
	{name: "scaling: seconds until every dispatcher ranked every worker alive, %d nodes (mocknet)", perSize: "alive-all-s", unit: "s", goal: "(reported)"},
	{name: "scaling: gossip messages dropped, whole run (full queues, and peers without a stream yet), %d nodes (mocknet)", perSize: "dropped-total", unit: "messages", goal: "(reported; goal 0)"},
	{name: "scaling: idle CPU per node, %d nodes (mocknet)", perSize: "idle-millicores/node", unit: "millicores", goal: "(reported)"},
	{name: "scaling: idle CPU per node, %d vs %d nodes (mocknet)", scale: "idle-millicores/node", unit: "millicores", goal: "<= 1.2", met: ratioAtMost(1.2)},
	{name: "scaling: requests/s per the smaller network's, %d vs %d nodes, 20 dispatching (mocknet)", scale: "req/s", unit: "req/s", goal: ">= 0.8", met: ratioAtLeast(0.8)},
}
