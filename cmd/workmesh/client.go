package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/node/httpapi"
	"github.com/workmesh/workmesh/workers/builtin"
)

// apiTokenEnv names the environment variable whose value the client
// commands send as a bearer token: the node's api-token setting, which a
// node requires when its API listens on anything but loopback.
const apiTokenEnv = "WORKMESH_API_TOKEN"

// clientEnv are the WORKMESH_* variables the client commands read besides
// the settings: the API they talk to (WORKMESH_API, never the address a
// node listens on, which is WORKMESH_NODE_API) and its token. Every other
// WORKMESH_* variable that names no setting is refused by every command.
var clientEnv = []string{apiEnv, apiTokenEnv}

// clientTimeout bounds one request of the read-only client commands
// (peers, plan, status) to the local API.
const clientTimeout = 5 * time.Second

// maxViewResponse bounds an answer of the read-only API endpoints.
const maxViewResponse = 64 << 20

// addAPIFlag registers --api on a client command, and --api-token-file;
// resolveAPI fills --api from WORKMESH_API when the flag was not given.
func addAPIFlag(cmd *cobra.Command, api *string) {
	cmd.Flags().StringVar(api, "api", config.Defaults().Node.API, "address of the node's local HTTP API to talk to (env "+apiEnv+")")
	addTokenFileFlag(cmd, "the bearer token to send the node's API (instead of env "+apiTokenEnv+")")
}

// tokenFileFlag names the flag that reads the API token from a file, on
// the client commands (the token they send) and on node start (the token
// its API requires, as the api-token setting).
const tokenFileFlag = "api-token-file"

// addTokenFileFlag registers --api-token-file on cmd.
func addTokenFileFlag(cmd *cobra.Command, what string) {
	cmd.Flags().String(tokenFileFlag, "", "read "+what+" from this file: its first line, the trailing newline trimmed; "+
		"the file must not be readable or writable by group or others (chmod 600)")
	cmd.MarkFlagFilename(tokenFileFlag)
}

// readTokenFile returns the token in file: the file's content with
// trailing newlines and spaces trimmed. A file that group or others may
// read or write is refused, as ssh refuses such a key: a token others can
// read is no secret.
func readTokenFile(file string) (string, error) {
	st, err := os.Stat(file)
	if err != nil {
		return "", usageError{fmt.Errorf("--%s: %w", tokenFileFlag, err)}
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return "", usageError{fmt.Errorf("--%s %s: mode %04o lets group or others at the token; chmod 600 %s", tokenFileFlag, file, perm, file)}
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", usageError{fmt.Errorf("--%s: %w", tokenFileFlag, err)}
	}
	tok := strings.TrimRight(string(b), "\r\n \t")
	if tok == "" || strings.ContainsAny(tok, "\r\n") {
		return "", usageError{fmt.Errorf("--%s %s: want one line holding the token", tokenFileFlag, file)}
	}
	return tok, nil
}

// tokenKey is the context key of the token read from --api-token-file.
type tokenKey struct{}

// loadTokenFile reads --api-token-file, when cmd has it and it was given,
// into cmd's context, where authorize and node start find it.
func loadTokenFile(cmd *cobra.Command) error {
	f := cmd.Flags().Lookup(tokenFileFlag)
	if f == nil || !f.Changed {
		return nil
	}
	tok, err := readTokenFile(f.Value.String())
	if err != nil {
		return err
	}
	cmd.SetContext(context.WithValue(cmd.Context(), tokenKey{}, tok))
	return nil
}

// takeTokenFile sets cfg's api-token from --api-token-file, when it was
// given, and checks the API's exposure with the token it ends up with (as
// node start does before it listens): node start, config validate and
// config print apply the same rule.
func takeTokenFile(cmd *cobra.Command, cfg *config.Config) error {
	if tok := tokenFrom(cmd.Context()); tok != "" {
		if cfg.Access.APIToken != "" {
			return usageError{fmt.Errorf("--%s and the api-token setting: give one, not both", tokenFileFlag)}
		}
		cfg.Access.APIToken = tok
	}
	if err := httpapi.CheckExposure(cfg.Node.API, cfg.Access.APIToken); err != nil {
		return usageError{fmt.Errorf("config: %w", err)}
	}
	return nil
}

