package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/scheduler"
)

func init() { entryCommands = append(entryCommands, newEntryBackfillCommand) }

// backfillResult is what `entry backfill --json` prints.
type backfillResult struct {
	ID      string    `json:"id"`
	From    time.Time `json:"from"`
	To      time.Time `json:"to"`
	Ticks   int       `json:"ticks"`
	Fired   []string  `json:"fired"`
	Already int       `json:"already"`
}

func newEntryBackfillCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var from, to string
	cmd := &cobra.Command{
		Use:   "backfill ID --from TIME --to TIME",
		Short: "Fire the ticks of a past time range that never fired",
		Long: fmt.Sprintf(`Fire every tick of the entry's schedule in [--from, --to] that has no
fired event in the activity stream (the record of what fired), e.g. after
an outage longer than its catch-up window. Each tick becomes the task it
would have been (same task id), so a repeated backfill fires nothing twice
and a tick fired meanwhile is not fired again. The schedule's watermark
does not move. At most %d ticks per call. Needs Redis (--redis).

TIME is RFC 3339 (2025-03-01T09:00:00Z), a date (UTC), or relative (-6h).`, scheduler.MaxBackfill),
		Example: `  cronstream entry backfill report --from 2025-03-01T00:00:00Z --to 2025-03-03T00:00:00Z
  cronstream entry backfill cleanup --from -6h --to -1h`,
		Args: entryIDArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if from == "" || to == "" {
				return errors.New("backfill needs --from and --to")
			}
			now := time.Now()
			tFrom, err := parseTime("from", from, now)
			if err != nil {
				return err
			}
			tTo, err := parseTime("to", to, now)
			if err != nil {
				return err
			}
			m, st, done, err := manualFor(ctx, g, &conn, args[0])
			if err != nil {
				return err
			}
			defer done()
			res, err := m.Backfill(ctx, st, tFrom, tTo)
			if err != nil {
				return err
			}
			out := backfillResult{ID: args[0], From: tFrom.UTC(), To: tTo.UTC(), Ticks: res.Ticks, Fired: res.Fired, Already: res.Already}
			if out.Fired == nil {
				out.Fired = []string{}
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "backfill %s from %s to %s: %d ticks, %d fired now, %d had fired already\n",
				out.ID, fmtTime(out.From), fmtTime(out.To), out.Ticks, len(out.Fired), out.Already)
			for _, id := range out.Fired {
				fmt.Fprintf(w, "  %s\n", id)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "first time of the range (inclusive)")
	cmd.Flags().StringVar(&to, "to", "", "last time of the range (inclusive, not in the future)")
	cmd.Flags().BoolVar(&g.json, "json", false, "print the result as JSON")
	addConn(cmd, &conn, true)
	return cmd
}
