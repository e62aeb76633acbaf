package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/workmesh/workmesh/node/apiv1"
)

// Bounds of `workmesh peers --watch --interval`.
const (
	minWatchInterval = 250 * time.Millisecond
	maxWatchInterval = time.Hour
)

// peersOptions are the flags of `workmesh peers`.
type peersOptions struct {
	api      string
	output   string
	workType string
	wide     bool
	watch    bool
	interval time.Duration
}

func newPeersCommand() *cobra.Command {
	var o peersOptions
	cmd := &cobra.Command{
		Use:   "peers",
		Short: "List the peers a running node knows, as its dispatcher sees them",
		Long: "peers asks a running node's local API for every fresh peer: its liveness state (alive, unreachable,\n" +
			"probing; left for a peer that stopped gracefully: it withdrew its work types and disconnected), its rating score for each work type (\"unrated\" while it has too few samples and is\n" +
			"explored), labels, work types with their heads (type@head), load (running+queued/capacity), the\n" +
			"round-trip time of the node's last good health poll of it (\"-\" before one), and when its record was\n" +
			"last refreshed. --watch redraws the table every --interval until Ctrl-C; --output json or yaml\n" +
			"prints the same for scripts (with --watch, one JSON document per line or YAML documents).",
		Example: "  workmesh peers\n  workmesh peers --type sha256 --watch\n  workmesh peers --output json | jq '.[] | select(.state != \"alive\") | .id'",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(&o.output); err != nil {
				return err
			}
			if o.watch && (o.interval < minWatchInterval || o.interval > maxWatchInterval) {
				return usageError{fmt.Errorf("--interval %s: want %s to %s", o.interval, minWatchInterval, maxWatchInterval)}
			}
			o.api = resolveAPI(cmd, o.api)
			out := cmd.OutOrStdout()
			if !o.watch {
				peers, err := fetchPeerStatus(cmd.Context(), o.api)
				if err != nil {
					return err
				}
				return printPeers(out, o, peers, time.Now())
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return watchPeers(ctx, out, cmd.ErrOrStderr(), o)
		},
	}
	addAPIFlag(cmd, &o.api)
	f := cmd.Flags()
	f.StringVarP(&o.workType, "type", "t", "", "only peers serving this work type, with their score for it")
	f.BoolVar(&o.wide, "wide", false, "full peer IDs, addresses and versions")
	f.BoolVarP(&o.watch, "watch", "w", false, "redraw every --interval until Ctrl-C")
	f.DurationVar(&o.interval, "interval", 2*time.Second, fmt.Sprintf("time between redraws with --watch (%s to %s)", minWatchInterval, maxWatchInterval))
	addOutputFlag(cmd, &o.output, outputTable)
	cmd.RegisterFlagCompletionFunc("type", completeWorkTypes)
	return cmd
}

// fetchPeerStatus asks the node for its dispatcher's view of its peers; a
// node without that view answers with its peer table alone.
func fetchPeerStatus(ctx context.Context, api string) ([]apiv1.PeerStatus, error) {
	var peers []apiv1.PeerStatus
	err := apiGet(ctx, api, apiv1.PeerStatusPath, &peers)
	if errors.Is(err, errAPINotFound) {
		err = apiGet(ctx, api, "/v1/peers", &peers)
	}
	return peers, err
}

