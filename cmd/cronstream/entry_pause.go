package main

import (
	"fmt"

	"github.com/spf13/cobra"
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
is paused are not missed, just not fired (no catch-up on resume). The
optional note says why and shows in "entry get" and the audit log. "sync"
leaves a paused entry paused unless its file says otherwise.`,
		Example: `  cronstream entry pause report --note "report db migration, ask #data"`,
		Args:    entryIDArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := openSession(g, &conn)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.requireStreams(ctx); err != nil {
				return err
			}
			res, err := s.client.Pause(ctx, args[0], note, rev.opts(cmd)...)
			if err != nil {
				return err
			}
			out := writeResult{ID: args[0], Result: "paused", Revision: res.Revision}
			if res.Type == "" {
				out.Result = "unchanged"
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			if res.Type == "" {
				fmt.Fprintf(cmd.OutOrStdout(), "entry %s was already paused (revision %d)\n", args[0], res.Revision)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "entry %s paused at revision %d\n", args[0], res.Revision)
			return nil
		},
	}
	cmd.Flags().StringVar(&note, "note", "", "why the entry is paused")
	cmd.Flags().BoolVar(&g.json, "json", false, "print the result as JSON")
	rev.add(cmd)
	addConn(cmd, &conn, false)
	return cmd
}