// tokenFrom returns the token --api-token-file gave, if any.
func tokenFrom(ctx context.Context) string {
	tok, _ := ctx.Value(tokenKey{}).(string)
	return tok
}

// resolveAPI returns --api, or WORKMESH_API when the flag was not given.
func resolveAPI(cmd *cobra.Command, api string) string {
	if !cmd.Flags().Changed("api") {
		if env := os.Getenv(apiEnv); env != "" {
			return env
		}
	}
	return api
}

// authorize adds the bearer token from --api-token-file (carried by the
// request's context) or else WORKMESH_API_TOKEN, when set.
func authorize(req *http.Request) {
	tok := tokenFrom(req.Context())
	if tok == "" {
		tok = os.Getenv(apiTokenEnv)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
}

// errAPIUnusable marks an answer that no other request to the same API
// would get past: the API cannot be reached, or it refuses the token. A
// batch stops at the first one.
var errAPIUnusable = errors.New("the node's API cannot be used")

// apiURL returns the URL of path on the node's API at api: host:port, or
// http://host:port as a browser would show it. Anything else (another
// scheme, a path, no port) is a usage error naming the flag, rather than
// an address made up from it and looked up.
func apiURL(api, path string) (string, error) {
	hostPort := strings.TrimSuffix(strings.TrimPrefix(api, "http://"), "/")
	host, port, err := net.SplitHostPort(hostPort)
	if err == nil && (host == "" || strings.ContainsAny(host, "/?#@")) {
		err = errors.New("no host")
	}
	if err == nil {
		if n, perr := strconv.Atoi(port); perr != nil || n < 1 || n > 65535 {
			err = fmt.Errorf("port %q is not a number from 1 to 65535", port)
		}
	}
	if err != nil {
		return "", usageError{fmt.Errorf("--api %q: want the node's API as host:port, such as 127.0.0.1:7400 (%v)", api, err)}
	}
	return "http://" + hostPort + path, nil
}

// errAPINotFound means the node does not serve the path asked for (an
// older node).
var errAPINotFound = errors.New("not served by this node")

// unreachable is the error of a request that found no API at api.
func unreachable(api string, err error) error {
	return exitError{exitUnavailable, fmt.Errorf("cannot reach the node's API at %s (is a node or devnet running? see --api or %s): %w%.0w", api, apiEnv, err, errAPIUnusable)}
}

// apiGet sends GET path to the API at api and decodes the JSON answer into
// out. An API that cannot be reached is an error with exit code 2, naming
// the address and how to pick another.
func apiGet(ctx context.Context, api, path string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, clientTimeout)
	defer cancel()
	url, err := apiURL(api, path)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return usageError{fmt.Errorf("--api %q: %w", api, err)}
	}
	authorize(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return unreachable(api, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxViewResponse))
	if err != nil {
		return fmt.Errorf("read the answer of GET %s: %w", url, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("GET %s: %w", url, errAPINotFound)
	}
	if resp.StatusCode != http.StatusOK {
		msg := strings.TrimSpace(string(body))
		var apiErr apiv1.Error
		if json.Unmarshal(body, &apiErr) == nil && apiErr.Error != "" {
			msg = apiErr.Error
		}
		err := fmt.Errorf("GET %s: %s: %s", url, resp.Status, msg)
		if resp.StatusCode >= 400 && resp.StatusCode < 500 {
			return exitError{exitUnavailable, err}
		}
		return err
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("GET %s: decode the answer: %w", url, err)
	}
	return nil
}

// Output formats of --output, the same set on every command that prints
// data. text is the human form (a table where the data is a list); table
// is accepted as its synonym, so `-o table` and `-o text` are one format.
const (
	outputText = "text"
	outputJSON = "json"
	outputYAML = "yaml"
	// outputTable is the synonym of outputText.
	outputTable = "table"
)

// outputFormats are the values --output completes to.
var outputFormats = []string{outputText, outputTable, outputJSON, outputYAML}

