package main

import (
	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
)

func init() { subcommands = append(subcommands, newEntryCommand) }

// entryCommands is filled by the entry_*.go files, one per subcommand.
var entryCommands []func(*globalFlags) *cobra.Command

func newEntryCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "entry",
		Short: "Register, change, inspect and fire periodic entries",
		Long: `Manage periodic entries. Every change is a config event in the
<PREFIX>_CONFIG stream: replicas pick it up at once, and the stream keeps
every revision (see "entry history" and "entry ls --at").`,
		Example: `  cronstream entry put report --cron "0 9 * * *" --timezone Europe/Berlin --type report:daily
  cronstream entry ls
  cronstream entry pause report --note "migrating the report db"
  cronstream entry history report`,
		// Runnable, so a mistyped subcommand is an error rather than help
		// with exit status 0.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	for _, f := range entryCommands {
		cmd.AddCommand(f(g))
	}
	return cmd
}

// revisionFlag is --if-revision: a write that only succeeds on that
// revision of the entry.
type revisionFlag struct{ rev uint64 }

func (r *revisionFlag) add(cmd *cobra.Command) {
	cmd.Flags().Uint64Var(&r.rev, "if-revision", 0, "only write if the entry is at this revision (0: only if it does not exist)")
}

// opts returns the write options: IfRevision only when the flag was given.
func (r *revisionFlag) opts(cmd *cobra.Command) []events.WriteOption {
	if cmd.Flags().Changed("if-revision") {
		return []events.WriteOption{events.IfRevision(r.rev)}
	}
	return nil
}

// entryIDArg checks the entry id argument before anything connects.
func entryIDArg(cmd *cobra.Command, args []string) error {
	if err := cobra.ExactArgs(1)(cmd, args); err != nil {
		return err
	}
	return events.ValidateID(args[0])
}
