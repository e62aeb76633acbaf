package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/workmesh/workmesh/node/apiv1"
)

// Bounds of a batch.
const (
	// maxBatchConcurrency bounds --concurrency: each request holds an HTTP
	// connection and a dispatch on the node.
	maxBatchConcurrency = 256
	// maxBatchLine bounds one line of a batch file: the most the API takes
	// as a body.
	maxBatchLine = apiv1.DefaultMaxBody
	// maxListedLines bounds the line numbers an error lists.
	maxListedLines = 10
)

// Statuses of a batch line that never became a dispatched request.
const (
	// batchInvalid: the line is not a valid request; it was not sent.
	batchInvalid = "invalid"
	// batchError: the node refused the request or could not be reached.
	batchError = "error"
	// batchCancelled: the batch was interrupted before the node answered.
	batchCancelled = "cancelled"
)

// batchResult is one line of a batch's output: the line it answers, how it
// ended, and the node's answer when there was one.
type batchResult struct {
	Line   int    `json:"line"`
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
	*apiv1.WorkResponse
	// unusable is the error of an API no other line would get past
	// (errAPIUnusable): the batch stops at it.
	unusable error
}

// batchJob is one line of the batch file, parsed.
type batchJob struct {
	line int
	req  apiv1.WorkRequest
	err  error // the line is invalid
}

// runBatch runs every request of the batch file at most o.concurrency at
// once, writes one JSON result a line to stdout, shows progress on stderr
// and ends with a summary. It returns an error carrying exit code 1 when
// any line did not succeed.
func runBatch(ctx context.Context, o submitOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	if err := checkOutput(&o.output); err != nil {
		return err
	}
	if _, err := apiURL(o.api, ""); err != nil {
		return err // a bad --api is one usage error, not one per line
	}
	switch {
	case o.output == outputYAML:
		return usageError{errors.New("--output yaml: a batch writes one JSON result a line; give text or json")}
	case o.concurrency < 1 || o.concurrency > maxBatchConcurrency:
		return usageError{fmt.Errorf("--concurrency %d: want 1 to %d", o.concurrency, maxBatchConcurrency)}
	case o.payload != "" || o.payloadFile != "":
		return usageError{errors.New("--file: give payloads in the file's lines, not with --payload or --payload-file")}
	case o.timeout < 0:
		return usageError{fmt.Errorf("--timeout %s: want a positive duration", o.timeout)}
	}
	mode, err := progressMode(o.progress, stderr)
	if err != nil {
		return err
	}
	var in io.Reader = stdin
	total := -1 // unknown on stdin
	if o.file != "-" {
		f, err := os.Open(o.file)
		if err != nil {
			return usageError{fmt.Errorf("--file: %w", err)}
		}
		defer f.Close()
		if total, err = countLines(f); err != nil {
			return usageError{fmt.Errorf("--file %s: %w", o.file, err)} // a directory, say
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("--file %s: %w", o.file, err)
		}
		in = f
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan batchJob)
	results := make(chan batchResult, o.concurrency)
	var wg sync.WaitGroup
	var readErr error
	wg.Go(func() {
		defer close(jobs)
		readErr = readBatch(ctx, in, o, jobs)
	})
	var workersWG sync.WaitGroup
	for range o.concurrency {
		workersWG.Go(func() {
			for j := range jobs {
				results <- runBatchJob(ctx, o.api, j)
			}
		})
	}
	wg.Go(func() {
		workersWG.Wait()
		close(results)
	})

	p := newProgress(stderr, mode, total)
	sum := newBatchSummary()
	enc := json.NewEncoder(stdout)
	tick := time.NewTicker(progressTick)
	defer tick.Stop()
	var writeErr, unusable error
	for done := false; !done; {
		select {
		case r, ok := <-results:
			if !ok {
				done = true
				break
			}
			if writeErr == nil {
				if writeErr = enc.Encode(r); writeErr != nil {
					cancel() // nobody reads the results: stop sending work
				}
			}
			sum.add(r)
			if r.unusable != nil && unusable == nil {
				// Every other line would end the same way (and a node
				// that refuses the token slows each refusal down).
				unusable = r.unusable
				cancel()
			}
			if r.Status == batchInvalid || r.Status == batchError {
				p.note(fmt.Sprintf("line %d: %s", r.Line, r.Error))
			}
			p.update(sum.done, sum.ok, sum.failed, false)
		case <-tick.C:
			p.update(sum.done, sum.ok, sum.failed, false)
		}
	}
	wg.Wait()
	p.update(sum.done, sum.ok, sum.failed, true)
	interrupted := ctx.Err() != nil && writeErr == nil && unusable == nil
	sum.print(stderr, total, interrupted)
	switch {
	case writeErr != nil:
		return fmt.Errorf("write results: %w", writeErr)
	case unusable != nil:
		return exitError{exitUnavailable, fmt.Errorf("batch stopped after %d requests: %w", sum.done, unusable)}
	case readErr != nil:
		return fmt.Errorf("--file %s: %w", o.file, readErr)
	case interrupted:
		return exitError{130, fmt.Errorf("batch interrupted after %d requests", sum.done)}
	case sum.failed > 0:
		return exitError{exitFailed, fmt.Errorf("batch: %d of %d requests did not succeed (%s)", sum.failed, sum.done, sum.failedLines())}
	}
	return nil
}

