package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func init() { entryCommands = append(entryCommands, newEntryRmCommand) }

func newEntryRmCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var rev revisionFlag
	cmd := &cobra.Command{
		Use:     "rm ID",
		Aliases: []string{"remove"},
		Short:   "Remove an entry (its history stays in the stream)",
		Long: `Remove an entry: replicas stop firing it at once. The removal is a
config event carrying the entry's last state, so "entry history" and
"entry ls --at" still show what it was. Putting the id again registers it
anew.`,
		Example: `  cronstream entry rm report
  cronstream entry rm report --if-revision 14`,
		Args: entryIDArg,
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
			res, err := s.client.Remove(ctx, args[0], rev.opts(cmd)...)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), writeResult{ID: args[0], Result: "removed", Revision: res.Revision})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "entry %s removed at revision %d\n", args[0], res.Revision)
			return nil
		},
	}
	cmd.Flags().BoolVar(&g.json, "json", false, "print the result as JSON")
	rev.add(cmd)
	addConn(cmd, &conn, false)
	return cmd
}

// writeResult is what rm, pause and resume print with --json.
type writeResult struct {
	ID       string `json:"id"`
	Result   string `json:"result"`
	Revision uint64 `json:"revision"`
}
