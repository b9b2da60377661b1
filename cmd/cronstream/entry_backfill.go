package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/scheduler"
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

// backfillPlanJSON is what `entry backfill --dry-run --json` prints.
type backfillPlanJSON struct {
	ID                 string      `json:"id"`
	From               time.Time   `json:"from"`
	To                 time.Time   `json:"to"`
	Ticks              int         `json:"ticks"`
	Already            int         `json:"already"`
	Todo               []time.Time `json:"would_fire"`
	Registered         time.Time   `json:"registered"`
	BeforeRegistration int         `json:"before_registration"`
}

func newEntryBackfillCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var from, to string
	var guard guardFlags
	var beforeRegistration bool
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
after a removal) is refused unless --before-registration says to fire
those ticks too: they are ticks the entry never had.

The ticks to fire are shown first and asked about on a terminal ([y/N]);
--yes fires without asking, --dry-run only shows. Without a terminal, more
than --max-changes (default 50) ticks are refused unless --yes.

A tick the queue refuses (a replica fired from a configuration newer than
the one read here, or the entry moved to another queue meanwhile) is tried
again on the current configuration, twice at most. Ticks still refused are
not fired and not counted as fired already: the command prints what it did
and exits non-zero with the reason.

TIME is RFC 3339 (2025-03-01T09:00:00Z), a date (UTC), or relative (-6h).`, scheduler.MaxBackfill),
		Example: `  cronstream entry backfill report --from 2025-03-01T00:00:00Z --to 2025-03-03T00:00:00Z
  cronstream entry backfill cleanup --from -6h --to -1h --dry-run
  cronstream entry backfill cleanup --from -6h --to -1h --yes`,
		Args: entryIDArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if from == "" || to == "" {
				return usagef("backfill needs --from and --to")
			}
			now := time.Now()
			tFrom, err := parseTime("from", from, now)
			if err != nil {
				return usageError{err}
			}
			tTo, err := parseTime("to", to, now)
			if err != nil {
				return usageError{err}
			}
			if tTo.Before(tFrom) {
				return usagef("--to %s is before --from %s", fmtTime(tTo), fmtTime(tFrom))
			}
			m, st, done, err := manualFor(ctx, g, &conn, args[0])
			if err != nil {
				return err
			}
			defer done()
			plan, err := m.PlanBackfill(ctx, st, tFrom, tTo)
			if errors.Is(err, scheduler.ErrBadRange) || errors.Is(err, scheduler.ErrTooManyTicks) {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			if plan.BeforeRegistration > 0 && !beforeRegistration {
				return usagef("%d of the range's %d ticks are before entry %s was registered (%s): ticks it never had. Pass --before-registration to fire them too, or start --from at %s",
					plan.BeforeRegistration, plan.Ticks, args[0], fmtTime(plan.Registered), plan.Registered.UTC().Format(time.RFC3339))
			}
			if guard.dryRun && g.json {
				out := backfillPlanJSON{ID: args[0], From: tFrom.UTC(), To: tTo.UTC(), Ticks: plan.Ticks, Already: plan.Already,
					Todo: make([]time.Time, len(plan.Todo)), Registered: plan.Registered.UTC(), BeforeRegistration: plan.BeforeRegistration}
				for i, tick := range plan.Todo {
					out.Todo[i] = tick.UTC()
				}
				return printJSON(cmd.OutOrStdout(), out)
			}
			ok, err := guard.confirm(cmd, "fire", len(plan.Todo), "tick", "ticks", func(w io.Writer) {
				fmt.Fprintf(w, "backfill %s from %s to %s: %d ticks, %d fired already, %d to fire:\n",
					args[0], fmtTime(tFrom), fmtTime(tTo), plan.Ticks, plan.Already, len(plan.Todo))
				for i, tick := range plan.Todo {
					if i == maxPreview {
						fmt.Fprintf(w, "  … and %d more (--dry-run --json lists them all)\n", len(plan.Todo)-i)
						break
					}
					fmt.Fprintf(w, "  %s\n", fmtTime(tick))
				}
			})
			if err != nil || !ok && guard.dryRun {
				return err
			}
			res, ferr := m.FireBackfill(ctx, st, plan)
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
				fmt.Fprintf(w, "note: %d of these ticks are before entry %s was registered (%s), fired as --before-registration asked\n",
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
	cmd.Flags().BoolVar(&beforeRegistration, "before-registration", false, "fire the range's ticks before the entry was registered too")
	guard.add(cmd)
	addConn(cmd, &conn, true)
	return cmd
}
