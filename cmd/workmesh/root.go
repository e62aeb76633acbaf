package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	"github.com/workmesh/workmesh/config"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// usageError marks an error caused by how the command was called; it exits 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// exitError carries the exit code a command chose for its outcome:
// `workmesh submit` exits 1 when the work failed, 2 when no worker could
// take it and 3 when it timed out.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// exitCode maps an error returned by a command to the process exit code.
func exitCode(err error) int {
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if strings.HasPrefix(err.Error(), "unknown command ") {
		return 2 // cobra's, for a command that does not exist
	}
	return 1
}

// usageArgs makes the argument checks of cmd and its subcommands usage
// errors (exit code 2): too many arguments, too few, a wrong one.
func usageArgs(cmd *cobra.Command) {
	if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if err := check(c, args); err != nil {
				return usageError{err}
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		usageArgs(sub)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "workmesh",
		Short: "A peer-to-peer worker-dispatch node",
		Long: "workmesh joins a libp2p network, advertises the work it can do, and sends submitted work\n" +
			"to the best remote worker, or runs it on its own local worker when no remote can serve.\n\n" +
			"Environment: WORKMESH_<SETTING> sets a setting of `node start` (`workmesh config print` lists\n" +
			"them; the node's API address is WORKMESH_NODE_API). The client commands talk to the API at\n" +
			"WORKMESH_API with the token WORKMESH_API_TOKEN. Every command refuses any other WORKMESH_*\n" +
			"variable, naming it, with exit code 2.",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := checkEnviron(cmd, args); err != nil {
				return err
			}
			return loadTokenFile(cmd)
		},
	}
	// `workmesh --version` prints the same line as `workmesh version`.
	root.SetVersionTemplate(versionLine() + "\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newVersionCommand())
	nodeCmd := newNodeCommand()
	nodeCmd.AddCommand(newNodeIDCommand())
	root.AddCommand(nodeCmd, newPeersCommand(), newSubmitCommand(), newPlanCommand(),
		newStatusCommand(), newConfigCommand(), newDevnetCommand(), newNetworkCommand())
	// cobra's completion command: `workmesh completion bash|zsh|fish|powershell`.
	root.CompletionOptions.HiddenDefaultCmd = false
	usageArgs(root)
	return root
}

// checkEnviron refuses a WORKMESH_* variable that is neither a setting nor
// a client variable, for every command but those that load settings (they
// report it with the other problems of their settings) and cobra's own
// help and completion.
func checkEnviron(cmd *cobra.Command, _ []string) error {
	if cmd.Annotations[loadsSettings] != "" {
		return nil
	}
	switch cmd.Name() {
	case "help", cobra.ShellCompRequestCmd, cobra.ShellCompNoDescRequestCmd:
		return nil
	}
	for c := cmd; c != nil; c = c.Parent() {
		if c.Name() == "completion" && c.Parent() == cmd.Root() {
			return nil
		}
	}
	return configError(config.CheckEnviron(os.Environ(), clientEnv...))
}

// versionInfo is what `workmesh version --output json|yaml` prints.
type versionInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"go_version"`
}

// versionLine is the one line `workmesh version` and `workmesh --version`
// print.
func versionLine() string { return fmt.Sprintf("workmesh %s (%s)", version, goVersion()) }

func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the workmesh version (also: workmesh --version)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(&output); err != nil {
				return err
			}
			if output != outputText {
				return writeData(cmd.OutOrStdout(), output, versionInfo{Version: version, GoVersion: goVersion()})
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			return err
		},
	}
	addOutputFlag(cmd, &output, outputText)
	return cmd
}

func goVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.GoVersion
	}
	return "unknown"
}

// newLogger returns a logrus logger writing to stderr at the given level and
// format (text or json).
func newLogger(level, format string) (*logrus.Logger, error) {
	log := logrus.New()
	log.SetOutput(os.Stderr)
	lvl, err := logrus.ParseLevel(level)
	if err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: want trace, debug, info, warn or error", level)}
	}
	log.SetLevel(lvl)
	switch format {
	case "text", "":
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	case "json":
		log.SetFormatter(&logrus.JSONFormatter{})
	default:
		return nil, usageError{fmt.Errorf("--log-format %q: want text or json", format)}
	}
	return log, nil
}
