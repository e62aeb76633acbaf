package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/workmesh/workmesh/node/apiv1"
)

func newStatusCommand() *cobra.Command {
	var api, output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show a running node at a glance",
		Long: "status asks a running node's local API about itself: who it is, its peers (fresh, connected,\n" +
			"known) and their liveness, the requests it is dispatching now and how earlier ones ended, its\n" +
			"local worker's running and queued work, what it served for its peers, and the records it refused.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(&output); err != nil {
				return err
			}
			api = resolveAPI(cmd, api)
			var v apiv1.StatusView
			if err := apiGet(cmd.Context(), api, apiv1.StatusPath, &v); err != nil {
				return err
			}
			if output != "text" {
				return writeData(cmd.OutOrStdout(), output, v)
			}
			printStatus(cmd.OutOrStdout(), api, v)
			return nil
		},
	}
	addAPIFlag(cmd, &api)
	addOutputFlag(cmd, &output, outputText)
	return cmd
}

// printStatus prints the status as a few labelled lines.
func printStatus(w io.Writer, api string, v apiv1.StatusView) {
	fmt.Fprintf(w, "node:       %s (network %s, workmesh %s), up %s\n", v.PeerID, v.Network, v.Version,
		(time.Duration(v.UptimeS * float64(time.Second))).Round(time.Second))
	fmt.Fprintf(w, "api:        %s; work types %s; labels %s\n", api, dash(strings.Join(v.WorkTypes, ",")), dash(strings.Join(v.Labels, ",")))
	fmt.Fprintf(w, "addrs:      %s\n", dash(strings.Join(v.Addrs, " ")))
	fmt.Fprintf(w, "join with:  %s\n", dash(v.Join))
	fmt.Fprintf(w, "membership: %s\n", membershipText(v))
	if v.Reachability != "" {
		line := fmt.Sprintf("reachable:  %s", v.Reachability)
		if v.NAT != nil {
			line += fmt.Sprintf("; %d relay slots, hole punches %d of %d (%d failed, %d retries), %d work over relays",
				v.NAT.RelayReservations, v.NAT.HolePunchesSucceeded, v.NAT.HolePunchesTried, v.NAT.HolePunchesFailed,
				v.NAT.HolePunchRetries, v.NAT.RelayedWork)
		}
		fmt.Fprintln(w, line)
		fmt.Fprintf(w, "advertised: %s\n", dash(strings.Join(v.AdvertisedAddrs, " ")))
		fmt.Fprintf(w, "relay via:  %s\n", dash(strings.Join(v.RelayAddrs, " ")))
	}
	fmt.Fprintf(w, "peers:      %d fresh, %d connected, %d known\n", v.Peers.Fresh, v.Peers.Connected, v.Peers.Known)
	fmt.Fprintf(w, "liveness:   %d alive, %d unreachable, %d probing\n", v.Liveness.Alive, v.Liveness.Unreachable, v.Liveness.Probing)
	line := fmt.Sprintf("dispatch:   %d in flight", v.InFlight)
	if v.Requests != nil {
		line += fmt.Sprintf("; %d requests so far", v.Requests.Requests)
		counts := stringKeys(v.Requests.ByStatus)
		// The ones the API refused before dispatching (a bad body, one
		// too large) have no status: the counts add up with them.
		dispatched := uint64(0)
		for _, n := range counts {
			dispatched += n
		}
		if v.Requests.Requests > dispatched {
			counts["refused by the API"] = v.Requests.Requests - dispatched
		}
		if by := countsText(counts); by != "" {
			line += ": " + by
		}
	}
	fmt.Fprintln(w, line)
	fmt.Fprintf(w, "local:      %d running, %d queued (capacity %d at once, %d waiting)\n",
		v.Local.InFlight, v.Local.Queued, v.Local.MaxConcurrent, v.Local.QueueSize)
	fmt.Fprintf(w, "served:     %s\n", dash(countsText(v.Served)))
	fmt.Fprintf(w, "rejected:   %s\n", dash(countsText(v.Rejections)))
}

func stringKeys[K ~string](m map[K]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for k, n := range m {
		out[string(k)] = n
	}
	return out
}

// countsText renders the non-zero counts as "3 ok, 1 failed", largest
// first.
func countsText(m map[string]uint64) string {
	type kv struct {
		k string
		n uint64
	}
	var xs []kv
	for k, n := range m {
		if n > 0 {
			xs = append(xs, kv{k, n})
		}
	}
	sort.Slice(xs, func(i, j int) bool {
		if xs[i].n != xs[j].n {
			return xs[i].n > xs[j].n
		}
		return xs[i].k < xs[j].k
	})
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%d %s", x.n, x.k)
	}
	return strings.Join(parts, ", ")
}

// membershipText says who may join the node's network: anyone, unless a
// network authority is set.
func membershipText(v apiv1.StatusView) string {
	if v.NetworkAuthority == "" {
		return "open network: any peer may join"
	}
	return "closed network: members certified by authority " + v.NetworkAuthority
}
