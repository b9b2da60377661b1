package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
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
	// SkippedUnique: ticks not fired because asynq's unique lock was held.
	SkippedUnique int `json:"skipped_unique"`
	// Registered is when the entry was (last) registered;
	// BeforeRegistration counts the ticks of the range before it, fired as
	// asked.
	Registered         time.Time `json:"registered"`
	BeforeRegistration int       `json:"before_registration"`
	// HistoryFrom is set when the range starts before the activity
	// stream's retention: ticks before it have no fired event left to be
	// checked against.
	HistoryFrom *time.Time `json:"history_from,omitempty"`
	// Error is set when some ticks were refused (the command then exits
	// non-zero).
	Error string `json:"error,omitempty"`
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
does not move. The activity stream keeps events for its max age
(--activity-max-age of the streams, default 30 days): ticks older than
that cannot be checked against history, so they are fired unless Redis
still holds their task, and the output says so. At most %d ticks per call. Needs Redis (--redis).

A range that reaches before the entry was registered (or re-registered
after a removal) is fired as asked: those ticks become tasks like the
others, and the output says how many of them there were.

A tick the queue refuses (a replica fired from a configuration newer than
the one read here, or the entry moved to another queue meanwhile) is tried
again on the current configuration, twice at most. Ticks still refused are
not fired and not counted as fired already: the command prints what it did
and exits non-zero with the reason.

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
			res, ferr := m.Backfill(ctx, st, tFrom, tTo)
			if ferr != nil && !errors.Is(ferr, scheduler.ErrRefused) {
				return ferr
			}
			out := backfillResult{ID: args[0], From: tFrom.UTC(), To: tTo.UTC(), Ticks: res.Ticks, Fired: res.Fired, Already: res.Already,
				SkippedUnique: res.SkippedUnique, Registered: res.Registered.UTC(), BeforeRegistration: res.BeforeRegistration}
			if out.Fired == nil {
				out.Fired = []string{}
			}
			if ferr != nil {
				out.Error = ferr.Error()
			}
			maxAge, err := events.ActivityMaxAge(ctx, m.JS, m.Names)
			if err != nil {
				return fmt.Errorf("read the activity retention: %w", err)
			}
			if cutoff := now.Add(-maxAge).UTC(); maxAge > 0 && tFrom.Before(cutoff) {
				out.HistoryFrom = &cutoff
			}
			if g.json {
				if err := printJSON(cmd.OutOrStdout(), out); err != nil {
					return err
				}
				return ferr
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "backfill %s from %s to %s: %d ticks, %d fired now, %d had fired already\n",
				out.ID, fmtTime(out.From), fmtTime(out.To), out.Ticks, len(out.Fired), out.Already)
			if out.SkippedUnique > 0 {
				fmt.Fprintf(w, "%d ticks skipped: their unique lock was held by another task\n", out.SkippedUnique)
			}
			if out.BeforeRegistration > 0 {
				fmt.Fprintf(w, "note: %d of these ticks are before entry %s was registered (%s); a backfill fires them as asked, like the others\n",
					out.BeforeRegistration, out.ID, fmtTime(out.Registered))
			}
			if out.HistoryFrom != nil {
				fmt.Fprintf(w, "warning: ticks before %s are older than the activity stream's retention (%s): they cannot be checked against history, so they were fired unless Redis still held their task\n",
					fmtTime(*out.HistoryFrom), maxAge)
			}
			for _, id := range out.Fired {
				fmt.Fprintf(w, "  %s\n", id)
			}
			return ferr
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "first time of the range (inclusive)")
	cmd.Flags().StringVar(&to, "to", "", "last time of the range (inclusive, not in the future)")
	cmd.Flags().BoolVar(&g.json, "json", false, "print the result as JSON")
	addConn(cmd, &conn, true)
	return cmd
}
