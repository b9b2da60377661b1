package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/schedule"
)

func init() { entryCommands = append(entryCommands, newEntryDescribeCommand) }

// describeView is what `entry describe --json` prints.
type describeView struct {
	Entry   entryView       `json:"entry"`
	History describeHistory `json:"history"`
	// Window is how far back fires, skips and recoveries were read.
	Window string `json:"window"`
	// Fires are the last --fires fires within the window, newest first.
	Fires []describeFire `json:"fires"`
	// FiredInWindow counts every fire in the window; Skipped every
	// skipped tick by reason (missed, overlap, unique).
	FiredInWindow int             `json:"fired_in_window"`
	Skipped       map[string]int  `json:"skipped"`
	Recoveries    []describeRecov `json:"recoveries"`
	// Lost are the entry's cronstream.task.lost events in the window:
	// fires whose tasks Redis lost (a failover, a flush).
	Lost       []events.TasksLost `json:"lost"`
	NextFires  []time.Time        `json:"next_fires"`
	RedisError string             `json:"redis_error,omitempty"`
	// Held is the tick overlap buffer-one (or cancel-previous) holds while the previous task is
	// busy (none: no tick held, or Redis could not be read).
	Held *describeHeld `json:"held,omitempty"`
	// maxFiresSince is the revision the entry's fire limit counts from.
	maxFiresSince uint64
	// nextFiresLimited: NextFires stops at the entry's fires left.
	nextFiresLimited bool
}

// describeHeld is a held tick: it fires as TaskID once WaitingFor is done.
type describeHeld struct {
	ScheduledAt time.Time `json:"scheduled_at"`
	TaskID      string    `json:"task_id"`
	WaitingFor  string    `json:"waiting_for"`
	// Cancelling: overlap cancel-previous asked asynq to cancel WaitingFor.
	Cancelling bool `json:"cancelling,omitempty"`
}

type describeHistory struct {
	Revisions  int       `json:"revisions"` // config events of the entry
	LastType   string    `json:"last_type"`
	LastTime   time.Time `json:"last_time"`
	LastSource string    `json:"last_source"`
}

type describeFire struct {
	ScheduledAt time.Time `json:"scheduled_at"`
	EnqueuedAt  time.Time `json:"enqueued_at"`
	LagSeconds  float64   `json:"lag_seconds"` // enqueued − scheduled
	TaskID      string    `json:"task_id"`
	Queue       string    `json:"queue"`
	// State is the task's asynq state now: pending, scheduled, active,
	// retry, archived, completed, aggregating, gone, or unknown when Redis
	// could not be read.
	State    string `json:"state"`
	Trigger  string `json:"trigger,omitempty"`
	Backfill bool   `json:"backfill,omitempty"`
	Replica  string `json:"replica"`
	// Lost: a lost event names this tick (Redis lost its task).
	Lost bool `json:"lost,omitempty"`
}

type describeRecov struct {
	Time    time.Time `json:"time"`
	Type    string    `json:"type"` // retried or archived
	TaskID  string    `json:"task_id"`
	Queue   string    `json:"queue"`
	Retried int       `json:"retried"`
	Error   string    `json:"error"`
}

