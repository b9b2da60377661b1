package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
)

func init() { entryCommands = append(entryCommands, newEntryRmCommand) }

func newEntryRmCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var rev revisionFlag
	var bulk bulkFlags
	cmd := &cobra.Command{
		Use:     "rm [ID...] [--selector SEL] [--type GLOB] [--queue Q] [--owner O]",
		Aliases: []string{"remove"},
		Short:   "Remove entries (their history stays in the stream)",
		Long: `Remove entries: replicas stop firing them at once. A removal is a config
event carrying the entry's last state, so "entry history" and "entry ls
--at" still show what it was. Putting the id again registers it anew,
firing from then on.

A tick that was due before the removal but that no replica had fired yet
(all replicas down, Redis failing) is not fired late: the audit log
records it as skipped with reason "removed".

Any id "entry ls" lists can be removed, also a quarantined one whose id
or last event cronstream would not write (junk from another publisher):
its removal names only the id.

Name the entries by id, or select them as "entry ls" does (--selector,
--type, --queue, --owner; filters combine). ` + bulkHelp,
		Example: `  cronstream entry rm report
  cronstream entry rm report --if-revision 14
  cronstream entry rm --owner team-gone --dry-run`,
		Args: bulkArgs(true),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBulkWrite(cmd, g, &conn, &rev, &bulk, args, bulkWrite{
				verb: "remove", done: "removed", unchanged: "already removed",
				write: func(ctx context.Context, c *events.Client, id string, opts ...events.WriteOption) (events.Result, error) {
					return c.Remove(ctx, id, opts...)
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

// writeResult is what rm, pause and resume print with --json.
type writeResult struct {
	ID       string `json:"id"`
	Result   string `json:"result"`
	Revision uint64 `json:"revision"`
}

// runEntryWrite runs one of the entry writes that take only an id (rm,
// pause, resume) and prints its outcome: "entry <id> <done> at revision N",
// or, when the write changed nothing, unchanged (a format of the id and the
// revision); with --json, a writeResult.
func runEntryWrite(cmd *cobra.Command, g *globalFlags, conn *connFlags, id, done, unchanged string,
	write func(ctx context.Context, c *events.Client) (events.Result, error)) error {
	ctx := cmd.Context()
	s, err := openStreamsSession(ctx, g, conn)
	if err != nil {
		return err
	}
	defer s.Close()
	res, err := write(ctx, s.client)
	if err != nil {
		return err
	}
	out := writeResult{ID: id, Result: done, Revision: res.Revision}
	if res.Type == "" {
		out.Result = "unchanged"
	}
	if g.json {
		return printJSON(cmd.OutOrStdout(), out)
	}
	if events.ValidateID(id) != nil {
		id = strconv.Quote(id) // junk rm removed: keep its bytes off the terminal
	}
	if res.Type == "" {
		fmt.Fprintf(cmd.OutOrStdout(), unchanged, id, res.Revision)
		return nil
	}
	fmt.Fprintf(cmd.OutOrStdout(), "entry %s %s at revision %d\n", id, done, res.Revision)
	return nil
}