// addOutputFlag registers --output (-o) on cmd with the given default
// (text or table, as the command always had it), and its completion.
func addOutputFlag(cmd *cobra.Command, output *string, def string) {
	cmd.Flags().StringVarP(output, "output", "o", def, "output format: text (or its synonym table), json or yaml")
	cmd.RegisterFlagCompletionFunc("output", completeOutputs(outputFormats...))
}

// checkOutput refuses an --output value outside the common set and turns
// the synonym table into text, so that a command compares with outputText
// only.
func checkOutput(output *string) error {
	switch *output {
	case outputText, outputJSON, outputYAML:
		return nil
	case outputTable:
		*output = outputText
		return nil
	}
	return usageError{fmt.Errorf("--output %q: want text (or table), json or yaml", *output)}
}

// writeData writes v as indented JSON or as YAML with the same keys (the
// JSON field names), for scripts.
func writeData(w io.Writer, format string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", format, err)
	}
	if format == "yaml" {
		var generic any
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		if err := dec.Decode(&generic); err != nil {
			return fmt.Errorf("encode yaml: %w", err)
		}
		b, err = yaml.Marshal(yamlNumbers(generic))
		if err != nil {
			return fmt.Errorf("encode yaml: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// yamlNumbers turns json.Numbers back into numbers, so that YAML shows
// 12 and 0.5 rather than quoted strings.
func yamlNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = yamlNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = yamlNumbers(e)
		}
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		if f, err := x.Float64(); err == nil {
			return f
		}
		return x.String()
	}
	return v
}

// completeOutputs completes a flag with the given values.
func completeOutputs(formats ...string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return formats, cobra.ShellCompDirectiveNoFileComp
	}
}

// completionTimeout bounds completion's question to the node: a shell
// waits for the answer at every Tab.
const completionTimeout = 500 * time.Millisecond

// completeWorkTypes completes --type with the work types on offer where the
// command would send the request: those the node at --api (or
// WORKMESH_API) serves and its peers advertise, when it answers within
// completionTimeout; the built-in types otherwise.
func completeWorkTypes(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
	api, _ := cmd.Flags().GetString("api")
	api = resolveAPI(cmd, api)
	if loadTokenFile(cmd) != nil {
		return builtin.Types(), cobra.ShellCompDirectiveNoFileComp
	}
	// apiGet's own clientTimeout is longer: the shorter bound wins.
	ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
	defer cancel()
	set := map[string]bool{}
	var info apiv1.InfoView
	if err := apiGet(ctx, api, "/v1/info", &info); err == nil {
		for _, wt := range info.WorkTypes {
			set[wt] = true
		}
		var peers []apiv1.PeerView
		if apiGet(ctx, api, "/v1/peers", &peers) == nil {
			for _, p := range peers {
				for _, wt := range p.WorkTypes {
					set[wt] = true
				}
			}
		}
	}
	if len(set) == 0 {
		return builtin.Types(), cobra.ShellCompDirectiveNoFileComp
	}
	return slices.Sorted(maps.Keys(set)), cobra.ShellCompDirectiveNoFileComp
}

// settingValues are the values of the settings that take one of a few,
// for completion.
var settingValues = map[string][]string{
	"selection-mode":   {config.ModeRating, config.ModeRoundRobin, config.ModeRandom},
	"accept-work-from": {config.AcceptAny, config.AcceptAllowlist},
	"log-level":        {"trace", "debug", "info", "warn", "error"},
	"log-format":       {"text", "json"},
}

// registerSettingCompletions completes the setting flags of cmd (bound by
// config.BindFlags) that take one of a few values, and --work-types with
// every work type this binary has.
func registerSettingCompletions(cmd *cobra.Command) {
	for flag, values := range settingValues {
		if cmd.Flags().Lookup(flag) != nil {
			cmd.RegisterFlagCompletionFunc(flag, completeOutputs(values...))
		}
	}
	if cmd.Flags().Lookup("work-types") != nil {
		cmd.RegisterFlagCompletionFunc("work-types", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return slices.Sorted(maps.Keys(knownTypes())), cobra.ShellCompDirectiveNoFileComp
		})
	}
}
