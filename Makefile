# workmesh build, test and benchmark entry points.
GO        ?= go
BIN       ?= bin/workmesh
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Packages with no libp2p in them run under the race detector in every test run.
PURE_PKGS := ./config/... ./selection/...
BENCHTIME ?= 1s

.PHONY: all build test test-race test-all bench lint demo clean

all: lint build test

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/workmesh

## test: the full suite (race detector on the pure packages, all packages without it)
test: test-race test-all

test-race:
	$(GO) test -race -count=1 $(PURE_PKGS)

test-all:
	$(GO) test -count=1 -timeout 10m ./...

## bench: the performance suite of issue 6, every figure against its baseline in the same run (2-4
## minutes on 2 cores): prints one table, writes it to bench/results.json, raw output in bench/bench.txt.
## The memory figure runs in a process of its own, so that nothing before it skews the resident set.
BENCH_RAW := bench/bench.txt
# Network sizes of the scaling run (mocknet; tests/perf_scale_test.go).
SCALE_NODES ?= 50,100,200
bench:
	@rm -f $(BENCH_RAW)
	$(GO) test -run '^$$' -bench 'Benchmark(PlanFirstPick|RankRefresh)' -benchmem -benchtime $(BENCHTIME) ./selection/ 2>&1 | tee -a $(BENCH_RAW)
	$(GO) test -run '^$$' -bench '^BenchmarkPerfMemory' -benchtime 1x ./tests/ 2>&1 | tee -a $(BENCH_RAW)
	$(GO) test -run '^$$' -bench '^BenchmarkDispatchEchoVsBareStream$$' -benchmem -benchtime 3000x ./tests/ 2>&1 | tee -a $(BENCH_RAW)
	$(GO) test -run '^$$' -bench '^BenchmarkPayloadEchoVsLongLivedStream$$' -benchtime 1x ./tests/ 2>&1 | tee -a $(BENCH_RAW)
	$(GO) test -run '^$$' -bench '^BenchmarkNetworkJoinVsRawGossip$$' -benchtime 30x ./tests/ 2>&1 | tee -a $(BENCH_RAW)
	$(GO) test -run '^$$' -bench '^BenchmarkVerifyVsSingle$$' -benchtime 1000x ./tests/ 2>&1 | tee -a $(BENCH_RAW)
	$(GO) test -run '^$$' -bench '^BenchmarkRPCVsDirectUpstream$$' -benchtime 1x ./tests/ 2>&1 | tee -a $(BENCH_RAW)
	$(GO) test -run '^$$' -bench '^BenchmarkPerf(Throughput|DeadWorkers|FlakyWorker|Eligible|Selection)' -benchtime 1x -timeout 8m ./tests/ 2>&1 | tee -a $(BENCH_RAW)
	WMTEST_SCALE_NODES=$(SCALE_NODES) $(GO) test -run '^$$' -bench '^BenchmarkPerfScale$$' -benchtime 1x -timeout 8m ./tests/ 2>&1 | tee -a $(BENCH_RAW)
	$(GO) test -run '^$$' -bench '^BenchmarkPerfHedgeMeasured$$' -benchtime 1x -timeout 3m ./tests/ 2>&1 | tee -a $(BENCH_RAW)
	$(GO) test -run '^$$' -bench '^BenchmarkPerMessageCosts$$' -benchtime 2000x ./node/ 2>&1 | tee -a $(BENCH_RAW)
	$(GO) test -run '^$$' -bench '^BenchmarkRecordPublishRate$$' -benchtime 1x ./workers/stack/ 2>&1 | tee -a $(BENCH_RAW)
	$(GO) run ./bench/report -out bench/results.json $(BENCH_RAW)

## demo: an embedded four-node network on loopback, in one process: sample work, which peer served
## each and why, a stopped worker and the failover; exits when done (API on DEMO_API; fails clearly
## when that port is taken)
DEMO_API ?= 127.0.0.1:7400
demo: build
	./$(BIN) devnet --demo --api $(DEMO_API)

## lint: formatting, go vet and staticcheck (the version pinned by the tool directive in go.mod)
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

clean:
	rm -rf bin

.PHONY: fuzz
FUZZTIME ?= 20s
## fuzz: each fuzz target for FUZZTIME (their seed corpora also run in make test)
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./workers/protocol/
	$(GO) test -run '^$$' -fuzz '^FuzzOpenNodeData$$' -fuzztime $(FUZZTIME) ./node/
	$(GO) test -run '^$$' -fuzz '^FuzzLoadYAML$$' -fuzztime $(FUZZTIME) ./config/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./node/authority/

.PHONY: drill
## drill: the resilience drill of issue 5 (tests/drill_test.go, about 20s): six node processes,
## 1,000 sha256 requests, two workers killed, one failing, one slow; prints the figures. It also runs in make test.
## WMTEST_DRILL_SEED=n repeats a run's payloads and kill moments. Then the drain drill
## (tests/drain_drill_test.go, about 16s, not in make test): 3,000 sleeps through a gateway, SIGTERM
## to one of two workers mid-batch, with and without its drain.
drill:
	WMTEST_DRAIN_DRILL=1 $(GO) test -count=1 -run '^(TestDrill|TestDrainDrill)$$' -v ./tests/

.PHONY: netlab
NETLAB_RUNS ?= 10
## netlab: the network lab of issue 19 (tests/netlab; root, iproute2 and nftables): a small internet
## in network namespaces with NAT'd sites and real node processes. make test runs it with 2 hole punch
## runs (about a minute); this runs every scenario with NETLAB_RUNS fresh pairs of NAT'd nodes and prints
## the share that went direct and the median time to direct, and the benchmark's time to a NAT'd gateway's
## first remote result from a NAT'd worker against a public one (medians, ratio). WMTEST_NETNS=1 fails
## instead of skipping.
netlab:
	WMTEST_NETLAB_RUNS=$(NETLAB_RUNS) $(GO) test -count=1 -timeout 15m -run '^TestNetlab' -v ./tests/netlab/