// readBatch reads the batch line by line and sends each non-blank line as a
// job, until the input ends or ctx does. A line longer than maxBatchLine
// is an invalid job; only a failure to read stops the batch.
func readBatch(ctx context.Context, in io.Reader, o submitOptions, jobs chan<- batchJob) error {
	br := bufio.NewReaderSize(in, 64<<10)
	for n := 1; ; n++ {
		line, tooLong, err := readLine(br, maxBatchLine)
		if len(bytes.TrimSpace(line)) > 0 || tooLong {
			j := batchJob{line: n}
			if tooLong {
				j.err = fmt.Errorf("longer than %d bytes, the most a request may carry", maxBatchLine)
			} else {
				j.req, j.err = parseBatchLine(line, o)
			}
			select {
			case jobs <- j:
			case <-ctx.Done():
				return nil
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read line %d: %w", n, err)
		}
	}
}

// readLine returns the next line without its end. A line longer than limit
// is skipped to its end and reported as tooLong.
func readLine(br *bufio.Reader, limit int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > limit+1 {
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), tooLong, err
	}
}

// countLines counts the non-blank lines of r, for the progress total.
func countLines(r io.Reader) (int, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	n, blank := 0, true
	for {
		b, err := br.ReadByte()
		if err != nil {
			if !blank {
				n++
			}
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			return n, err
		}
		switch b {
		case '\n':
			if !blank {
				n++
			}
			blank = true
		case ' ', '\t', '\r':
		default:
			blank = false
		}
	}
}

// parseBatchLine decodes one line into a request, filling what it leaves
// out from the command's flags. Unknown fields are errors naming them.
func parseBatchLine(line []byte, o submitOptions) (apiv1.WorkRequest, error) {
	var req apiv1.WorkRequest
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("not a JSON request object (fields type, payload, payload_b64, timeout, labels, min_head, verify): %s",
			strings.TrimPrefix(err.Error(), "json: "))
	}
	if dec.More() {
		return req, errors.New("more than one JSON value on the line")
	}
	if req.Type == "" {
		req.Type = o.workType
	}
	if req.Type == "" {
		return req, errors.New("type: missing (give it in the line or with --type)")
	}
	if req.Payload != nil && req.PayloadB64 != nil {
		return req, errors.New("payload_b64: give payload or payload_b64, not both")
	}
	if req.Timeout == "" && o.timeout > 0 {
		req.Timeout = o.timeout.String()
	}
	if req.Labels == nil {
		req.Labels = o.labels
	}
	if req.MinHead == nil && o.hasMinHead {
		mh := o.minHead
		req.MinHead = &mh
	}
	if req.Verify == nil && o.verify != "" {
		v, err := verifyFlag(o.verify)
		if err != nil {
			return req, err
		}
		req.Verify = v
	}
	return req, nil
}