func newEntryDescribeCommand(g *globalFlags) *cobra.Command {
	var (
		conn   connFlags
		output outputFlag
		fires  int
		next   int
		win    string
	)
	cmd := &cobra.Command{
		Use:   "describe ID",
		Short: "Everything about one entry: config, last fires and their tasks, skips, recoveries, next fires",
		Long: `Answer the daily questions about one entry in one place:

  - its configuration and state (as "entry get" shows it);
  - its config history: how many revisions, the last change, who made it;
  - its last --fires fires within --window, each with its asynq task's
    state now (pending, scheduled, active, retry, archived, completed, or
    gone once deleted or past its retention) and the enqueue lag (enqueued
    minus scheduled time);
  - how many ticks fired and were skipped within --window, by reason
    (missed, overlap, unique);
  - recoveries of its tasks (retried or archived after their worker died);
  - its next --next fire times, jitter applied, as the replicas compute them.

Task states need Redis; without it they show as unknown and the rest is
still shown. A fire refused by a replica (revision or staleness fence) is
not an event: see cronstream_fire_refused_total on the replicas.`,
		Example: `  cronstream entry describe report
  cronstream entry describe report --fires 20 --window 7d
  cronstream entry describe report --json | jq '.fires[] | select(.state=="archived")'`,
		Args: entryIDArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := output.resolve(cmd)
			if err != nil {
				return err
			}
			window, ok := durationWithDays(win)
			if fires < 0 || next < 0 || !ok || window <= 0 {
				return usagef("--fires and --next must not be negative, --window a positive duration (24h, 7d)")
			}
			ctx := cmd.Context()
			now := time.Now()
			s, err := openStreamsSession(ctx, g, &conn)
			if err != nil {
				return err
			}
			defer s.Close()
			e, rev, err := s.client.Get(ctx, args[0])
			if err != nil {
				return err
			}
			e = e.Normalize()
			v := describeView{
				Entry:  newEntryView(e, rev, s.revisionTime(ctx, rev), now),
				Window: win, Skipped: map[string]int{}, Lost: []events.TasksLost{},
				Fires: []describeFire{}, Recoveries: []describeRecov{}, NextFires: []time.Time{},
			}
			if err := describeHistoryOf(ctx, s, e.ID, &v); err != nil {
				return err
			}
			queues, err := describeActivity(ctx, s, e, now.Add(-window), fires, &v)
			if err != nil {
				return err
			}
			if err := describeRecoveries(ctx, s, e.ID, queues, now.Add(-window), &v); err != nil {
				return err
			}
			v.NextFires = nextFires(e, now, next)
			describeTaskStates(ctx, g, &conn, &v)
			if e.Overlap == events.OverlapBufferOne || e.Overlap == events.OverlapCancelPrevious {
				describeHeldTick(ctx, g, &conn, s.names.Prefix(), e, &v)
			}
			describeFireCount(ctx, g, &conn, s.names.Prefix(), &v)
			v.limitNextFires()
			if ok, err := printStructured(cmd.OutOrStdout(), format, v); ok {
				return err
			}
			return printDescribe(cmd.OutOrStdout(), v)
		},
	}
	f := cmd.Flags()
	f.IntVar(&fires, "fires", 5, "show the last N fires")
	f.IntVar(&next, "next", 5, "show the next N fire times")
	f.StringVar(&win, "window", "24h", "how far back to read fires, skips and recoveries (24h, 7d)")
	addOutput(cmd, &output, outTable, outWide, outJSON, outYAML)
	addConn(cmd, &conn, true)
	return cmd
}

func describeHistoryOf(ctx context.Context, s *session, id string, v *describeView) error {
	recs, err := s.client.History(ctx, id)
	if err != nil {
		return err
	}
	v.History.Revisions = len(recs)
	v.maxFiresSince = maxFiresSinceOf(recs)
	if len(recs) > 0 {
		last := recs[len(recs)-1]
		v.History.LastTime = last.Time.UTC()
		if last.Event != nil {
			v.History.LastType = events.ShortType(last.Event.Type)
			v.History.LastSource = last.Event.Source
		}
	}
	return nil
}

