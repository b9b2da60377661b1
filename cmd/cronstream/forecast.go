package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/forecast"
	"github.com/cronstream/cronstream/internal/taskstate"
)

func init() { subcommands = append(subcommands, newForecastCommand) }

func newForecastCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var window time.Duration
	var by string
	var output outputFlag
	cmd := &cobra.Command{
		Use:   "forecast",
		Short: "Fires per minute the registered entries will make, their peaks and how to flatten them",
		Long: `Count the fires of every registered entry (paused entries excluded) in each
minute of the window from the current minute, per queue or per entry, and
chart them: one sparkline per group, each column the busiest minute of its
stretch. The peaks are listed with the schedules and entries behind them,
and a hint where jitter would flatten one.

Counts are computed, not listed tick by tick: "@every D" arithmetically,
cron specs one step per minute that holds a tick. Jitter is the
scheduler's own offset; for entries that fire several times a minute it
shifts their steady rate by its mean. An entry with --max-fires counts
no more ticks than it has left (read from Redis; without Redis, its whole
limit).

-o picks the output: table (default: the chart and the peaks), wide (the
same), json or yaml (per-minute counts per group, totals, peaks).`,
		Example: `  cronstream forecast
  cronstream forecast --window 2h --by entry
  cronstream forecast -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := output.resolve(cmd)
			if err != nil {
				return err
			}
			grouping, err := forecast.ParseBy(by)
			if err != nil {
				return usageError{err}
			}
			if window < time.Minute || window > forecast.MaxWindow {
				return usagef("--window %s: want between 1m and %s", window, forecast.MaxWindow)
			}
			ctx := cmd.Context()
			s, err := openStreamsSession(ctx, g, &conn)
			if err != nil {
				return err
			}
			defer s.Close()
			cur, err := s.client.List(ctx)
			if err != nil {
				return err
			}
			entries := make([]events.Entry, 0, len(cur))
			for _, c := range cur {
				if c.Err == nil {
					entries = append(entries, c.Entry)
				}
			}
			left := forecastFiresLeft(ctx, g, &conn, s, entries, cmd.ErrOrStderr())
			f := forecast.Compute(entries, forecast.Params{Window: window, By: grouping, Remaining: left})
			if ok, err := printStructured(cmd.OutOrStdout(), format, f); ok {
				return err
			}
			printForecast(cmd.OutOrStdout(), f, 72)
			return nil
		},
	}
	cmd.Flags().DurationVar(&window, "window", 24*time.Hour, "how far ahead to forecast (at most a week)")
	cmd.Flags().StringVar(&by, "by", "queue", "group fires by queue or entry")
	addOutput(cmd, &output, outTable, outWide, outJSON, outYAML)
	addConn(cmd, &conn, true)
	return cmd
}

// forecastFiresLeft reads the fires left of the limited entries among
// entries (their config history and fires counter). Redis is only asked
// when there are such entries; a count that cannot be read stays unknown
// (the forecast then bounds the entry by its whole max_fires) and is said
// on warn.
func forecastFiresLeft(ctx context.Context, g *globalFlags, conn *connFlags, s *session, entries []events.Entry, warn io.Writer) map[string]int {
	left := map[string]int{}
	var store *taskstate.Store
	for _, e := range entries {
		if !e.Limited() || e.Paused {
			continue
		}
		if store == nil {
			st, rc, err := openStore(ctx, g, conn)
			if err != nil {
				fmt.Fprintf(warn, "fires left unknown, limited entries counted up to their whole max_fires: %s\n", terminalSafe(g.secrets.String(err.Error())))
				return left
			}
			defer rc.Close()
			store = st
		}
		recs, err := s.client.History(ctx, e.ID)
		var n int
		if err == nil {
			n, _, err = firesLeft(ctx, store, s.names.Prefix(), e, maxFiresSinceOf(recs))
		}
		if err != nil {
			fmt.Fprintf(warn, "fires left of %s unknown: %s\n", terminalSafe(e.ID), terminalSafe(g.secrets.String(err.Error())))
			continue
		}
		left[e.ID] = n
	}
	return left
}

var sparks = []rune("▁▂▃▄▅▆▇█")

// printForecast draws one sparkline per group over width columns, each the
// busiest minute of its stretch, scaled to the busiest minute overall.
func printForecast(w io.Writer, f *forecast.Forecast, width int) {
	end := f.From.Add(time.Duration(f.Minutes) * time.Minute)
	fmt.Fprintf(w, "forecast %s → %s UTC: %s fires from %s entries, busiest minute %s fires\n",
		f.From.Format("2006-01-02 15:04"), end.Format("2006-01-02 15:04"), forecast.Thousands(f.Total), forecast.Thousands(int64(f.Entries)), forecast.Thousands(f.Max))
	if len(f.Skipped) > 0 {
		fmt.Fprintf(w, "left out (schedule does not build): %s\n", terminalSafe(strings.Join(f.Skipped, ", ")))
	}
	if f.Total == 0 {
		fmt.Fprintln(w, "no fires in the window")
		return
	}
	width = min(width, f.Minutes)
	per := (f.Minutes + width - 1) / width
	nameW := 5
	for _, g := range f.Groups {
		nameW = max(nameW, min(len(terminalSafe(g.Name)), 24))
	}
	fmt.Fprintf(w, "\n%-*s  %s  (each column %s, busiest minute)\n", nameW, string(f.By), axis(f, width, per), time.Duration(per)*time.Minute)
	line := func(name string, counts []int64, total int64) {
		var b strings.Builder
		for c := 0; c*per < len(counts); c++ {
			var peak int64
			for _, n := range counts[c*per : min((c+1)*per, len(counts))] {
				peak = max(peak, n)
			}
			switch {
			case peak == 0:
				b.WriteRune(' ')
			default:
				b.WriteRune(sparks[min(int(peak*int64(len(sparks)-1)/max(f.Max, 1)), len(sparks)-1)])
			}
		}
		fmt.Fprintf(w, "%-*s  %s  %s\n", nameW, truncate(name, nameW), b.String(), forecast.Thousands(total))
	}
	for _, g := range f.Groups {
		line(terminalSafe(g.Name), g.Counts, g.Total)
	}
	if len(f.Groups) > 1 {
		line("all", f.Totals, f.Total)
	}
	if len(f.Peaks) == 0 {
		fmt.Fprintln(w, "\nno peaks: no minute stands out above the steady load")
		return
	}
	fmt.Fprintln(w, "\npeaks:")
	for _, pk := range f.Peaks {
		fmt.Fprintf(w, "  %s UTC  %s fires from %s entries\n", pk.At.Format("2006-01-02 15:04"), forecast.Thousands(pk.Fires), forecast.Thousands(int64(pk.Entries)))
		for i, ps := range pk.Specs {
			if i == 3 {
				fmt.Fprintf(w, "    … and %d more schedules\n", len(pk.Specs)-i)
				break
			}
			fmt.Fprintf(w, "    %s, e.g. %s\n", terminalSafe(ps.Describe(pk.At)), terminalSafe(strings.Join(ps.Sample, ", ")))
		}
		if pk.Hint != "" {
			fmt.Fprintf(w, "    hint: %s\n", terminalSafe(pk.Hint))
		}
	}
}

// axis labels the start of the chart and every quarter of it.
func axis(f *forecast.Forecast, width, per int) string {
	row := []rune(strings.Repeat(" ", width))
	for _, c := range []int{0, width / 4, width / 2, 3 * width / 4} {
		label := []rune(f.From.Add(time.Duration(c*per) * time.Minute).Format("15:04"))
		if c+len(label) <= width {
			copy(row[c:], label)
		}
	}
	return string(row)
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
