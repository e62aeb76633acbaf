package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/workmesh/workmesh/node/apiv1"
)

// planOptions are the flags of `workmesh plan`.
type planOptions struct {
	api        string
	workType   string
	labels     []string
	minHead    uint64
	hasMinHead bool
	output     string
}

func newPlanCommand() *cobra.Command {
	var o planOptions
	cmd := &cobra.Command{
		Use:   "plan --type TYPE [--labels L] [--min-head N]",
		Short: "Show where a request would go, without sending it",
		Long: "plan asks a running node how it would dispatch a request now: the priority groups in order with\n" +
			"their members in rated order, the peers it would try one after another if each failed (within\n" +
			"max-remote-workers and max-retries), every candidate it may not try with the reason, the counts\n" +
			"by reason, and whether its local worker would run the request last. Nothing is sent.\n\n" +
			"Exit codes: 0 the request could be placed, 2 no worker could take it (the counts say why) or the\n" +
			"API cannot be reached.",
		Example: "  workmesh plan --type sha256\n  workmesh plan --type sha256 --labels archive --output json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.workType == "" {
				return usageError{errors.New("--type is required (e.g. --type sha256)")}
			}
			if err := checkOutput(&o.output); err != nil {
				return err
			}
			o.api = resolveAPI(cmd, o.api)
			o.hasMinHead = cmd.Flags().Changed("min-head")
			var mh *uint64
			if o.hasMinHead {
				mh = &o.minHead
			}
			v, err := fetchPlan(cmd.Context(), o.api, o.workType, o.labels, mh)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if o.output != "text" {
				if err := writeData(out, o.output, v); err != nil {
					return err
				}
			} else {
				printPlan(out, v)
			}
			if len(v.Order) == 0 && !v.Fallback {
				why := v.Explanation
				if v.FallbackNote != "" {
					why += "; " + v.FallbackNote
				}
				return exitError{exitUnavailable, fmt.Errorf("no worker could take %s work: %s", v.WorkType, why)}
			}
			return nil
		},
	}
	addAPIFlag(cmd, &o.api)
	f := cmd.Flags()
	f.StringVarP(&o.workType, "type", "t", "", "work type, e.g. echo, sha256 or sleep (required)")
	f.StringSliceVar(&o.labels, "labels", nil, "labels the worker must carry, remote or local (comma-separated)")
	f.Uint64Var(&o.minHead, "min-head", 0, "the position the request names, for work types with heads")
	addOutputFlag(cmd, &o.output, outputText)
	cmd.RegisterFlagCompletionFunc("type", completeWorkTypes)
	return cmd
}

// fetchPlan asks the node for the plan of a request.
func fetchPlan(ctx context.Context, api, workType string, labels []string, minHead *uint64) (apiv1.PlanView, error) {
	q := url.Values{"type": {workType}}
	if len(labels) > 0 {
		q.Set("labels", strings.Join(labels, ","))
	}
	if minHead != nil {
		q.Set("min_head", strconv.FormatUint(*minHead, 10))
	}
	var v apiv1.PlanView
	err := apiGet(ctx, api, apiv1.PlanPath+"?"+q.Encode(), &v)
	if errors.Is(err, errAPINotFound) {
		err = fmt.Errorf("%w: the node runs a workmesh without plans (GET %s)", err, apiv1.PlanPath)
	}
	return v, err
}

// printPlan prints a plan as a user reads it: a headline, the groups with
// their members in order, the order of attempts, the excluded candidates,
// and the counts.
func printPlan(w io.Writer, v apiv1.PlanView) {
	head := fmt.Sprintf("plan for %s", v.WorkType)
	var cons []string
	if len(v.Labels) > 0 {
		cons = append(cons, "labels "+strings.Join(v.Labels, ","))
	}
	if v.MinHead != nil {
		cons = append(cons, fmt.Sprintf("min-head %d", *v.MinHead))
	}
	if len(cons) > 0 {
		head += " (" + strings.Join(cons, ", ") + ")"
	}
	head += ": selection " + v.Mode
	if len(v.LabelOrder) > 0 {
		order := strings.Join(v.LabelOrder, " > ")
		if v.IncludeDefault {
			order += " > unlabelled"
		}
		head += ", groups " + order
		if v.PassOnError {
			head += ", pass-on-error"
		}
	}
	fmt.Fprintln(w, head)
	if v.BeyondHead {
		fmt.Fprintf(w, "beyond every head: one attempt on the best candidate, whose empty answer is final\n")
	}

	if v.Candidates > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  GROUP\t#\tPEER\tSTATE\tSCORE")
		for _, g := range v.Groups {
			name := g.Label
			switch {
			case g.Default:
				name = "unlabelled"
			case name == "":
				name = "all"
			}
			if len(g.Peers) == 0 {
				fmt.Fprintf(tw, "  %s\t-\t(no peers)\n", name)
			}
			for i, p := range g.Peers {
				score := "unrated"
				if p.Rated {
					score = strconv.FormatFloat(p.Score, 'f', 2, 64)
				}
				line := fmt.Sprintf("  %s\t%d\t%s\t%s\t%s", name, i+1, shortPeer(p.Peer), p.State, score)
				if p.Excluded != "" {
					line += "\texcluded: " + reasonText(p.Excluded, p.Detail)
				}
				fmt.Fprintln(tw, line)
			}
		}
		tw.Flush()
	}

	var order []string
	for _, p := range v.Order {
		s := shortPeer(p.Peer)
		if p.Group != "" {
			s += " (" + p.Group + ")"
		}
		order = append(order, s)
	}
	switch {
	case len(order) > 0 && v.Fallback:
		fmt.Fprintf(w, "would try: %s, then the local worker\n", strings.Join(order, ", "))
	case len(order) > 0:
		fmt.Fprintf(w, "would try: %s; no local fallback (%s)\n", strings.Join(order, ", "), v.FallbackNote)
	case v.Fallback:
		fmt.Fprintln(w, "would try: no remote peer; the local worker runs it")
	default:
		fmt.Fprintf(w, "would try: nothing: no remote peer, and %s\n", v.FallbackNote)
	}
	fmt.Fprintf(w, "  limits: max-remote-workers %d, max-retries %d", v.Limits.MaxRemoteWorkers, v.Limits.MaxRetries)
	if v.Limits.HedgeMaxCount > 0 {
		fmt.Fprintf(w, ", hedges %d", v.Limits.HedgeMaxCount)
		if v.Limits.HedgeDelayMeasured {
			fmt.Fprintf(w, " after %gms (measured)", v.Limits.HedgeDelayMS)
		} else {
			fmt.Fprintf(w, " after %gms (hedge-delay)", v.Limits.HedgeDelayMS)
		}
	}
	fmt.Fprintln(w)
	if len(v.Excluded) > 0 {
		parts := make([]string, len(v.Excluded))
		for i, x := range v.Excluded {
			parts[i] = shortPeer(x.Peer) + " " + reasonText(x.Reason, x.Detail)
		}
		fmt.Fprintf(w, "excluded: %s\n", strings.Join(parts, "; "))
	}
	fmt.Fprintf(w, "counts: %s\n", v.Explanation)
}

// reasonText renders an exclusion reason with its detail.
func reasonText(reason, detail string) string {
	switch {
	case detail == "":
		return reason
	case reason == "head below":
		return "head below " + detail
	}
	return reason + " " + detail
}