// runBatchJob sends one job and turns its answer into a result line.
func runBatchJob(ctx context.Context, api string, j batchJob) batchResult {
	if j.err != nil {
		return batchResult{Line: j.line, Status: batchInvalid, Error: j.err.Error()}
	}
	var timeout time.Duration
	if j.req.Timeout != "" {
		timeout, _ = time.ParseDuration(j.req.Timeout) // the node checks it
	}
	ans, err := postWork(ctx, api, j.req, timeout)
	if err != nil && ctx.Err() != nil {
		return batchResult{Line: j.line, Status: batchCancelled, Error: "interrupted before the node answered"}
	}
	if err != nil {
		r := batchResult{Line: j.line, Status: batchError, Error: err.Error()}
		if errors.Is(err, errAPIUnusable) {
			r.unusable = err
		}
		return r
	}
	resp := ans.resp
	return batchResult{Line: j.line, Status: string(resp.Status), Error: resp.Error, WorkResponse: &resp}
}

// batchSummary collects how a batch went.
type batchSummary struct {
	start     time.Time
	done      int
	ok        int
	failed    int
	byStatus  map[string]int
	byWorker  map[string]int
	latencies []float64 // of dispatched requests, in ms
	failedAt  []int
}

func newBatchSummary() *batchSummary {
	return &batchSummary{start: time.Now(), byStatus: map[string]int{}, byWorker: map[string]int{}}
}

func (s *batchSummary) add(r batchResult) {
	s.done++
	s.byStatus[r.Status]++
	if r.WorkResponse != nil {
		s.latencies = append(s.latencies, r.DurationMS)
	}
	if r.Status == string(apiv1.StatusOK) || r.Status == string(apiv1.StatusEmpty) {
		s.ok++
		s.byWorker[r.Worker]++
		return
	}
	s.failed++
	s.failedAt = append(s.failedAt, r.Line)
}

// failedLines lists the first line numbers that did not succeed.
func (s *batchSummary) failedLines() string {
	lines := slices.Clone(s.failedAt)
	slices.Sort(lines)
	var parts []string
	for i, n := range lines {
		if i == maxListedLines {
			parts = append(parts, fmt.Sprintf("and %d more", len(lines)-i))
			break
		}
		parts = append(parts, strconv.Itoa(n))
	}
	if len(lines) == 1 {
		return "line " + parts[0]
	}
	return "lines " + strings.Join(parts, ", ")
}

// print writes the summary: counts, latency percentiles and who served.
func (s *batchSummary) print(w io.Writer, total int, interrupted bool) {
	el := time.Since(s.start)
	rate := 0.0
	if el > 0 {
		rate = float64(s.done) / el.Seconds()
	}
	head := fmt.Sprintf("batch: %d requests in %s (%.1f/s): %d ok, %d failed", s.done, el.Round(time.Millisecond), rate, s.ok, s.failed)
	if s.failed > 0 {
		var parts []string
		for _, st := range []string{"failed", "timeout", "unavailable", batchError, batchInvalid, batchCancelled} {
			if n := s.byStatus[st]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, st))
			}
		}
		head += " (" + strings.Join(parts, ", ") + ")"
	}
	if n := s.byStatus[string(apiv1.StatusEmpty)]; n > 0 {
		head += fmt.Sprintf("; %d of the ok were empty", n)
	}
	fmt.Fprintln(w, head)
	if interrupted {
		if total >= 0 {
			fmt.Fprintf(w, "interrupted: %d of %d lines done\n", s.done, total)
		} else {
			fmt.Fprintf(w, "interrupted: %d lines done\n", s.done)
		}
	}
	if len(s.latencies) > 0 {
		l := slices.Clone(s.latencies)
		slices.Sort(l)
		fmt.Fprintf(w, "latency: p50 %s, p99 %s, max %s (as the node measured it)\n",
			fmtMS(percentile(l, 50)), fmtMS(percentile(l, 99)), fmtMS(l[len(l)-1]))
	}
	if len(s.byWorker) > 0 {
		type served struct {
			worker string
			n      int
		}
		var ws []served
		for k, n := range s.byWorker {
			ws = append(ws, served{k, n})
		}
		sort.Slice(ws, func(i, j int) bool {
			if ws[i].n != ws[j].n {
				return ws[i].n > ws[j].n
			}
			return ws[i].worker < ws[j].worker
		})
		parts := make([]string, len(ws))
		for i, x := range ws {
			parts[i] = fmt.Sprintf("%s %d", shortPeer(x.worker), x.n)
		}
		fmt.Fprintf(w, "served by: %s\n", strings.Join(parts, ", "))
	}
}

// percentile returns the p-th percentile of sorted values (nearest rank).
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(float64(len(sorted))*p/100+0.999999) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}
