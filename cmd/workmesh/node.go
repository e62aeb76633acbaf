package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/workers/access"
	"github.com/workmesh/workmesh/workers/builtin"
	"github.com/workmesh/workmesh/workers/httpwork"
	"github.com/workmesh/workmesh/workers/jsonrpc"
)

// shutdownTimeout bounds a clean shutdown after SIGINT or SIGTERM.
const shutdownTimeout = 5 * time.Second

func newNodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run a workmesh node",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newNodeStartCommand())
	return cmd
}

func newNodeStartCommand() *cobra.Command {
	var configFile string
	cmd := &cobra.Command{
		Use:   "start",
		Short: "Join a network, serve work and the local API until interrupted",
		Long: "start joins the network through the --bootstrap peers (none: it starts a new network), advertises\n" +
			"this node's work types, labels, capacity and load, serves work for its peers, and takes work on the\n" +
			"local HTTP API (POST /v1/work, see `workmesh submit`), sending it to the best remote worker or its\n" +
			"own. It prints its peer ID, its addresses, the command another host joins it with and the API address,\n" +
			"then \"ready\"; a bootstrap peer that does not answer is logged with the cause until one does. One\n" +
			"node runs on a --data-dir at a time: a second one on a dir in use exits 2 naming the first one's pid.\n" +
			"SIGINT or SIGTERM stops it cleanly: it withdraws its work types, so that peers stop sending it work,\n" +
			"waits up to --drain-timeout for the work in progress, then stops. A second signal stops it at once.\n\n" +
			"Settings come from --config FILE, WORKMESH_<SETTING> variables and flags, flags winning; check them\n" +
			"first with `workmesh config validate`. Its API listens on --api (env WORKMESH_NODE_API): WORKMESH_API\n" +
			"is the client commands' target and does not move it. Every configuration error exits 2.\n\n" +
			"Words the flags use: an attempt is one try of a request on one worker; a retry is the next attempt\n" +
			"after one failed; a hedge is a second copy of a request sent to another worker while the first\n" +
			"still runs, for work types safe to run twice, the first answer winning; a spawn attempt is one\n" +
			"offer of a request to this node's own worker, repeated while it is busy; a head is the newest\n" +
			"block a chain upstream (jsonrpc) has, advertised so that a request naming a block goes to a\n" +
			"worker that has it; a label group is the peers carrying one label, tried in label-balancing order.",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{loadsSettings: "true"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(settingsOptions(cmd, configFile))
			if err != nil {
				return configError(err)
			}
			if err := takeTokenFile(cmd, &cfg); err != nil {
				return err
			}
			if err := checkStartable(cfg); err != nil {
				return err
			}
			log, err := newLogger(cfg.Node.LogLevel, cfg.Node.LogFormat)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			s, err := startStack(ctx, cfg, log)
			if errors.Is(err, node.ErrDataDirInUse) || errors.Is(err, node.ErrListen) || errors.Is(err, syscall.EADDRINUSE) {
				// Another node runs on this data dir, or another process
				// holds a port it is to listen on: how this one was
				// started is the problem, so it exits 2 as a usage error.
				return usageError{err}
			}
			if err != nil {
				return err
			}
			if cfg.Node.LogFormat == "json" {
				logStartup(log, s.Node())
			} else {
				printStartup(cmd.OutOrStdout(), s.Node())
			}

			<-ctx.Done()
			// From here a second SIGINT or SIGTERM ends the process at
			// once, the default action.
			stop()
			log.Info("shutting down")
			s.Drain(cfg.Node.DrainTimeout)
			return s.CloseWithin(shutdownTimeout)
		},
	}
	config.BindFlags(cmd.Flags())
	registerSettingCompletions(cmd)
	cmd.Flags().StringVar(&configFile, "config", "", "YAML file with settings (flags and WORKMESH_* variables override it)")
	addTokenFileFlag(cmd, "the bearer token the local API requires (instead of the api-token setting)")
	cmd.SetUsageFunc(groupedUsage(map[string]string{"config": "node", tokenFileFlag: "access"}))
	return cmd
}

