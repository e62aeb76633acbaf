package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/dispatch"
)

// apiEnv names the environment variable that sets the default --api of the
// client commands.
const apiEnv = "WORKMESH_API"

// submitSlack is added to the request's timeout to bound the whole HTTP
// exchange: the node answers at the timeout at the latest.
const submitSlack = 5 * time.Second

// maxSubmitResponse bounds the API answer `workmesh submit` reads: a result
// of the largest payload in base64, plus the attempts.
var maxSubmitResponse = int64(2 * workers.WireLimit(config.MaxMaxPayload, config.MaxMaxPayload))

// Exit codes of `workmesh submit`, by how the work ended.
const (
	exitFailed      = 1 // the work failed
	exitUnavailable = 2 // no worker could take it (also bad usage)
	exitTimeout     = 3 // it timed out
)

// submitOptions are the flags of `workmesh submit`.
type submitOptions struct {
	api         string
	workType    string
	payload     string
	payloadFile string
	// payloadSet says --payload was given, even empty: an empty payload
	// is one, and stdin is not read for it.
	payloadSet bool
	timeout    time.Duration
	labels     []string
	minHead    uint64
	hasMinHead bool
	output     string
	explain    bool
	// Batches: file of JSON lines, at most concurrency at once.
	file        string
	concurrency int
	progress    string
	// verify is "agree/replicas" (--verify), "" for the type's default.
	verify string
}

