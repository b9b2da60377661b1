package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/projector"
)

func init() { entryCommands = append(entryCommands, newEntryLsCommand) }

func newEntryLsCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var at string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List entries, now or as they were at any moment",
		Long: `List every registered entry: state (active, paused, or quarantined when
its last config event cannot be applied), spec, queue, revision and next
fire.

--at replays the config stream up to a moment and lists the entries exactly
as they were then (the fold of every config event stored up to that time,
by the stream's own timestamps). NEXT FIRE is then the next fire after that
moment.`,
		Example: `  cronstream entry ls
  cronstream entry ls --at -2h
  cronstream entry ls --at 2025-03-01T09:00:00Z --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			now := time.Now()
			var asOf time.Time
			if at != "" {
				t, err := parseTime("at", at, now)
				if err != nil {
					return err
				}
				asOf = t
			}
			s, err := openSession(g, &conn)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.requireStreams(ctx); err != nil {
				return err
			}
			var views []entryView
			if asOf.IsZero() {
				cur, err := s.client.List(ctx)
				if err != nil {
					return err
				}
				for _, c := range cur {
					if c.Err != nil {
						views = append(views, entryView{Entry: events.Entry{ID: c.ID}, Revision: c.Revision, State: stateQuarantined, Error: c.Err.Error()})
						continue
					}
					views = append(views, newEntryView(c.Entry, c.Revision, c.Time, now))
				}
			} else {
				if asOf.After(now) {
					return fmt.Errorf("--at %s is in the future", fmtTime(asOf))
				}
				m, quarantined, err := projector.AsOfTime(ctx, s.js, s.names, asOf)
				if err != nil {
					return fmt.Errorf("replay the config stream to %s: %w", fmtTime(asOf), err)
				}
				for _, st := range m {
					views = append(views, newEntryView(st.Entry, st.Revision, st.Time, asOf))
				}
				for _, q := range quarantined {
					t := q.Time.UTC()
					views = append(views, entryView{Entry: events.Entry{ID: q.ID}, Revision: q.Seq, Updated: &t, State: stateQuarantined, Error: q.Reason})
				}
				slices.SortFunc(views, func(a, b entryView) int { return strings.Compare(a.ID, b.ID) })
			}
			if g.json {
				if views == nil {
					views = []entryView{}
				}
				return printJSON(cmd.OutOrStdout(), views)
			}
			if len(views) == 0 {
				if asOf.IsZero() {
					fmt.Fprintln(cmd.OutOrStdout(), "no entries")
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "no entries at %s\n", fmtTime(asOf))
				}
				return nil
			}
			return printEntryTable(cmd.OutOrStdout(), views)
		},
	}
	cmd.Flags().StringVar(&at, "at", "", "list the entries as they were at this time: RFC 3339, or relative (-2h, -30m)")
	cmd.Flags().BoolVar(&g.json, "json", false, "print the entries as a JSON array")
	addConn(cmd, &conn, false)
	return cmd
}
