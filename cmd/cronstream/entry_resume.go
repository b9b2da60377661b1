package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
)

func init() { entryCommands = append(entryCommands, newEntryResumeCommand) }

func newEntryResumeCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var rev revisionFlag
	var bulk bulkFlags
	cmd := &cobra.Command{
		Use:   "resume [ID...] [--selector SEL] [--type GLOB] [--queue Q] [--owner O]",
		Short: "Let paused entries fire again",
		Long: `Resume paused entries: each fires from its next tick on (ticks that passed
while it was paused are not caught up). The pause note is cleared.

Name the entries by id, or select them as "entry ls" does (--selector,
--type, --queue, --owner; filters combine). ` + bulkHelp,
		Example: `  cronstream entry resume report
  cronstream entry resume --selector team=billing --yes`,
		Args: bulkArgs(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBulkWrite(cmd, g, &conn, &rev, &bulk, args, bulkWrite{
				verb: "resume", done: "resumed", unchanged: "not paused",
				needed: func(c events.Current) bool { return c.Entry.Paused },
				write: func(ctx context.Context, c *events.Client, id string, opts ...events.WriteOption) (events.Result, error) {
					return c.Resume(ctx, id, opts...)
				},
			})
		},
	}
	addJSONResult(cmd, g)
	rev.add(cmd)
	bulk.add(cmd)
	addConn(cmd, &conn, false)
	return cmd
}