// describeActivity reads the entry's fire subject since a moment: the last
// n fires, and counts of fires and skips. It returns the queues the fires
// went to (the entry's queue among them), where its recoveries are.
func describeActivity(ctx context.Context, s *session, e events.Entry, since time.Time, n int, v *describeView) ([]string, error) {
	queues := []string{e.Options.QueueName()}
	var fired []describeFire
	err := readSubject(ctx, s, s.names.ActivityStream(), s.names.FireSubject(e.ID), since, func(_ time.Time, data []byte) {
		ev, err := events.DecodeEvent(data)
		if err != nil {
			return
		}
		switch ev.Type {
		case events.TypeEntryFired:
			var d events.Fired
			if ev.DecodeData(&d) != nil {
				return
			}
			v.FiredInWindow++
			if !slices.Contains(queues, d.Queue) {
				queues = append(queues, d.Queue)
			}
			if n == 0 {
				return
			}
			if len(fired) == n {
				fired = append(fired[:0], fired[1:]...)
			}
			fired = append(fired, describeFire{ScheduledAt: d.ScheduledAt.UTC(), EnqueuedAt: d.EnqueuedAt.UTC(),
				LagSeconds: d.EnqueuedAt.Sub(d.ScheduledAt).Seconds(), TaskID: d.TaskID, Queue: d.Queue,
				State: "unknown", Trigger: d.Trigger, Backfill: d.Backfill, Replica: d.Replica})
		case events.TypeEntrySkipped:
			var d events.Skipped
			if ev.DecodeData(&d) == nil {
				v.Skipped[d.Reason] += max(d.Count, 1)
			}
		case events.TypeTaskLost:
			var d events.TasksLost
			if ev.DecodeData(&d) == nil {
				v.Lost = append(v.Lost, d)
			}
		}
	})
	for i := range fired {
		fired[i].Lost = lostTick(v.Lost, fired[i])
	}
	slices.Reverse(fired)
	v.Fires = append(v.Fires, fired...)
	return queues, err
}

// lostTick reports whether a lost event names f's scheduled tick.
func lostTick(lost []events.TasksLost, f describeFire) bool {
	if f.Trigger != "" || f.Backfill {
		return false
	}
	for _, l := range lost {
		if l.ScheduledAt != nil && l.Queue == f.Queue && !f.ScheduledAt.Before(*l.ScheduledAt) && !f.ScheduledAt.After(l.Until) {
			return true
		}
	}
	return false
}

// describeRecoveries reads the recovery events of the queues since a
// moment and keeps those of the entry's tasks (task ids
// <prefix>:<entry>:…).
func describeRecoveries(ctx context.Context, s *session, id string, queues []string, since time.Time, v *describeView) error {
	own := events.TaskIDPrefix(s.names.Prefix(), id)
	for _, q := range queues {
		err := readSubject(ctx, s, s.names.ActivityStream(), s.names.RecoverySubject(q), since, func(at time.Time, data []byte) {
			evs, _ := events.DecodeEvents(data) // a batch of a mass recovery, or one event
			for _, ev := range evs {
				if ev.Type != events.TypeTaskRetried && ev.Type != events.TypeTaskArchived {
					continue
				}
				var d events.TaskRecovered
				if ev.DecodeData(&d) != nil || !strings.HasPrefix(d.TaskID, own) {
					continue
				}
				v.Recoveries = append(v.Recoveries, describeRecov{Time: at.UTC(), Type: events.ShortType(ev.Type),
					TaskID: d.TaskID, Queue: d.Queue, Retried: d.Retried, Error: d.Error})
			}
		})
		if err != nil {
			return err
		}
	}
	slices.SortFunc(v.Recoveries, func(a, b describeRecov) int { return a.Time.Compare(b.Time) })
	return nil
}

// describeTaskStates fills in each fire's task state from Redis. Without
// Redis the states stay unknown and the reason is shown.
func describeTaskStates(ctx context.Context, g *globalFlags, conn *connFlags, v *describeView) {
	if len(v.Fires) == 0 {
		return
	}
	store, rc, err := openStore(ctx, g, conn)
	if err != nil {
		v.RedisError = err.Error()
		return
	}
	defer rc.Close()
	refs := make([]taskstate.TaskRef, len(v.Fires))
	for i, f := range v.Fires {
		refs[i] = taskstate.TaskRef{Queue: f.Queue, ID: f.TaskID}
	}
	states, err := store.TaskStates(ctx, refs)
	if err != nil {
		v.RedisError = g.secrets.String(err.Error())
		return
	}
	for i := range v.Fires {
		v.Fires[i].State = states[i]
	}
}