func newSubmitCommand() *cobra.Command {
	var o submitOptions
	cmd := &cobra.Command{
		Use:   "submit --type TYPE [--payload P | --payload-file F | < stdin]",
		Short: "Submit work to a running node and print its result",
		Long: "submit sends one piece of work to a node's local API (POST /v1/work) and waits for its result.\n" +
			"The payload comes from --payload, --payload-file, or stdin when neither is given. With --output text\n" +
			"(the default) the result goes to stdout as it is, and a line on stderr says how the request ended,\n" +
			"which worker served it and every attempt; --output json prints the API's answer.\n\n" +
			"--explain first prints the plan the node would follow (see `workmesh plan`). A request that fell\n" +
			"back to the local worker or could not be placed always says why, counted by reason.\n\n" +
			"--file runs a batch: one JSON object a line, {\"type\", \"payload\" or \"payload_b64\", \"timeout\",\n" +
			"\"labels\", \"min_head\", \"verify\"} (--type, --labels, --timeout, --min-head and --verify fill what a line leaves out),\n" +
			"at most --concurrency at once. It writes one JSON result a line to stdout, with the line number,\n" +
			"shows progress on stderr (a bar with rate and ETA on a terminal, plain lines otherwise), and ends\n" +
			"with a summary: ok and failed, latency percentiles, and how many each worker served. A bad line is\n" +
			"reported with its number and does not stop the others.\n\n" +
			"Exit codes: 0 ok or empty, 1 the work failed, 2 bad usage or no worker could take the work\n" +
			"(or the API cannot be reached), 3 timed out. A batch exits 1 when any line did not succeed.",
		Example: "  workmesh submit --type sha256 --payload hello\n" +
			"  workmesh submit --type echo --payload-file input.bin --output json\n" +
			"  echo 250ms | workmesh submit --type sleep --timeout 2s --labels full\n" +
			"  workmesh submit --type sha256 --payload hello --explain\n" +
			"  workmesh submit --type sha256 --payload hello --verify 2/3\n" +
			"  workmesh submit --file requests.jsonl --concurrency 8 > results.jsonl",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("api") {
				if env := os.Getenv(apiEnv); env != "" {
					o.api = env
				}
			}
			o.hasMinHead = cmd.Flags().Changed("min-head")
			o.payloadSet = cmd.Flags().Changed("payload")
			for i := range o.labels { // "--labels 'a, b'" is a and b, as node start reads it
				o.labels[i] = strings.TrimSpace(o.labels[i])
			}
			if o.file != "" {
				for _, f := range []string{"explain", "payload", "payload-file"} {
					if cmd.Flags().Changed(f) {
						return usageError{fmt.Errorf("--%s does not go with --file: each line of the batch is a request of its own", f)}
					}
				}
				ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				return runBatch(ctx, o, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			return runSubmit(cmd.Context(), o, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.api, "api", config.Defaults().Node.API, "address of the node's local HTTP API (env "+apiEnv+")")
	f.StringVarP(&o.workType, "type", "t", "", "work type, e.g. echo, sha256 or sleep (required)")
	f.StringVarP(&o.payload, "payload", "p", "", "the payload, as text")
	f.StringVarP(&o.payloadFile, "payload-file", "f", "", "read the payload from this file (- for stdin)")
	f.DurationVar(&o.timeout, "timeout", 0, "bound on the whole request, e.g. 2s (0: the node's default, "+dispatch.DefaultRequestTimeout.String()+")")
	f.StringSliceVar(&o.labels, "labels", nil, "labels the worker must carry, remote or local (comma-separated)")
	f.Uint64Var(&o.minHead, "min-head", 0, "the position the request names, for work types with heads")
	f.StringVar(&o.verify, "verify", "", "ask for the result from several distinct workers, compared byte for byte: agree/replicas, e.g. 2/3 (deterministic work types only; empty: the type's default)")
	f.BoolVar(&o.explain, "explain", false, "print the plan the node would follow before sending the request")
	f.StringVar(&o.file, "file", "", "run a batch: a file of JSON requests, one a line (- for stdin)")
	f.IntVarP(&o.concurrency, "concurrency", "c", 4, fmt.Sprintf("batch: requests at once (1 to %d)", maxBatchConcurrency))
	f.StringVar(&o.progress, "progress", "auto", "batch progress on stderr: auto (a bar on a terminal, lines otherwise), bar, lines or off")
	addOutputFlag(cmd, &o.output, outputText)
	addTokenFileFlag(cmd, "the bearer token to send the node's API (instead of env "+apiTokenEnv+")")
	cmd.RegisterFlagCompletionFunc("progress", completeOutputs("auto", "bar", "lines", "off"))
	cmd.RegisterFlagCompletionFunc("type", completeWorkTypes)
	cmd.MarkFlagFilename("file", "jsonl", "json", "ndjson")
	cmd.MarkFlagFilename("payload-file")
	return cmd
}

// runSubmit checks the options, builds the request, sends it and prints
// the answer. The error it returns carries the exit code.
func runSubmit(ctx context.Context, o submitOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	if o.workType == "" {
		return usageError{errors.New("--type is required (e.g. --type sha256)")}
	}
	if err := checkOutput(&o.output); err != nil {
		return err
	}
	if o.timeout < 0 {
		return usageError{fmt.Errorf("--timeout %s: want a positive duration", o.timeout)}
	}
	vreq, err := verifyFlag(o.verify)
	if err != nil {
		return err
	}
	payload, err := readPayload(o, stdin, stderr)
	if err != nil {
		return err
	}
	if o.explain {
		var mh *uint64
		if o.hasMinHead {
			mh = &o.minHead
		}
		v, err := fetchPlan(ctx, o.api, o.workType, o.labels, mh)
		if err != nil {
			return err
		}
		printPlan(stderr, v)
	}
	req := apiv1.WorkRequest{Type: o.workType, Labels: o.labels}
	if utf8.Valid(payload) {
		s := string(payload)
		req.Payload = &s
	} else {
		s := base64.StdEncoding.EncodeToString(payload)
		req.PayloadB64 = &s
	}
	if o.timeout > 0 {
		req.Timeout = o.timeout.String()
	}
	if o.hasMinHead {
		req.MinHead = &o.minHead
	}
	req.Verify = vreq

	ans, err := postWork(ctx, o.api, req, o.timeout)
	if err != nil {
		return err
	}
	switch o.output {
	case outputYAML:
		var v any
		if err := json.Unmarshal(ans.raw, &v); err != nil {
			return fmt.Errorf("decode the answer: %w", err)
		}
		if err := writeData(stdout, outputYAML, v); err != nil {
			return err
		}
	case outputJSON:
		var pretty bytes.Buffer
		if json.Indent(&pretty, ans.raw, "", "  ") != nil {
			pretty.Reset()
			pretty.Write(ans.raw)
		}
		if !bytes.HasSuffix(pretty.Bytes(), []byte("\n")) {
			pretty.WriteByte('\n')
		}
		if _, err := stdout.Write(pretty.Bytes()); err != nil {
			return fmt.Errorf("write result: %w", err)
		}
	default:
		if ans.resp.Status == apiv1.StatusOK {
			if err := writeResult(stdout, ans.resp); err != nil {
				return err
			}
		}
	}
	if o.output == outputText {
		fmt.Fprintln(stderr, summarize(ans.resp, shortPeer))
	}
	return outcomeError(o.workType, ans.resp)
}

// readPayload returns the payload from --payload, --payload-file or stdin,
// at most what one request may carry.
func readPayload(o submitOptions, stdin io.Reader, stderr io.Writer) ([]byte, error) {
	limit := int64(config.MaxMaxPayload) // the node refuses what is over its own max-payload
	payloadSet := o.payloadSet || o.payload != ""
	switch {
	case payloadSet && o.payloadFile != "":
		return nil, usageError{errors.New("--payload and --payload-file: give one, not both")}
	case payloadSet:
		return []byte(o.payload), nil
	case o.payloadFile != "" && o.payloadFile != "-": // "-" is stdin, below
		f, err := os.Open(o.payloadFile)
		if err != nil {
			return nil, usageError{fmt.Errorf("--payload-file: %w", err)}
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, limit+1))
		if err != nil {
			// A directory, or a file that cannot be read: the command's
			// input is wrong, not the work.
			return nil, usageError{fmt.Errorf("--payload-file %s: %w", o.payloadFile, err)}
		}
		if int64(len(b)) > limit {
			return nil, usageError{fmt.Errorf("--payload-file %s: larger than %d bytes, the most a request may carry", o.payloadFile, limit)}
		}
		return b, nil
	}
	if isTerminal(stdin) {
		fmt.Fprintln(stderr, "reading the payload from stdin (end it with Ctrl-D; or use --payload)")
	}
	b, err := io.ReadAll(io.LimitReader(stdin, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read the payload from stdin: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, usageError{fmt.Errorf("stdin: more than %d bytes, the most a request may carry", limit)}
	}
	return b, nil
}

// isTerminal reports whether v (a reader or writer) looks like an
// interactive terminal: a character device other than /dev/null.
func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(st, null)
}

// workAnswer is the API's answer to one POST /v1/work.
type workAnswer struct {
	raw  []byte
	resp apiv1.WorkResponse
}

// postWork sends req to the work API at api and decodes the answer. A
// request the API refused, or an API that cannot be reached, is an error
// with exit code 2; the outcome of dispatched work is in the answer.
func postWork(ctx context.Context, api string, req apiv1.WorkRequest, timeout time.Duration) (workAnswer, error) {
	if timeout <= 0 {
		timeout = dispatch.DefaultRequestTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+submitSlack)
	defer cancel()
	body, err := json.Marshal(req)
	if err != nil {
		return workAnswer{}, fmt.Errorf("encode the request: %w", err)
	}
	url, err := apiURL(api, apiv1.WorkPath)
	if err != nil {
		return workAnswer{}, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return workAnswer{}, usageError{fmt.Errorf("--api %q: %w", api, err)}
	}
	hreq.Header.Set("Content-Type", "application/json")
	authorize(hreq)
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return workAnswer{}, exitError{exitTimeout, fmt.Errorf("the node at %s did not answer within %s: %w", api, timeout+submitSlack, err)}
		}
		return workAnswer{}, unreachable(api, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxSubmitResponse))
	if err != nil {
		return workAnswer{}, fmt.Errorf("read the answer of %s: %w", url, err)
	}
	ans := workAnswer{raw: raw}
	if err := json.Unmarshal(raw, &ans.resp); err == nil && ans.resp.Status != "" {
		return ans, nil
	}
	// Not a dispatched request: the API refused it.
	var apiErr apiv1.Error
	msg := strings.TrimSpace(string(raw))
	if json.Unmarshal(raw, &apiErr) == nil && apiErr.Error != "" {
		msg = apiErr.Error
	}
	err = fmt.Errorf("POST %s: %s: %s", url, resp.Status, msg)
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		err = fmt.Errorf("%w%.0w", err, errAPIUnusable) // no other request would pass
	}
	if resp.StatusCode >= 400 && resp.StatusCode < 500 {
		return workAnswer{}, exitError{exitUnavailable, err}
	}
	return workAnswer{}, exitError{exitFailed, err}
}

