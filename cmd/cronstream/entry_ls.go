package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/projector"
)

func init() { entryCommands = append(entryCommands, newEntryLsCommand) }

// lsFlags are entry ls's flags beside its filters.
type lsFlags struct {
	conn             connFlags
	filter           lsFilter
	at               string
	output           outputFlag
	sortBy           string
	noHeaders, watch bool
	limit            int
	exitOnDisconnect bool
}

func newEntryLsCommand(g *globalFlags) *cobra.Command {
	f := &lsFlags{}
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
skipped rather than fired. NEXT FIRE includes the jitter. On a terminal
each time is followed by how long ago or ahead it is.

Filters combine: --queue Q, --state active|paused|ended|completed|quarantined,
--owner O (--owner "" : entries without an owner), --type GLOB (task type,
e.g. 'report:*'), --selector (-l) on labels, as in Kubernetes: team=payments,
tier!=batch, 'team in (billing,ops)', team (has the label), !team (has not);
commas join them.

--sort-by orders the list by ` + strings.Join(lsSortKeys, ", ") + ` (default id;
entries without the value last); --limit N prints the first N and says how
many more there are; --no-headers leaves out the header line.

--at replays the config stream up to a moment and lists the entries exactly
as they were then (the fold of every config event stored up to that time,
by the stream's own timestamps). NEXT FIRE is then the next fire after that
moment.

--watch (-w) prints the list, then a line for each entry that changes (put,
paused, resumed, removed: state "removed"), as it happens, until
interrupted; it says on stderr when NATS stops answering and when it is
back (--exit-on-disconnect: exit 5 instead).

-o picks the output: table (default), wide (the table plus the entry's
policy columns: catch-up, overlap, jitter, max retry, timeout, updated,
note, window, exclude, labels, fires left of a --max-fires limit), name
(entry/<id>, one a line), json (a JSON array; --json is the same) or yaml
(the same fields as json).`,
		Example: `  cronstream entry ls
  cronstream entry ls -o wide --sort-by next-fire --limit 20
  cronstream entry ls --queue critical --state paused
  cronstream entry ls --owner team-billing --type 'invoice:*'
  cronstream entry ls --selector 'team in (payments,billing),tier!=batch'
  cronstream entry ls -o name --state paused | xargs cronstream entry resume
  cronstream entry ls --watch --queue critical
  cronstream entry ls --at -2h
  cronstream entry ls --at 2025-03-01T09:00:00Z --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runEntryLs(cmd, g, f)
		},
	}
	fl := cmd.Flags()
	addOutput(cmd, &f.output, lsFormats...)
	fl.StringVar(&f.at, "at", "", "list the entries as they were at this time: RFC 3339, or relative (-2h, -30m)")
	fl.StringVar(&f.filter.queue, "queue", "", "only entries firing into this queue")
	fl.StringVar(&f.filter.state, "state", "", "only entries in this state: active, paused, ended, completed or quarantined")
	addSelector(cmd, &f.filter.selector, "only entries whose labels match this selector", "")
	fl.StringVar(&f.filter.owner, "owner", "", `only entries of this owner ("" : without one)`)
	fl.StringVar(&f.filter.typ, "type", "", "only entries whose task type matches this glob")
	fl.StringVar(&f.sortBy, "sort-by", "id", "order by: "+strings.Join(lsSortKeys, ", "))
	fl.BoolVar(&f.noHeaders, "no-headers", false, "leave out the header line of table and wide output")
	fl.IntVar(&f.limit, "limit", 0, "print only the first N entries (0: all)")
	fl.BoolVarP(&f.watch, "watch", "w", false, "after the list, print each entry that changes, until interrupted")
	fl.BoolVar(&f.exitOnDisconnect, "exit-on-disconnect", false, "with --watch: exit with status 5 when NATS stops answering")
	addConn(cmd, &f.conn, true)
	return cmd
}