// describeHeldTick fills in the tick the entry holds (overlap buffer-one)
// from Redis; a failure to read it shows like one of the task states.
func describeHeldTick(ctx context.Context, g *globalFlags, conn *connFlags, prefix string, e events.Entry, v *describeView) {
	store, rc, err := openStore(ctx, g, conn)
	if err != nil {
		v.RedisError = err.Error()
		return
	}
	defer rc.Close()
	held, err := store.HeldTicks(ctx, prefix, []string{e.Options.Queue})
	if err != nil {
		v.RedisError = g.secrets.String(err.Error())
		return
	}
	for _, h := range held {
		if h.Entry == e.ID {
			v.Held = &describeHeld{ScheduledAt: h.Tick, TaskID: h.TaskID, WaitingFor: h.PrevTaskID, Cancelling: h.Cancel}
		}
	}
}

// nextFires are the entry's next n fire times after now, jitter applied,
// computed by the scheduler's own code (window and exclusions applied).
// None while paused.
func nextFires(e events.Entry, now time.Time, n int) []time.Time {
	out := []time.Time{}
	if e.Paused {
		return out
	}
	sched, err := schedule.NewSchedule(e)
	if err != nil {
		return out
	}
	for t := sched.NextFire(now); !t.IsZero() && len(out) < n; t = sched.NextFire(t) {
		out = append(out, t.Add(sched.Jitter(t)).UTC())
	}
	return out
}

