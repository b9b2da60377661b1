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
	var note string
	cmd := &cobra.Command{
		Use:   "pause ID",
		Short: "Stop an entry from firing until it is resumed",
		Long: `Pause an entry: replicas stop firing it at once. Ticks that pass while it
is paused are not missed, just not fired (no catch-up on resume). A tick
that was due before the pause but that no replica had fired yet (all
replicas down, Redis failing) is not fired late: the audit log records it
as skipped with reason "paused". The optional note says why and shows in
"entry get" and the audit log. "sync" leaves a paused entry paused unless
its file says otherwise.`,
		Example: `  cronstream entry pause report --note "report db migration, ask #data"`,
		Args:    entryIDArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runEntryWrite(cmd, g, &conn, args[0], "paused", "entry %s was already paused (revision %d)\n",
				func(ctx context.Context, c *events.Client) (events.Result, error) {
					return c.Pause(ctx, args[0], note, rev.opts(cmd)...)
				})
		},
	}
	cmd.Flags().StringVar(&note, "note", "", "why the entry is paused")
	cmd.Flags().BoolVar(&g.json, "json", false, "print the result as JSON")
	rev.add(cmd)
	addConn(cmd, &conn, false)
	return cmd
}