// runEntryLs lists, filters, sorts, limits and prints the entries, then
// watches them when asked.
func runEntryLs(cmd *cobra.Command, g *globalFlags, f *lsFlags) error {
	ctx := cmd.Context()
	now := time.Now()
	if err := f.check(cmd); err != nil {
		return err
	}
	format, err := f.output.resolve(cmd)
	if err != nil {
		return err
	}
	var asOf time.Time
	if f.at != "" {
		if asOf, err = parseTime("at", f.at, now); err != nil {
			return usageError{err}
		}
		if asOf.After(now) {
			return usagef("--at %s is in the future", fmtTime(asOf))
		}
	}
	f.conn.reconnectForever = f.watch
	s, err := openStreamsSession(ctx, g, &f.conn)
	if err != nil {
		return err
	}
	defer s.Close()
	// A watch shows every change stored after this point: read before the
	// listing, so a change made while it is read is shown, not lost.
	var watchFrom uint64
	if f.watch {
		info, err := s.js.Stream(ctx, s.names.ConfigStream())
		if err != nil {
			return err
		}
		watchFrom = info.CachedInfo().State.LastSeq + 1
	}
	var views []entryView
	if asOf.IsZero() {
		views, err = currentViews(ctx, g, &f.conn, s, &f.filter, now, cmd.ErrOrStderr())
	} else {
		views, err = viewsAt(ctx, s, &f.filter, asOf)
	}
	if err != nil {
		return err
	}
	sortViews(views, f.sortBy)
	more := 0
	if f.limit > 0 && len(views) > f.limit {
		views, more = views[:f.limit], len(views)-f.limit
	}
	opts := tableOpts{wide: format == "wide", noHeaders: f.noHeaders, relative: isTerminal(os.Stdout), now: now}
	if err := printViews(cmd.OutOrStdout(), format, views, opts, asOf); err != nil {
		return err
	}
	if more > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "… and %d more (--limit %d)\n", more, f.limit)
	}
	if !f.watch {
		return nil
	}
	return watchEntries(cmd, s, f, format, opts, watchFrom)
}

func (f *lsFlags) check(cmd *cobra.Command) error {
	if err := f.filter.check(cmd); err != nil {
		return err
	}
	switch {
	case !slices.Contains(lsSortKeys, f.sortBy):
		return usagef("--sort-by %q: use %s", f.sortBy, strings.Join(lsSortKeys, ", "))
	case f.limit < 0:
		return usagef("--limit %d: give 0 (all) or more", f.limit)
	case f.watch && f.at != "":
		return usagef("--watch and --at: a moment in the past does not change; drop one")
	case f.exitOnDisconnect && !f.watch:
		return usagef("--exit-on-disconnect applies to --watch only")
	}
	return nil
}

// currentViews are the entries registered now that the filter keeps, with
// their last fires.
func currentViews(ctx context.Context, g *globalFlags, conn *connFlags, s *session, flt *lsFilter, now time.Time, warn io.Writer) ([]entryView, error) {
	cur, err := s.client.List(ctx)
	if err != nil {
		return nil, err
	}
	var views []entryView
	for _, c := range cur {
		if c.Err != nil {
			views = append(views, entryView{Entry: events.Entry{ID: c.ID}, Revision: c.Revision, State: stateQuarantined, Error: c.Err.Error()})
			continue
		}
		views = append(views, newEntryView(c.Entry, c.Revision, c.Time, now))
	}
	addRemaining(ctx, g, conn, s, views, warn)
	views = slices.DeleteFunc(views, func(v entryView) bool { return !flt.keep(v) })
	if err := addLastFires(ctx, s, views); err != nil {
		return nil, err
	}
	return views, nil
}

// viewsAt are the entries as they were at asOf that the filter keeps.
func viewsAt(ctx context.Context, s *session, flt *lsFilter, asOf time.Time) ([]entryView, error) {
	m, quarantined, err := projector.AsOfTime(ctx, s.js, s.names, asOf)
	if err != nil {
		return nil, fmt.Errorf("replay the config stream to %s: %w", fmtTime(asOf), err)
	}
	var views []entryView
	for _, st := range m {
		views = append(views, newEntryView(st.Entry, st.Revision, st.Time, asOf))
	}
	for _, q := range quarantined {
		t := q.Time.UTC()
		views = append(views, entryView{Entry: events.Entry{ID: q.ID}, Revision: q.Seq, Updated: &t, State: stateQuarantined, Error: q.Reason})
	}
	return slices.DeleteFunc(views, func(v entryView) bool { return !flt.keep(v) }), nil
}

// printViews prints views in format (asOf: the moment listed, zero for
// now).
func printViews(w io.Writer, format string, views []entryView, opts tableOpts, asOf time.Time) error {
	switch format {
	case "json", "yaml":
		if views == nil {
			views = []entryView{}
		}
		if format == "yaml" {
			return printYAML(w, views)
		}
		return printJSON(w, views)
	case "name":
		for _, v := range views {
			fmt.Fprintf(w, "%s%s\n", namePrefix, terminalSafe(v.ID))
		}
		return nil
	}
	if len(views) == 0 {
		if asOf.IsZero() {
			fmt.Fprintln(w, "no entries")
		} else {
			fmt.Fprintf(w, "no entries at %s\n", fmtTime(asOf))
		}
		return nil
	}
	return printEntryTable(w, views, opts)
}

