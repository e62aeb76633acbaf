package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
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
	return 1
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "workmesh",
		Short:         "A peer-to-peer worker-dispatch node",
		Long:          "workmesh joins a libp2p network, advertises the work it can do, and sends submitted work\nto the best remote worker, or runs it on its own local worker when no remote can serve.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newVersionCommand())
	root.AddCommand(newNodeCommand(), newPeersCommand(), newSubmitCommand(), newPlanCommand(),
		newStatusCommand(), newConfigCommand(), newDevnetCommand())
	// cobra's completion command: `workmesh completion bash|zsh|fish|powershell`.
	root.CompletionOptions.HiddenDefaultCmd = false
	return root
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the workmesh version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "workmesh %s (%s)\n", version, goVersion())
			return err
		},
	}
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
