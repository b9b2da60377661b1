package main

import (
	"context"
	"fmt"
	"path"
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
	var flt lsFilter
	var output string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List entries, now or as they were at any moment",
		Long: `List every registered entry: state (active, paused, ended when past its
end_at, completed when it fired its --max-fires ticks (read from Redis), or
quarantined when its last config event cannot be applied), spec,
queue, revision, last fire and next fire.

LAST FIRE is the scheduled time of the entry's last tick with an event in
the activity stream, followed by "skipped (reason)" when that tick was
skipped rather than fired. NEXT FIRE includes the jitter.

Filters combine: --queue Q, --state active|paused|ended|completed|quarantined,
--owner O (--owner "" : entries without an owner), --type GLOB (task type,
e.g. 'report:*'), --selector (-l) on labels, as in Kubernetes: team=payments,
tier!=batch, team (has the label), !team (has not); commas join them.

--at replays the config stream up to a moment and lists the entries exactly
as they were then (the fold of every config event stored up to that time,
by the stream's own timestamps). NEXT FIRE is then the next fire after that
moment.

-o picks the output: table (default), wide (the table plus the entry's
policy columns: catch-up, overlap, jitter, max retry, timeout, updated,
note, window, exclude, labels, fires left of a --max-fires limit), json (a JSON array; --json is the same) or yaml (the same fields as
json).`,
		Example: `  cronstream entry ls
  cronstream entry ls -o wide
  cronstream entry ls --queue critical --state paused
  cronstream entry ls --owner team-billing --type 'invoice:*'
  cronstream entry ls --selector team=payments,tier!=batch
  cronstream entry ls --at -2h
  cronstream entry ls --at 2025-03-01T09:00:00Z --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			now := time.Now()
			if err := flt.check(cmd); err != nil {
				return err
			}
			format, err := lsOutput(cmd, output, g.json)
			if err != nil {
				return err
			}
			var asOf time.Time
			if at != "" {
				t, err := parseTime("at", at, now)
				if err != nil {
					return err
				}
				asOf = t
			}
			s, err := openStreamsSession(ctx, g, &conn)
			if err != nil {
				return err
			}
			defer s.Close()
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
				addRemaining(ctx, g, &conn, s, views, cmd.ErrOrStderr())
				views = slices.DeleteFunc(views, func(v entryView) bool { return !flt.keep(v) })
				if err := addLastFires(ctx, s, views); err != nil {
					return err
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
				views = slices.DeleteFunc(views, func(v entryView) bool { return !flt.keep(v) })
			}
			switch format {
			case "json", "yaml":
				if views == nil {
					views = []entryView{}
				}
				if format == "yaml" {
					return printYAML(cmd.OutOrStdout(), views)
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
			if format == "wide" {
				return printEntryTableWide(cmd.OutOrStdout(), views)
			}
			return printEntryTable(cmd.OutOrStdout(), views)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: "+strings.Join(lsFormats, ", "))
	cmd.Flags().StringVar(&at, "at", "", "list the entries as they were at this time: RFC 3339, or relative (-2h, -30m)")
	cmd.Flags().BoolVar(&g.json, "json", false, "print the entries as a JSON array (same as -o json)")
	cmd.Flags().StringVar(&flt.queue, "queue", "", "only entries firing into this queue")
	cmd.Flags().StringVar(&flt.state, "state", "", "only entries in this state: active, paused, ended, completed or quarantined")
	cmd.Flags().StringVarP(&flt.selector, "selector", "l", "", "only entries whose labels match this selector (k=v, k!=v, k in (a,b), k notin (a,b), k, !k; commas join)")
	cmd.Flags().StringVar(&flt.owner, "owner", "", `only entries of this owner ("" : without one)`)
	cmd.Flags().StringVar(&flt.typ, "type", "", "only entries whose task type matches this glob")
	addConn(cmd, &conn, true)
	return cmd
}

// lsFormats are entry ls's -o values.
var lsFormats = []string{"table", "wide", "json", "yaml"}

// lsOutput returns the format -o and --json ask for.
func lsOutput(cmd *cobra.Command, output string, json bool) (string, error) {
	if !slices.Contains(lsFormats, output) {
		return "", usagef("-o %q: use %s", output, strings.Join(lsFormats, ", "))
	}
	if json {
		if cmd.Flags().Changed("output") && output != "json" {
			return "", usagef("--json and -o %s: give one (--json is -o json)", output)
		}
		return "json", nil
	}
	return output, nil
}

// lsFilter is entry ls's filters; unset ones keep everything.
type lsFilter struct {
	queue, state, owner, typ, selector string
	byQueue, byOwner                   bool
	sel                                events.Selector
}

func (f *lsFilter) check(cmd *cobra.Command) error {
	f.byQueue, f.byOwner = cmd.Flags().Changed("queue"), cmd.Flags().Changed("owner")
	switch f.state {
	case "", stateActive, statePaused, stateEnded, stateCompleted, stateQuarantined:
	default:
		return usagef("--state %q: use active, paused, ended, completed or quarantined", f.state)
	}
	sel, err := events.ParseSelector(f.selector)
	if err != nil {
		return usagef("--selector: %v", err)
	}
	f.sel = sel
	if _, err := path.Match(f.typ, ""); err != nil {
		return usagef("--type %q: %v", f.typ, err)
	}
	return nil
}

func (f *lsFilter) keep(v entryView) bool {
	if f.state != "" && v.State != f.state {
		return false
	}
	quarantined := v.State == stateQuarantined
	if f.byQueue && (quarantined || v.Options.QueueName() != f.queue) {
		return false
	}
	if f.byOwner && (quarantined || v.Owner != f.owner) {
		return false
	}
	if !f.sel.Empty() && (quarantined || !f.sel.Matches(v.Labels)) {
		return false
	}
	if f.typ != "" {
		if ok, _ := path.Match(f.typ, v.Task.Type); quarantined || !ok {
			return false
		}
	}
	return true
}

// addLastFires sets each view's last fire from the last event on its fire
// subject: one read of the last message per subject.
func addLastFires(ctx context.Context, s *session, views []entryView) error {
	if len(views) == 0 {
		return nil
	}
	at := make(map[string]int, len(views))
	for i, v := range views {
		at[v.ID] = i
	}
	filter := s.names.FireSubject("*")
	if len(views) == 1 {
		filter = s.names.FireSubject(views[0].ID)
	}
	return readSubject(ctx, s, s.names.ActivityStream(), filter, time.Time{}, func(_ time.Time, data []byte) {
		ev, err := events.DecodeEvent(data)
		if err != nil {
			return
		}
		i, ok := at[ev.Subject]
		if !ok {
			return
		}
		switch ev.Type {
		case events.TypeEntryFired:
			var d events.Fired
			if ev.DecodeData(&d) == nil {
				t := d.ScheduledAt.UTC()
				views[i].LastFire, views[i].LastOutcome = &t, "fired"
			}
		case events.TypeEntrySkipped:
			var d events.Skipped
			if ev.DecodeData(&d) == nil {
				t := d.ScheduledAt.UTC()
				if d.Until != nil {
					t = d.Until.UTC()
				}
				views[i].LastFire, views[i].LastOutcome = &t, "skipped ("+d.Reason+")"
			}
		case events.TypeTaskCancelled:
			// Last on the subject only while overlap cancel-previous holds
			// the tick: its fired event follows once the task stopped.
			var d events.TaskCancelled
			if ev.DecodeData(&d) == nil && d.Action == events.CancelRequested {
				t := d.ScheduledAt.UTC()
				views[i].LastFire, views[i].LastOutcome = &t, "held (cancelling the previous task)"
			}
		}
	})
}