// writeResult writes the result as it is, adding a final newline to text
// that has none so that a shell prompt does not follow it on the line.
func writeResult(w io.Writer, r apiv1.WorkResponse) error {
	out := r.Output()
	if r.Result != nil && len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	if _, err := w.Write(out); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}

// outcomeError is nil for ok and empty, and otherwise the error that
// carries the status's exit code.
func outcomeError(workType string, r apiv1.WorkResponse) error {
	why := r.Error
	if why == "" {
		why = "no reason given"
	}
	switch r.Status {
	case apiv1.StatusOK, apiv1.StatusEmpty:
		return nil
	case apiv1.StatusFailed:
		return exitError{exitFailed, fmt.Errorf("%s work failed: %s%s", workType, why, detailText(r.FailureDetail))}
	case apiv1.StatusUnavailable:
		return exitError{exitUnavailable, fmt.Errorf("%s work unavailable: %s", workType, why)}
	case apiv1.StatusTimeout:
		return exitError{exitTimeout, fmt.Errorf("%s work timed out: %s", workType, why)}
	case apiv1.StatusDisputed:
		return exitError{exitFailed, fmt.Errorf("%s work disputed: %s", workType, why)}
	}
	return exitError{exitFailed, fmt.Errorf("%s work: unknown status %q: %s", workType, r.Status, why)}
}

