package main

import (
	"fmt"

	"github.com/spf13/cobra"
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
			ctx := cmd.Context()
			s, err := openSession(g, &conn)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.requireStreams(ctx); err != nil {
				return err
			}
			res, err := s.client.Resume(ctx, args[0], rev.opts(cmd)...)
			if err != nil {
				return err
			}
			out := writeResult{ID: args[0], Result: "resumed", Revision: res.Revision}
			if res.Type == "" {
				out.Result = "unchanged"
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			if res.Type == "" {
				fmt.Fprintf(cmd.OutOrStdout(), "entry %s was not paused (revision %d)\n", args[0], res.Revision)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "entry %s resumed at revision %d\n", args[0], res.Revision)
			return nil
		},
	}
	cmd.Flags().BoolVar(&g.json, "json", false, "print the result as JSON")
	rev.add(cmd)
	addConn(cmd, &conn, false)
	return cmd
}