// lsSortKeys are --sort-by's keys.
var lsSortKeys = []string{"id", "state", "queue", "type", "owner", "revision", "updated", "last-fire", "next-fire"}

// sortViews orders views by key, stably, then by id; an entry without the
// value (no next fire, say) comes last.
func sortViews(views []entryView, key string) {
	timeOf := func(v entryView) *time.Time {
		switch key {
		case "updated":
			return v.Updated
		case "last-fire":
			return v.LastFire
		case "next-fire":
			return v.NextFire
		}
		return nil
	}
	slices.SortStableFunc(views, func(a, b entryView) int {
		c := 0
		switch key {
		case "state":
			c = strings.Compare(a.State, b.State)
		case "queue":
			c = strings.Compare(a.Options.QueueName(), b.Options.QueueName())
		case "type":
			c = strings.Compare(a.Task.Type, b.Task.Type)
		case "owner":
			c = strings.Compare(a.Owner, b.Owner)
		case "revision":
			c = cmp.Compare(a.Revision, b.Revision)
		case "updated", "last-fire", "next-fire":
			ta, tb := timeOf(a), timeOf(b)
			switch {
			case ta == nil && tb == nil:
			case ta == nil:
				c = 1
			case tb == nil:
				c = -1
			default:
				c = ta.Compare(*tb)
			}
		}
		return cmp.Or(c, strings.Compare(a.ID, b.ID))
	})
}

// lsFormats are entry ls's -o values.
var lsFormats = []string{"table", "wide", "name", "json", "yaml"}

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
	sel, err := parseSelector(f.selector)
	if err != nil {
		return err
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

// watchEntries prints a line for each entry the filter keeps whose config
// changes from seq on, until the command is interrupted (or NATS goes away
// with --exit-on-disconnect).
func watchEntries(cmd *cobra.Command, s *session, f *lsFlags, format string, opts tableOpts, seq uint64) error {
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	lost, stop := watchNATS(ctx, cancel, s, cmd.ErrOrStderr(), f.exitOnDisconnect)
	defer stop()
	cons, err := s.js.OrderedConsumer(ctx, s.names.ConfigStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.names.ConfigFilter()}, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: seq,
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return fmt.Errorf("watch the config stream: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("watch the config stream: %w", err)
	}
	go func() { <-ctx.Done(); it.Stop() }()
	w := cmd.OutOrStdout()
	tw := newTable(w)
	for {
		m, err := it.Next()
		if err != nil {
			if cmd.Context().Err() != nil {
				return nil
			}
			if ctx.Err() != nil {
				return lost()
			}
			return fmt.Errorf("watch the config stream: %w", err)
		}
		v, ok := watchedView(m, time.Now())
		if !ok || !f.filter.keep(v) && v.State != stateRemoved {
			continue
		}
		switch format {
		case "json":
			if err := json.NewEncoder(w).Encode(v); err != nil {
				return err
			}
			continue
		case "yaml":
			fmt.Fprintln(w, "---")
			if err := printYAML(w, v); err != nil {
				return err
			}
			continue
		case "name":
			fmt.Fprintf(w, "%s%s\n", namePrefix, terminalSafe(v.ID))
			continue
		}
		opts.now = time.Now()
		fmt.Fprintln(tw, entryRow(v, opts))
		if err := tw.Flush(); err != nil {
			return err
		}
	}
}

// stateRemoved is how a watch shows an entry's removal.
const stateRemoved = "removed"

// watchedView is the entry a config message leaves.
func watchedView(m jetstream.Msg, now time.Time) (entryView, bool) {
	md, err := m.Metadata()
	if err != nil {
		return entryView{}, false
	}
	ev, err := events.DecodeEvent(m.Data())
	if err != nil {
		return entryView{Entry: events.Entry{ID: ev.Subject}, Revision: md.Sequence.Stream, State: stateQuarantined, Error: err.Error()}, ev.Subject != ""
	}
	var e events.Entry
	if err := ev.DecodeData(&e); err != nil {
		return entryView{Entry: events.Entry{ID: ev.Subject}, Revision: md.Sequence.Stream, State: stateQuarantined, Error: err.Error()}, ev.Subject != ""
	}
	v := newEntryView(e, md.Sequence.Stream, md.Timestamp, now)
	if events.ConfigKind(ev.Type) == events.TypeEntryRemoved {
		v.State, v.NextFire = stateRemoved, nil
	}
	return v, true
}