// groupedUsage prints a command's usage with its flags under the groups
// config.FlagGroups names, in that order, so that its many settings read
// as short lists by topic; extra gives the group of the flags that are no
// setting. The flags of no group come last.
func groupedUsage(extra map[string]string) func(*cobra.Command) error {
	return func(c *cobra.Command) error {
		w := c.OutOrStderr()
		fmt.Fprintf(w, "Usage:\n  %s\n", c.UseLine())
		if c.HasExample() {
			fmt.Fprintf(w, "\nExamples:\n%s\n", c.Example)
		}
		sets := map[string]*pflag.FlagSet{}
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			g := config.GroupOfFlag(f.Name)
			if g == "" {
				g = extra[f.Name]
			}
			if sets[g] == nil {
				sets[g] = pflag.NewFlagSet(g, pflag.ContinueOnError)
			}
			sets[g].AddFlag(f)
		})
		const cols = 100
		for _, g := range config.FlagGroups {
			if fs := sets[g.Name]; fs != nil {
				fmt.Fprintf(w, "\n%s:\n%s", g.Title, fs.FlagUsagesWrapped(cols))
			}
		}
		if fs := sets[""]; fs != nil {
			fmt.Fprintf(w, "\nOther flags:\n%s", fs.FlagUsagesWrapped(cols))
		}
		if c.HasAvailableInheritedFlags() {
			fmt.Fprintf(w, "\nGlobal flags:\n%s", c.InheritedFlags().FlagUsagesWrapped(cols))
		}
		return nil
	}
}

// logStartup is printStartup for --log-format json, where stdout stays
// empty: one JSON log line on stderr, "ready", with the same facts as
// fields (peer_id, listen, join, api).
func logStartup(log *logrus.Logger, n *node.Node) {
	addrs := make([]string, 0, len(n.Addrs()))
	for _, a := range n.Addrs() {
		addrs = append(addrs, a.String())
	}
	log.WithFields(logrus.Fields{
		"peer_id": n.ID().String(), "listen": addrs, "join": n.JoinCommand(), "api": n.APIAddr(),
	}).Info("ready")
}

// printStartup prints who the node is, where it listens, the command
// another host joins it with (the addresses a peer can dial: interface
// addresses for 0.0.0.0 or ::, loopback only when there is nothing else)
// and where its API listens, then "ready". Tests and scripts read these
// lines.
func printStartup(w io.Writer, n *node.Node) {
	fmt.Fprintf(w, "peer id: %s\n", n.ID())
	for _, a := range n.Addrs() {
		fmt.Fprintf(w, "listening on: %s\n", a)
	}
	if join := n.JoinCommand(); join != "" {
		fmt.Fprintf(w, "join with: %s\n", join)
	}
	if api := n.APIAddr(); api != "" {
		fmt.Fprintf(w, "api: %s\n", api)
	}
	fmt.Fprintln(w, "ready")
}

// checkStartable checks what node start parses before anything starts,
// as `config validate` does too: the bootstrap and listen addresses and
// the work types. Every problem is named, each a usage error.
func checkStartable(cfg config.Config) error {
	var errs []error
	if _, err := node.ParseBootstrap(cfg.Node.Bootstrap); err != nil {
		errs = append(errs, err)
	}
	if _, err := node.ParseListen(cfg.Node.Listen); err != nil {
		errs = append(errs, err)
	}
	if _, err := builtin.NewRegistry(builtinTypes(cfg.Node.WorkTypes, cfg.CustomTypes)...); err != nil {
		errs = append(errs, fmt.Errorf("--work-types: %w", err))
	}
	// What the work types and access rules parse when they are built.
	if _, err := access.New(cfg.Access); err != nil {
		errs = append(errs, err)
	}
	if slices.Contains(cfg.Node.WorkTypes, httpwork.Type) {
		if h, err := httpwork.New(cfg.HTTP); err != nil {
			errs = append(errs, err)
		} else {
			h.Close()
		}
	}
	if err := jsonrpc.CheckChainID(cfg.JSONRPC.ChainID); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil
	}
	return usageError{errors.Join(errs...)}
}
