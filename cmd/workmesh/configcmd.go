package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/workmesh/workmesh/config"
)

// hiddenValue replaces the value of a secret setting in `config print`.
const hiddenValue = "(set, hidden)"

// loadsSettings is the annotation of the commands that load settings with
// loadSettings: their WORKMESH_* variables are checked there, together
// with the file and the flags, rather than by the root command.
const loadsSettings = "workmesh/loads-settings"

// settingsOptions returns where the settings of cmd come from: file, its
// flags and the environment, checked against every work type this binary
// has. WORKMESH_API and WORKMESH_API_TOKEN are the client commands' own.
func settingsOptions(cmd *cobra.Command, file string) config.LoadOptions {
	return config.LoadOptions{
		File:           file,
		Flags:          cmd.Flags(),
		Environ:        os.Environ(),
		OtherEnv:       clientEnv,
		KnownWorkTypes: slices.Sorted(maps.Keys(knownTypes())),
		Membership:     checkMembership,
		Warn:           warnTo(cmd),
	}
}

// configError marks every error of loading settings as a usage error: a
// missing or unreadable file, YAML that does not parse, an unknown key or
// variable, a bad or out-of-bounds value all exit 2.
func configError(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Check and inspect the configuration",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newConfigPrintCommand(), newConfigValidateCommand())
	return cmd
}

func newConfigValidateCommand() *cobra.Command {
	var configFile string
	cmd := &cobra.Command{
		Use:   "validate [--config FILE] [setting flags]",
		Short: "Check the configuration as `node start` would, and name every problem",
		Long: "validate loads the settings exactly as `workmesh node start` would, from the same --config file,\n" +
			"WORKMESH_* variables and setting flags, and checks them all without starting anything. It exits 0\n" +
			"when they are good and 2 otherwise, printing every problem on a line of its own with the setting,\n" +
			"its value, what is wanted and where the value came from: file and line, env variable or flag.",
		Example:     "  workmesh config validate --config node.yaml\n  WORKMESH_MAX_RETRIES=3 workmesh config validate --config node.yaml --worker-timeout 750ms",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{loadsSettings: "true"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			settings, err := config.Explain(settingsOptions(cmd, configFile))
			if err != nil {
				return configError(err)
			}
			if err := checkAPI(cmd, configFile); err != nil {
				return err
			}
			set := map[config.Source]int{}
			for _, s := range settings {
				set[s.Source]++
			}
			from := "defaults only"
			if n := set[config.SourceFile] + set[config.SourceEnv] + set[config.SourceFlag]; n > 0 {
				from = fmt.Sprintf("%d from the file, %d from the environment, %d from flags",
					set[config.SourceFile], set[config.SourceEnv], set[config.SourceFlag])
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "config ok: %d settings, %s\n", len(settings), from)
			return err
		},
	}
	config.BindFlags(cmd.Flags())
	registerSettingCompletions(cmd)
	cmd.Flags().StringVar(&configFile, "config", "", "YAML file with settings, as for `node start`")
	cmd.MarkFlagFilename("config", "yaml", "yml")
	addTokenFileFlag(cmd, "the api-token, as node start would")
	return cmd
}

// checkAPI checks the API's address and token as node start would, with
// --api-token-file when given, and what node start parses before it
// starts anything (checkStartable).
func checkAPI(cmd *cobra.Command, configFile string) error {
	cfg, err := config.Load(settingsOptions(cmd, configFile))
	if err != nil {
		return configError(err)
	}
	if err := takeTokenFile(cmd, &cfg); err != nil {
		return err
	}
	return checkStartable(cfg)
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
			"(api-token) are shown only as set or not. Nothing is started. Settings that do not validate are\n" +
			"reported as by `workmesh config validate`, with exit code 2.",
		Example:     "  workmesh config print\n  WORKMESH_MAX_RETRIES=3 workmesh config print --config node.yaml --worker-timeout 750ms",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{loadsSettings: "true"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(&output); err != nil {
				return err
			}
			settings, err := config.Explain(settingsOptions(cmd, configFile))
			if err != nil {
				return configError(err)
			}
			if err := checkAPI(cmd, configFile); err != nil {
				return err
			}
			out := make([]configSetting, len(settings))
			for i, s := range settings {
				out[i] = configSetting{Key: s.Key, Value: s.Value, Source: string(s.Source)}
				if secret(s.Key) && s.Value != "" {
					out[i].Value = hiddenValue
				}
				if s.Key == "api-token" && tokenFrom(cmd.Context()) != "" {
					out[i].Value, out[i].Source = hiddenValue, string(config.SourceFlag)
				}
			}
			if output != outputText {
				return writeData(cmd.OutOrStdout(), output, out)
			}
			return printSettings(cmd.OutOrStdout(), out)
		},
	}
	config.BindFlags(cmd.Flags())
	addTokenFileFlag(cmd, "the api-token, as node start would")
	registerSettingCompletions(cmd)
	cmd.Flags().StringVar(&configFile, "config", "", "YAML file with settings, as for `node start`")
	addOutputFlag(cmd, &output, outputTable)
	cmd.MarkFlagFilename("config", "yaml", "yml")
	return cmd
}

// secret reports whether a setting's value must not be printed.
func secret(key string) bool {
	return strings.Contains(key, "token") || strings.Contains(key, "secret") || strings.Contains(key, "password") ||
		// A custom type's headers and env carry credentials.
		strings.HasPrefix(key, "custom-types.") && (strings.HasSuffix(key, ".headers") || strings.HasSuffix(key, ".env"))
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
