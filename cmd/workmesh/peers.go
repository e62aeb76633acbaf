package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
)

// peersTimeout bounds the request to the local API.
const peersTimeout = 5 * time.Second

// maxPeersResponse bounds the API answer read by `workmesh peers`.
const maxPeersResponse = 64 << 20

func newPeersCommand() *cobra.Command {
	var api, output string
	cmd := &cobra.Command{
		Use:   "peers",
		Short: "List the peers a running node knows",
		Long:  "peers asks a running node's local API for its peer table: every fresh peer with its work types,\nlabels, heads, load, sequence, when it was last refreshed and whether it is connected.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return usageError{fmt.Errorf("--output %q: want table or json", output)}
			}
			peers, err := fetchPeers(cmd.Context(), api)
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(peers)
			}
			return printPeerTable(cmd.OutOrStdout(), peers)
		},
	}
	cmd.Flags().StringVar(&api, "api", config.Defaults().Node.API, "address of the node's local HTTP API")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func fetchPeers(ctx context.Context, api string) ([]node.PeerView, error) {
	ctx, cancel := context.WithTimeout(ctx, peersTimeout)
	defer cancel()
	url := "http://" + api + "/v1/peers"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, usageError{fmt.Errorf("--api %q: %w", api, err)}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask the node at %s (is it running? see --api): %w", api, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPeersResponse))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	var peers []node.PeerView
	if err := json.Unmarshal(body, &peers); err != nil {
		return nil, fmt.Errorf("GET %s: decode answer: %w", url, err)
	}
	return peers, nil
}

func printPeerTable(w io.Writer, peers []node.PeerView) error {
	if len(peers) == 0 {
		_, err := fmt.Fprintln(w, "no peers known")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tCONNECTED\tWORK TYPES\tLABELS\tLOAD\tSEQUENCE\tLAST SEEN\tADDRS")
	for _, p := range peers {
		types := make([]string, 0, len(p.WorkTypes))
		for _, wt := range p.WorkTypes {
			if h, ok := p.Heads[wt]; ok {
				wt = fmt.Sprintf("%s@%d", wt, h)
			}
			types = append(types, wt)
		}
		sort.Strings(types)
		fmt.Fprintf(tw, "%s\t%t\t%s\t%s\t%d+%d/%d\t%d\t%s ago\t%s\n",
			p.ID, p.Connected, dash(strings.Join(types, ",")), dash(strings.Join(p.Labels, ",")),
			p.Load.InFlight, p.Load.Queued, p.Capacity.MaxConcurrent, p.Sequence,
			time.Since(p.LastSeen).Round(time.Second), dash(strings.Join(p.Addrs, ",")))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
