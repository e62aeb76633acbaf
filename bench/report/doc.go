// Command report turns the output of the performance suite (go test -bench,
// see `make bench`) into the table of issue 6: each figure, workmesh's
// value, the baseline measured in the same run, their ratio, the goal and
// whether it is met. It prints the table and writes it as JSON.
//
//	go run ./bench/report -out bench/results.json bench/bench.txt
//
// It exits non-zero when a benchmark failed or a figure is missing, not when
// a goal is missed: a missed goal is a result.
//
// It imports the standard library only and no workmesh package: it reads
// the benchmarks' text output, so it does not depend on the code it reports
// on. bench/README.md tells what the figures mean and how they were measured.
package main