// watchPeers redraws the peers every interval until ctx ends. A node that
// cannot be reached is reported (on the table's screen, or on errOut for
// json and yaml) and asked again at the next tick.
func watchPeers(ctx context.Context, out, errOut io.Writer, o peersOptions) error {
	tty := isTerminal(out)
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	for first := true; ; first = false {
		peers, err := fetchPeerStatus(ctx, o.api)
		if ctx.Err() != nil {
			return nil
		}
		now := time.Now()
		switch {
		case o.output == outputJSON:
			if err != nil {
				fmt.Fprintf(errOut, "workmesh: %v\n", err)
				break
			}
			b, jerr := json.Marshal(peers)
			if jerr != nil {
				return fmt.Errorf("encode json: %w", jerr)
			}
			fmt.Fprintf(out, "%s\n", b)
		case o.output == outputYAML:
			if err != nil {
				fmt.Fprintf(errOut, "workmesh: %v\n", err)
				break
			}
			fmt.Fprintln(out, "---")
			if err := writeData(out, outputYAML, peers); err != nil {
				return err
			}
		default:
			if tty {
				fmt.Fprint(out, "\x1b[H\x1b[2J") // home, clear the screen
			} else if !first {
				fmt.Fprintln(out)
			}
			fmt.Fprintf(out, "every %s, %s (Ctrl-C stops)\n", o.interval, now.Format("15:04:05"))
			if err != nil {
				fmt.Fprintf(out, "%v; trying again\n", err)
				break
			}
			if err := printPeers(out, o, peers, now); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// printPeers prints the peers in o's format.
func printPeers(w io.Writer, o peersOptions, peers []apiv1.PeerStatus, now time.Time) error {
	if o.workType != "" {
		peers = slices.DeleteFunc(slices.Clone(peers), func(p apiv1.PeerStatus) bool { return !slices.Contains(p.WorkTypes, o.workType) })
	}
	if o.output != outputText {
		if peers == nil {
			peers = []apiv1.PeerStatus{}
		}
		return writeData(w, o.output, peers)
	}
	return printPeerTable(w, peers, o.workType, o.wide, now)
}

// printPeerTable prints one line per peer, with a headline counting them
// by state.
func printPeerTable(w io.Writer, peers []apiv1.PeerStatus, workType string, wide bool, now time.Time) error {
	if len(peers) == 0 {
		what := "no peers known"
		if workType != "" {
			what = "no known peer serves " + workType
		}
		_, err := fmt.Fprintln(w, what)
		return err
	}
	states := map[string]int{}
	for _, p := range peers {
		states[stateOf(p)]++
	}
	var parts []string
	for _, s := range []string{"alive", "probing", "unreachable", apiv1.StateLeft, "unknown"} {
		if states[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", states[s], s))
		}
	}
	noun := "peers"
	if len(peers) == 1 {
		noun = "peer"
	}
	fmt.Fprintf(w, "%d %s: %s\n", len(peers), noun, strings.Join(parts, ", "))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "PEER\tSTATE\tSCORE\tLABELS\tWORK TYPES\tLOAD\tRTT\tLAST SEEN\tCONN"
	if wide {
		header += "\tVERSION\tADDRS"
	}
	fmt.Fprintln(tw, header)
	for _, p := range peers {
		id := shortPeer(p.ID)
		if wide {
			id = p.ID
		}
		types := make([]string, 0, len(p.WorkTypes))
		for _, wt := range p.WorkTypes {
			if h, ok := p.Heads[wt]; ok {
				wt += "@" + strconv.FormatUint(h, 10)
			}
			types = append(types, wt)
		}
		sort.Strings(types)
		rtt := "-" // never polled, or polling is off
		switch {
		case p.PollError != "":
			rtt = "failed"
		case p.RTTMS != nil:
			rtt = fmtMS(*p.RTTMS)
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%d+%d/%d\t%s\t%s\t%s",
			id, stateOf(p), scoreOf(p, workType), dash(strings.Join(markDeclared(p.PeerView), ",")), dash(strings.Join(types, ",")),
			p.Load.InFlight, p.Load.Queued, p.Capacity.MaxConcurrent, rtt, ago(now, p.LastSeen), dash(p.Connection))
		if wide {
			line += fmt.Sprintf("\t%s\t%s", dash(p.Version), dash(strings.Join(p.Addrs, ",")))
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printReasons(w, peers, wide)
}

// printReasons prints, under the table, why each peer that is not alive
// is not: "…peerBBBB unreachable: stalled: 2 accepted work requests …".
func printReasons(w io.Writer, peers []apiv1.PeerStatus, wide bool) error {
	for _, p := range peers {
		if p.Reason == "" || p.State == "alive" {
			continue
		}
		id := shortPeer(p.ID)
		if wide {
			id = p.ID
		}
		if _, err := fmt.Fprintf(w, "%s %s: %s\n", id, stateOf(p), p.Reason); err != nil {
			return err
		}
	}
	return printDisputes(w, peers, wide)
}

// printDisputes prints, under the table, the peers whose results were
// outvoted by other workers or contradicted by an audit: "…peerBBBB
// disputes: 3".
func printDisputes(w io.Writer, peers []apiv1.PeerStatus, wide bool) error {
	for _, p := range peers {
		if p.Disputes == 0 {
			continue
		}
		id := shortPeer(p.ID)
		if wide {
			id = p.ID
		}
		if _, err := fmt.Fprintf(w, "%s disputes: %d (results outvoted by other workers or contradicted by an audit)\n", id, p.Disputes); err != nil {
			return err
		}
	}
	return nil
}

// stateOf names the peer's liveness state; "unknown" from a node that does
// not say.
func stateOf(p apiv1.PeerStatus) string {
	if p.State == "" {
		return "unknown"
	}
	return p.State
}

// scoreOf renders the peer's score: for workType alone when given; else
// one number when every type scores the same, or type=score for each.
func scoreOf(p apiv1.PeerStatus, workType string) string {
	one := func(s apiv1.TypeScore) string {
		if !s.Rated {
			return "unrated"
		}
		return strconv.FormatFloat(s.Score, 'f', 2, 64)
	}
	if len(p.Scores) == 0 {
		return "-"
	}
	if workType != "" {
		for _, s := range p.Scores {
			if s.WorkType == workType {
				return one(s)
			}
		}
		return "-"
	}
	same := true
	for _, s := range p.Scores[1:] {
		if one(s) != one(p.Scores[0]) {
			same = false
		}
	}
	if same {
		return one(p.Scores[0])
	}
	parts := make([]string, len(p.Scores))
	for i, s := range p.Scores {
		parts[i] = s.WorkType + "=" + one(s)
	}
	return strings.Join(parts, " ")
}

// ago renders the time since t, to the second.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := max(0, now.Sub(t)).Round(time.Second)
	return d.String() + " ago"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
