package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/workmesh/workmesh/config"
)

// hiddenValue replaces the value of a secret setting in `config print`.
const hiddenValue = "(set, hidden)"

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Inspect the configuration",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newConfigPrintCommand())
	return cmd
}

// configSetting is one line of `config print --output json|yaml`.
type configSetting struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Source string `json:"source"`
}

func newConfigPrintCommand() *cobra.Command {
	var configFile, output string
	cmd := &cobra.Command{
		Use:   "print [--config FILE] [setting flags]",
		Short: "Print the effective configuration and where each value came from",
		Long: "print loads the settings exactly as `workmesh node start` would, from the same --config file,\n" +
			"WORKMESH_* variables and setting flags, and prints every effective setting with its source:\n" +
			"default, file, env or flag (flags win over the environment, which wins over the file). Secrets\n" +
			"(api-token) are shown only as set or not. Nothing is started.",
		Example: "  workmesh config print\n  WORKMESH_MAX_RETRIES=3 workmesh config print --config node.yaml --worker-timeout 750ms",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "table", "json", "yaml"); err != nil {
				return err
			}
			settings, err := config.Explain(config.LoadOptions{File: configFile, Flags: cmd.Flags(), Environ: os.Environ()})
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, config.ErrInvalid) ||
					errors.Is(err, config.ErrUnknownSetting) || errors.Is(err, config.ErrBadValue) {
					return usageError{err}
				}
				return err
			}
			out := make([]configSetting, len(settings))
			for i, s := range settings {
				out[i] = configSetting{Key: s.Key, Value: s.Value, Source: string(s.Source)}
				if secret(s.Key) && s.Value != "" {
					out[i].Value = hiddenValue
				}
			}
			if output != "table" {
				return writeData(cmd.OutOrStdout(), output, out)
			}
			return printSettings(cmd.OutOrStdout(), out)
		},
	}
	config.BindFlags(cmd.Flags())
	cmd.Flags().StringVar(&configFile, "config", "", "YAML file with settings, as for `node start`")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	cmd.RegisterFlagCompletionFunc("output", completeOutputs("table", "json", "yaml"))
	cmd.MarkFlagFilename("config", "yaml", "yml")
	return cmd
}

// secret reports whether a setting's value must not be printed.
func secret(key string) bool {
	return strings.Contains(key, "token") || strings.Contains(key, "secret") || strings.Contains(key, "password")
}

// printSettings prints KEY VALUE SOURCE, one setting a line.
func printSettings(w io.Writer, settings []configSetting) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tVALUE\tSOURCE")
	for _, s := range settings {
		v := s.Value
		if v == "" {
			v = `""`
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Key, v, s.Source)
	}
	return tw.Flush()
}
