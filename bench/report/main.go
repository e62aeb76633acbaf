package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// benchLine matches a result line: name, iterations, then value/unit pairs.
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

// parse reads go test -bench output and returns each benchmark's metrics
// (the last result when a benchmark ran more than once) and the failures.
func parse(r io.Reader) (map[string]map[string]float64, []string, error) {
	results := map[string]map[string]float64{}
	var failed []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "--- FAIL") || strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "panic:") {
			failed = append(failed, line)
			continue
		}
		m := benchLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		f := strings.Fields(m[2])
		metrics := map[string]float64{}
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			metrics[f[i+1]] = v
		}
		results[m[1]] = metrics
	}
	return results, failed, sc.Err()
}

// scalePrefix names the sub-benchmarks of the scaling run, one per size.
const scalePrefix = "BenchmarkPerfScale/nodes="

// scaleSizes returns the network sizes the scaling run reported, smallest
// first.
func scaleSizes(results map[string]map[string]float64) []int {
	var sizes []int
	for name := range results {
		n, err := strconv.Atoi(strings.TrimPrefix(name, scalePrefix))
		if !strings.HasPrefix(name, scalePrefix) || err != nil {
			continue
		}
		sizes = append(sizes, n)
	}
	slices.Sort(sizes)
	return sizes
}

// scaleSources returns the scaling run's largest and smallest sizes as
// sources of metric, and the figure's name with the sizes in it.
func scaleSources(results map[string]map[string]float64, f figure) (figure, bool) {
	prefix := scalePrefix
	lo, hi := 0, 0
	if sizes := scaleSizes(results); len(sizes) > 0 {
		lo, hi = sizes[0], sizes[len(sizes)-1]
	}
	if lo == 0 || lo == hi {
		f.name = fmt.Sprintf(f.name, 200, 50)
		return f, false
	}
	f.name = fmt.Sprintf(f.name, hi, lo)
	f.workmesh = source{fmt.Sprint(prefix, hi), f.scale}
	f.baseline = source{fmt.Sprint(prefix, lo), f.scale}
	return f, true
}

func lookup(results map[string]map[string]float64, s source) (float64, bool) {
	v, ok := results[s.bench][s.metric]
	return v, ok
}

// build makes the table's rows; missing names the figures that could not be
// made.
func build(results map[string]map[string]float64) (rows []row, missing []string) {
	for _, f := range figures {
		if f.perSize != "" {
			rows, missing = sizeRows(results, f, rows, missing)
			continue
		}
		if f.scale != "" {
			f, _ = scaleSources(results, f)
		}
		r := row{Figure: f.name, Unit: f.unit, Goal: f.goal}
		w, okW := lookup(results, f.workmesh)
		b, okB := lookup(results, f.baseline)
		if !okW || !okB {
			missing = append(missing, f.name)
			if f.met != nil {
				r.Met = new(false)
			}
			rows = append(rows, r)
			continue
		}
		r.Workmesh, r.Baseline = new(round(w)), new(round(b))
		ratio := w / b
		if f.ratio.bench != "" {
			if v, ok := lookup(results, f.ratio); ok {
				ratio = v
			}
		}
		if !math.IsNaN(ratio) && !math.IsInf(ratio, 0) { // a zero baseline has no ratio
			r.Ratio = new(round(ratio))
		}
		if f.met != nil && r.Ratio != nil {
			r.Met = new(f.met(r))
		}
		rows = append(rows, r)
	}
	return rows, missing
}

// sizeRows appends one row of f per size of the scaling run, with no
// baseline: the change between sizes is the scale figures' to show.
func sizeRows(results map[string]map[string]float64, f figure, rows []row, missing []string) ([]row, []string) {
	sizes := scaleSizes(results)
	if len(sizes) == 0 {
		name := fmt.Sprintf(f.name, 200)
		return append(rows, row{Figure: name, Unit: f.unit, Goal: f.goal}), append(missing, name)
	}
	for _, n := range sizes {
		r := row{Figure: fmt.Sprintf(f.name, n), Unit: f.unit, Goal: f.goal}
		if v, ok := lookup(results, source{fmt.Sprint(scalePrefix, n), f.perSize}); ok {
			r.Workmesh = new(round(v))
		} else {
			missing = append(missing, r.Figure)
		}
		rows = append(rows, r)
	}
	return rows, missing
}

// round keeps four significant digits, which is more than the noise allows.
func round(v float64) float64 {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	p := math.Pow(10, 3-math.Floor(math.Log10(math.Abs(v))))
	return math.Round(v*p) / p
}

func format(p *float64, run bool) string {
	switch {
	case p == nil && run:
		return "-"
	case p == nil:
		return "not run"
	}
	if math.Abs(*p) >= 1000 {
		return strconv.FormatFloat(*p, 'f', 0, 64)
	}
	return strconv.FormatFloat(*p, 'g', 4, 64)
}

func printTable(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tworkmesh\tbaseline\tunit\tratio\tgoal\tmet")
	for _, r := range rows {
		met := "-"
		if r.Met != nil {
			met = map[bool]string{true: "yes", false: "NO"}[*r.Met]
		}
		run := r.Workmesh != nil
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Figure, format(r.Workmesh, run), format(r.Baseline, run), r.Unit, format(r.Ratio, run), r.Goal, met)
	}
	tw.Flush()
}

func main() {
	out := flag.String("out", "bench/results.json", "where to write the table as JSON")
	internetOut := flag.String("internet-out", "bench/internet-scale.md", "where to write the internet-scale table (markdown)")
	flag.Parse()
	var in io.Reader = os.Stdin
	if flag.NArg() > 0 {
		var readers []io.Reader
		for _, name := range flag.Args() {
			f, err := os.Open(name)
			if err != nil {
				fmt.Fprintln(os.Stderr, "report:", err)
				os.Exit(2)
			}
			defer f.Close()
			readers = append(readers, f)
		}
		in = io.MultiReader(readers...)
	}
	results, failed, err := parse(in)
	if err != nil {
		fmt.Fprintln(os.Stderr, "report: read:", err)
		os.Exit(2)
	}
	rows, missing := build(results)
	fmt.Println()
	printTable(os.Stdout, rows)
	var data bytes.Buffer
	enc := json.NewEncoder(&data)
	enc.SetEscapeHTML(false) // goals read "<= 1.25"
	enc.SetIndent("", "  ")
	if err := enc.Encode(rows); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(2)
	}
	if err := os.WriteFile(*out, data.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(2)
	}
	fmt.Printf("\nratio = workmesh / baseline (median of paired ratios where the benchmark pairs its samples); written to %s\n", *out)
	if c, miss := internetCosts(results); len(miss) == 0 {
		var md bytes.Buffer
		writeInternetTable(&md, c)
		fmt.Printf("\nInternet scale, from this run's per-message costs (written to %s):\n\n%s", *internetOut, md.String())
		if err := os.WriteFile(*internetOut, md.Bytes(), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "report:", err)
			os.Exit(2)
		}
	} else {
		missing = append(missing, miss...)
	}
	if len(failed) > 0 || len(missing) > 0 {
		for _, l := range failed {
			fmt.Fprintln(os.Stderr, "report: failure:", l)
		}
		for _, m := range missing {
			fmt.Fprintln(os.Stderr, "report: not run:", m)
		}
		os.Exit(1)
	}
}
