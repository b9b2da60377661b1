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

// backfillFlags are entry backfill's flags.
type backfillFlags struct {
	conn               connFlags
	from, to           string
	guard              guardFlags
	beforeRegistration bool
}

func newEntryBackfillCommand(g *globalFlags) *cobra.Command {
	f := &backfillFlags{}
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
			return runEntryBackfill(cmd, g, f, args[0])
		},
	}
	cmd.Flags().StringVar(&f.from, "from", "", "first time of the range, inclusive (RFC 3339, a date, now, or relative: -2h, -7d)")
	cmd.Flags().StringVar(&f.to, "to", "", "last time of the range, inclusive, not in the future (as --from)")
	addJSONResult(cmd, g)
	cmd.Flags().BoolVar(&f.beforeRegistration, "before-registration", false, "fire the range's ticks before the entry was registered too")
	f.guard.add(cmd)
	addConn(cmd, &f.conn, true)
	return cmd
}

// runEntryBackfill plans the range, shows it and asks (a dry run stops
// there), fires the ticks that never fired and says what it did.
func runEntryBackfill(cmd *cobra.Command, g *globalFlags, f *backfillFlags, id string) error {
	ctx := cmd.Context()
	now := time.Now()
	from, to, err := f.timeRange(now)
	if err != nil {
		return err
	}
	m, st, done, err := manualFor(ctx, g, &f.conn, id)
	if err != nil {
		return err
	}
	defer done()
	plan, err := m.PlanBackfill(ctx, st, from, to)
	if errors.Is(err, scheduler.ErrBadRange) || errors.Is(err, scheduler.ErrTooManyTicks) {
		return usageError{err}
	}
	if err != nil {
		return err
	}
	if plan.BeforeRegistration > 0 && !f.beforeRegistration {
		return usagef("%d of the range's %d ticks are before entry %s was registered (%s): ticks it never had. Pass --before-registration to fire them too, or start --from at %s",
			plan.BeforeRegistration, plan.Ticks, id, fmtTime(plan.Registered), plan.Registered.UTC().Format(time.RFC3339))
	}
	if f.guard.dryRun && g.json {
		return printJSON(cmd.OutOrStdout(), newBackfillPlanJSON(id, from, to, plan))
	}
	ok, err := f.guard.confirm(cmd, "fire", len(plan.Todo), "tick", "ticks", func(w io.Writer) { previewBackfill(w, id, from, to, plan) })
	if err != nil || !ok && f.guard.dryRun {
		return err
	}
	res, ferr := m.FireBackfill(ctx, st, plan)
	if ferr != nil && !errors.Is(ferr, scheduler.ErrRefused) {
		return ferr
	}
	out := newBackfillResult(id, from, to, res, ferr)
	maxAge, err := events.ActivityMaxAge(ctx, m.JS, m.Names)
	if err != nil {
		return fmt.Errorf("read the activity retention: %w", err)
	}
	if cutoff := now.Add(-maxAge).UTC(); maxAge > 0 && from.Before(cutoff) {
		out.HistoryFrom = &cutoff
	}
	if g.json {
		if err := printJSON(cmd.OutOrStdout(), out); err != nil {
			return err
		}
		return ferr
	}
	printBackfill(cmd.OutOrStdout(), out, maxAge)
	return ferr
}

// timeRange parses --from and --to, relative ones from now.
func (f *backfillFlags) timeRange(now time.Time) (from, to time.Time, err error) {
	if f.from == "" || f.to == "" {
		return from, to, usagef("backfill needs --from and --to")
	}
	if from, err = parseTime("from", f.from, now); err != nil {
		return from, to, usageError{err}
	}
	if to, err = parseTime("to", f.to, now); err != nil {
		return from, to, usageError{err}
	}
	if to.Before(from) {
		return from, to, usagef("--to %s is before --from %s", fmtTime(to), fmtTime(from))
	}
	return from, to, nil
}

func newBackfillPlanJSON(id string, from, to time.Time, plan scheduler.BackfillPlan) backfillPlanJSON {
	out := backfillPlanJSON{ID: id, From: from.UTC(), To: to.UTC(), Ticks: plan.Ticks, Already: plan.Already,
		Todo: make([]time.Time, len(plan.Todo)), Registered: plan.Registered.UTC(), BeforeRegistration: plan.BeforeRegistration}
	for i, tick := range plan.Todo {
		out.Todo[i] = tick.UTC()
	}
	return out
}

// previewBackfill shows the ticks a backfill will fire, at most
// maxPreview of them.
func previewBackfill(w io.Writer, id string, from, to time.Time, plan scheduler.BackfillPlan) {
	fmt.Fprintf(w, "backfill %s from %s to %s: %d ticks, %d fired already, %d to fire:\n",
		id, fmtTime(from), fmtTime(to), plan.Ticks, plan.Already, len(plan.Todo))
	for i, tick := range plan.Todo {
		if i == maxPreview {
			fmt.Fprintf(w, "  … and %d more (--dry-run --json lists them all)\n", len(plan.Todo)-i)
			break
		}
		fmt.Fprintf(w, "  %s\n", fmtTime(tick))
	}
}

// newBackfillResult is what a backfill did; refused says why some ticks
// were not fired.
func newBackfillResult(id string, from, to time.Time, res scheduler.BackfillResult, refused error) backfillResult {
	out := backfillResult{ID: id, From: from.UTC(), To: to.UTC(), Ticks: res.Ticks, Fired: res.Fired, Already: res.Already,
		SkippedUnique: res.SkippedUnique, Registered: res.Registered.UTC(), BeforeRegistration: res.BeforeRegistration}
	if out.Fired == nil {
		out.Fired = []string{}
	}
	if refused != nil {
		out.Error = refused.Error()
	}
	return out
}

// printBackfill says what a backfill did; maxAge is the activity stream's
// retention, named when the range reaches before it.
func printBackfill(w io.Writer, out backfillResult, maxAge time.Duration) {
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
}
