package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/node/authority"
)

func newNetworkPublishCommand() *cobra.Command {
	var api string
	cmd := &cobra.Command{
		Use:   "publish-revocation FILE",
		Short: "Publish a revocation through a running member: every member drops the peer at once",
		Long: "publish-revocation hands the revocation in FILE (from `workmesh network revoke`) to the node whose\n" +
			"local API --api names (POST /v1/revocations, with the API's token). That node checks it against\n" +
			"its network authority, drops the revoked peer at once and publishes the revocation on gossip,\n" +
			"where every member does the same and keeps it for the certificate's lifetime.",
		Example: "  workmesh network publish-revocation node.revocation --api 127.0.0.1:8080",
		Args:    cobra.ExactArgs(1),
		PreRunE: func(cmd *cobra.Command, _ []string) error { return loadTokenFile(cmd) },
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := readStatement(args[0])
			if err != nil {
				return usageError{fmt.Errorf("publish-revocation: %w", err)}
			}
			if !authority.IsRevocation(b) {
				return usageError{fmt.Errorf("publish-revocation: %s is not a revocation (see workmesh network inspect)", args[0])}
			}
			if _, err := authority.DecodeRevocation(b); err != nil {
				return usageError{fmt.Errorf("publish-revocation: %s: %w", args[0], err)}
			}
			ans, err := postRevocation(cmd.Context(), resolveAPI(cmd, api), b)
			if err != nil {
				return err
			}
			how := "published"
			if !ans.New {
				how = "published again (the node kept it already)"
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "revocation of %s %s\n", ans.Peer, how)
			return err
		},
	}
	addAPIFlag(cmd, &api)
	return cmd
}

// postRevocation sends a revocation to the API at api.
func postRevocation(ctx context.Context, api string, b []byte) (node.RevocationAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, clientTimeout)
	defer cancel()
	url, err := apiURL(api, node.RevocationsPath)
	if err != nil {
		return node.RevocationAnswer{}, err
	}
	body, err := json.Marshal(node.RevocationRequest{Revocation: b})
	if err != nil {
		return node.RevocationAnswer{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return node.RevocationAnswer{}, usageError{fmt.Errorf("--api %q: %w", api, err)}
	}
	req.Header.Set("Content-Type", "application/json")
	authorize(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return node.RevocationAnswer{}, unreachable(api, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxViewResponse))
	if err != nil {
		return node.RevocationAnswer{}, fmt.Errorf("read the answer of POST %s: %w", url, err)
	}
	if resp.StatusCode == http.StatusOK {
		var ans node.RevocationAnswer
		if err := json.Unmarshal(raw, &ans); err != nil {
			return ans, fmt.Errorf("POST %s: decode the answer: %w", url, err)
		}
		return ans, nil
	}
	msg := strings.TrimSpace(string(raw))
	var apiErr apiv1.Error
	if json.Unmarshal(raw, &apiErr) == nil && apiErr.Error != "" {
		msg = apiErr.Error
	}
	if resp.StatusCode == http.StatusNotFound {
		msg = "not served: the node has no network-authority (an open network has nothing to revoke)"
	}
	return node.RevocationAnswer{}, exitError{exitUnavailable, errors.New("POST " + url + ": " + resp.Status + ": " + msg)}
}

// markDeclared is a peer's labels as `peers` prints them: in a closed
// network the attested ones as they are, each self-declared one (which no
// group counts) followed by "(self-declared)".
func markDeclared(p apiv1.PeerView) []string {
	if p.AttestedLabels == nil && p.DeclaredLabels == nil {
		return p.Labels
	}
	out := slices.Clone(p.AttestedLabels)
	for _, l := range p.DeclaredLabels {
		out = append(out, l+"(self-declared)")
	}
	return out
}