// readSubject hands each message stored on subject since a moment to
// each, in order, and returns once it has read what was stored when it
// began. A zero since reads only the last message of each subject the
// filter matches.
func readSubject(ctx context.Context, s *session, stream, subject string, since time.Time, each func(time.Time, []byte)) error {
	cc := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}, InactiveThreshold: 5 * time.Second,
		DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy}
	if !since.IsZero() {
		cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := s.js.OrderedConsumer(ctx, stream, cc)
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	var pending uint64
	if info := cons.CachedInfo(); info != nil {
		pending = info.NumPending
	}
	if pending == 0 {
		return nil
	}
	// One iterator, not fetches: each fetch of an ordered consumer
	// replaces its consumer and deletes the one before, which no role may
	// (the server removes the consumer after its inactive threshold).
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	defer it.Stop()
	for pending > 0 {
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		m, err := it.Next(jetstream.NextContext(mctx))
		cancel()
		if err != nil {
			return fmt.Errorf("read %s: no message within 10s, %d still expected: %w", stream, pending, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		each(md.Timestamp, m.Data())
		pending = md.NumPending
	}
	return nil
}

func printDescribe(w io.Writer, v describeView) error {
	if err := printEntry(w, v.Entry); err != nil {
		return err
	}
	times := timesFor(w)
	h := v.History
	fmt.Fprintf(w, "\nhistory: %s; last %s at %s by %s (see entry history)\n",
		plural(h.Revisions, "config event", "config events"), terminalSafe(dash(h.LastType)), times.at(h.LastTime), terminalSafe(dash(h.LastSource)))

	fmt.Fprintf(w, "\nin the last %s: %d fired", v.Window, v.FiredInWindow)
	var skips []string
	for _, r := range slices.Sorted(maps.Keys(v.Skipped)) {
		skips = append(skips, fmt.Sprintf("%d %s", v.Skipped[r], terminalSafe(r)))
	}
	if len(skips) > 0 {
		fmt.Fprintf(w, "; skipped: %s", strings.Join(skips, ", "))
	} else {
		fmt.Fprint(w, "; none skipped")
	}
	fmt.Fprintln(w)

	if len(v.Fires) == 0 {
		fmt.Fprintf(w, "\nno fires in the last %s\n", v.Window)
	} else {
		fmt.Fprintf(w, "\nlast fires (newest first):\n")
		tw := newTable(w)
		fmt.Fprintln(tw, "  SCHEDULED\tLAG\tTASK STATE\tQUEUE\tTASK\tNOTE")
		for _, f := range v.Fires {
			note := ""
			switch {
			case f.Trigger != "":
				note = "trigger " + f.Trigger
			case f.Backfill:
				note = "backfill"
			case f.Lost:
				note = "lost by Redis (see below)"
			}
			lag := time.Duration(f.LagSeconds * float64(time.Second)).Round(time.Millisecond)
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", times.at(f.ScheduledAt), lag, f.State, terminalSafe(f.Queue), terminalSafe(f.TaskID), terminalSafe(note))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if v.RedisError != "" {
			fmt.Fprintf(w, "  task states unknown: %s\n", terminalSafe(v.RedisError))
		}
	}

	if h := v.Held; h != nil && h.Cancelling {
		fmt.Fprintf(w, "\nheld tick (overlap cancel-previous): %s as task %s, fires when the cancelled task %s has stopped\n",
			times.at(h.ScheduledAt), terminalSafe(h.TaskID), terminalSafe(h.WaitingFor))
	} else if h != nil {
		fmt.Fprintf(w, "\nheld tick (overlap buffer-one): %s as task %s, fires when %s is done\n",
			times.at(h.ScheduledAt), terminalSafe(h.TaskID), terminalSafe(h.WaitingFor))
	}

	if len(v.Lost) > 0 {
		fmt.Fprintf(w, "\nfires Redis lost (cronstream.task.lost; a failover to a lagging replica, a flush):\n")
		for _, l := range v.Lost {
			fmt.Fprintf(w, "  %s\n", terminalSafe(l.Summary()))
		}
	}

	if len(v.Recoveries) == 0 {
		fmt.Fprintf(w, "\nno recoveries of its tasks in the last %s\n", v.Window)
	} else {
		fmt.Fprintf(w, "\nrecoveries of its tasks:\n")
		tw := newTable(w)
		fmt.Fprintln(tw, "  TIME\tRECOVERY\tRETRIED\tTASK\tERROR")
		for _, r := range v.Recoveries {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\n", times.at(r.Time), r.Type, r.Retried, terminalSafe(r.TaskID), terminalSafe(shorten(r.Error, 60)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	switch {
	case v.Entry.State == stateEnded:
		fmt.Fprintf(w, "\nnext fires: none, the entry ended at %s\n", times.at(v.Entry.EndAt))
	case v.Entry.State == stateCompleted && v.Entry.MaxFiresUnknown:
		fmt.Fprintf(w, "\nnext fires: none, %s\n", maxFiresUnknownReason)
	case v.Entry.State == stateCompleted:
		fmt.Fprintf(w, "\nnext fires: none, the entry completed its %d fires\n", v.Entry.MaxFires)
	case v.Entry.State == statePaused:
		fmt.Fprintln(w, "\nnext fires: none while paused")
	case len(v.NextFires) > 0:
		fmt.Fprintln(w, "\nnext fires (jitter applied):")
		for _, t := range v.NextFires {
			fmt.Fprintf(w, "  %s\n", times.at(t))
		}
		if v.nextFiresLimited {
			fmt.Fprintf(w, "  then none: the last of its max_fires %d\n", v.Entry.MaxFires)
		}
	}
	return nil
}

// maxFiresUnknownReason says why an entry whose fires count could not be
// rebuilt fires nothing, and what undoes it.
const maxFiresUnknownReason = "its max_fires count is unknown: Redis lost it and the activity stream no longer holds every fire since the limit was set; put the entry with another --max-fires (it counts afresh) to fire again"

// limitNextFires keeps no more of a limited entry's next fires than it
// has left (its whole max_fires when the count is unknown).
func (v *describeView) limitNextFires() {
	if !v.Entry.Limited() {
		return
	}
	left := v.Entry.MaxFires
	if v.Entry.MaxFiresRemaining != nil {
		left = *v.Entry.MaxFiresRemaining
	}
	if len(v.NextFires) > left {
		v.NextFires, v.nextFiresLimited = v.NextFires[:left], true
	}
}

// plural is "1 thing" or "n things".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// describeFireCount fills in how many fires a limited entry has left (see
// addRemaining); at none it shows as completed.
func describeFireCount(ctx context.Context, g *globalFlags, conn *connFlags, prefix string, v *describeView) {
	if !v.Entry.Limited() || v.maxFiresSince == 0 {
		return
	}
	store, rc, err := openStore(ctx, g, conn)
	if err != nil {
		v.RedisError = err.Error()
		return
	}
	defer rc.Close()
	if err := setRemaining(ctx, store, prefix, &v.Entry, v.maxFiresSince); err != nil {
		v.RedisError = g.secrets.String(err.Error())
	}
}

// setRemaining reads a limited entry's fires counter in its queue's slot
// (docs/design.md INV-max-fires) and records the fires left: its limit
// less the count, when the counter is of the limit's revision since.
func setRemaining(ctx context.Context, store *taskstate.Store, prefix string, v *entryView, since uint64) error {
	n, unknown, err := firesLeft(ctx, store, prefix, v.Entry, since)
	if err != nil {
		return err
	}
	v.setRemaining(n)
	v.MaxFiresUnknown = unknown
	return nil
}

// firesLeft is a limited entry's limit less its fires counter, when the
// counter is of the limit's revision since; unknown says the counter could
// not be rebuilt after Redis lost data (none left then).
func firesLeft(ctx context.Context, store *taskstate.Store, prefix string, e events.Entry, since uint64) (left int, unknown bool, err error) {
	c, ok, err := store.FireCount(ctx, prefix, e.Options.QueueName(), e.ID)
	if err != nil {
		return 0, false, err
	}
	fired := 0
	if ok && c.Since == since {
		fired = c.Count
		unknown = c.Unknown()
	}
	return max(e.MaxFires-fired, 0), unknown, nil
}

// maxFiresSinceOf folds an entry's config history as the projector does
// (events.MaxFiresSince): the revision its fire limit counts from.
func maxFiresSinceOf(recs []events.Record) uint64 {
	var prev *events.Entry
	var since uint64
	for _, r := range recs {
		if r.Entry == nil || r.Entry.Removed {
			prev, since = nil, 0
			continue
		}
		since = events.MaxFiresSince(prev, since, *r.Entry, r.Seq)
		prev = r.Entry
	}
	return since
}

// addRemaining fills in the fires left of the limited entries among views
// (entry ls): each one's config history and counter are read, so entries
// without a limit cost nothing. Without Redis the counts stay unknown and
// ls says why on stderr.
func addRemaining(ctx context.Context, g *globalFlags, conn *connFlags, s *session, views []entryView, warn io.Writer) {
	var store *taskstate.Store
	for i := range views {
		v := &views[i]
		if !v.Entry.Limited() || v.State == stateQuarantined {
			continue
		}
		if store == nil {
			st, rc, err := openStore(ctx, g, conn)
			if err != nil {
				fmt.Fprintf(warn, "fires left unknown: %s\n", terminalSafe(g.secrets.String(err.Error())))
				return
			}
			defer rc.Close()
			store = st
		}
		recs, err := s.client.History(ctx, v.ID)
		if err == nil {
			err = setRemaining(ctx, store, s.names.Prefix(), v, maxFiresSinceOf(recs))
		}
		if err != nil {
			fmt.Fprintf(warn, "fires left of %s unknown: %s\n", terminalSafe(v.ID), terminalSafe(g.secrets.String(err.Error())))
		}
	}
}
