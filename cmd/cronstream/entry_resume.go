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
	cmd := &cobra.Command{
		Use:   "resume ID",
		Short: "Let a paused entry fire again",
		Long: `Resume a paused entry: it fires from its next tick on (ticks that passed
while it was paused are not caught up). The pause note is cleared.`,
		Example: `  cronstream entry resume report`,
		Args:    entryIDArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runEntryWrite(cmd, g, &conn, args[0], "resumed", "entry %s was not paused (revision %d)\n",
				func(ctx context.Context, c *events.Client) (events.Result, error) {
					return c.Resume(ctx, args[0], rev.opts(cmd)...)
				})
		},
	}
	cmd.Flags().BoolVar(&g.json, "json", false, "print the result as JSON")
	rev.add(cmd)
	addConn(cmd, &conn, false)
	return cmd
}