// detailText is a failed custom run's exit code or HTTP status and its
// stderr or body, on lines of their own after the error, or "".
func detailText(d apiv1.FailureDetail) string {
	var b strings.Builder
	if d.ExitCode != nil {
		fmt.Fprintf(&b, "\nexit code: %d", *d.ExitCode)
	}
	if d.HTTPStatus != 0 {
		fmt.Fprintf(&b, "\nhttp status: %d", d.HTTPStatus)
	}
	if d.Stderr != "" {
		b.WriteString("\nstderr:\n" + d.Stderr)
	}
	if d.HTTPBody != "" {
		b.WriteString("\nbody:\n" + d.HTTPBody)
	}
	return b.String()
}

// summarize says in one line how a request ended: status, worker, every
// attempt with its outcome, duration and group, and the total time. name
// renders peer IDs.
func summarize(r apiv1.WorkResponse, name func(string) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", r.Status)
	if r.Worker != "" {
		fmt.Fprintf(&b, " by %s", name(r.Worker))
	}
	fmt.Fprintf(&b, " in %s", fmtMS(r.DurationMS))
	switch len(r.Attempts) {
	case 0:
		b.WriteString("; no attempts")
	case 1:
		b.WriteString("; 1 attempt: ")
	default:
		fmt.Fprintf(&b, "; %d attempts: ", len(r.Attempts))
	}
	for i, a := range r.Attempts {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s %s", name(a.Peer), a.Outcome, fmtMS(a.DurationMS))
		var tags []string
		if a.Group != "" {
			tags = append(tags, "group "+a.Group)
		}
		if a.Hedge {
			tags = append(tags, "hedge")
		}
		if len(tags) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(tags, ", "))
		}
		if a.Error != "" && a.Outcome != workers.Cancelled {
			fmt.Fprintf(&b, " [%s]", clip(a.Error, maxAttemptError))
		}
	}
	if r.Explanation != "" && (r.Status == apiv1.StatusOK || r.Status == apiv1.StatusEmpty) {
		fmt.Fprintf(&b, "; not remote because: %s", r.Explanation)
	}
	if v := r.Verify; v != nil && len(v.Agreed) > 0 {
		names := make([]string, len(v.Agreed))
		for i, a := range v.Agreed {
			names[i] = name(a)
		}
		fmt.Fprintf(&b, "; verified %d/%d: agreed by %s", v.Agree, v.Replicas, strings.Join(names, ", "))
	}
	return b.String()
}

// verifyFlag turns --verify's agree/replicas into the request's field;
// nil for "".
func verifyFlag(s string) (*apiv1.VerifyRequest, error) {
	if s == "" {
		return nil, nil
	}
	v, err := config.ParseVerify(s)
	if err != nil {
		return nil, usageError{fmt.Errorf("--%w", err)}
	}
	if !v.On() {
		return nil, nil
	}
	return &apiv1.VerifyRequest{Replicas: v.Replicas, Agree: v.Agree}, nil
}

// maxAttemptError bounds an attempt's error in the summary line.
const maxAttemptError = 100

// clip shortens s to at most n bytes, marking the cut, at the last space
// before it so that no word is cut in two; a first word longer than half
// of n is cut at a rune boundary rather than dropped.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if sp := strings.LastIndexByte(s[:cut+1], ' '); sp >= n/2 {
		return strings.TrimRight(s[:sp], " ,;:") + " …"
	}
	return s[:cut] + "…"
}

// fmtMS renders milliseconds as a rounded duration.
func fmtMS(ms float64) string {
	d := time.Duration(ms * float64(time.Millisecond))
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// shortPeer abbreviates a peer ID to its last eight characters, which is
// enough to tell the peers of one network apart; "local" stays as it is.
func shortPeer(id string) string {
	if len(id) <= 12 {
		return id
	}
	return "…" + id[len(id)-8:]
}
