package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
)

func init() { entryCommands = append(entryCommands, newEntryPauseCommand) }

func newEntryPauseCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var rev revisionFlag
	var bulk bulkFlags
	var note string
	cmd := &cobra.Command{
		Use:   "pause [ID...] [--selector SEL] [--type GLOB] [--queue Q] [--owner O]",
		Short: "Stop entries from firing until they are resumed",
		Long: `Pause entries: replicas stop firing them at once. Ticks that pass while an
entry is paused are not missed, just not fired (no catch-up on resume). A
tick that was due before the pause but that no replica had fired yet (all
replicas down, Redis failing) is not fired late: the audit log records it
as skipped with reason "paused". The optional note says why and shows in
"entry get" and the audit log. "sync" leaves a paused entry paused unless
its file says otherwise.

Name the entries by id, or select them as "entry ls" does (--selector,
--type, --queue, --owner; filters combine). ` + bulkHelp,
		Example: `  cronstream entry pause report --note "report db migration, ask #data"
  cronstream entry pause report invoices
  cronstream entry pause --selector 'team in (billing,ops),env!=dev' --note "freeze" --dry-run`,
		Args: bulkArgs(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBulkWrite(cmd, g, &conn, &rev, &bulk, args, bulkWrite{
				verb: "pause", done: "paused", unchanged: "already paused",
				needed: func(c events.Current) bool { return !c.Entry.Paused },
				write: func(ctx context.Context, c *events.Client, id string, opts ...events.WriteOption) (events.Result, error) {
					return c.Pause(ctx, id, note, opts...)
				},
			})
		},
	}
	cmd.Flags().StringVar(&note, "note", "", "why the entries are paused")
	addJSONResult(cmd, g)
	rev.add(cmd)
	bulk.add(cmd)
	addConn(cmd, &conn, false)
	return cmd
}
