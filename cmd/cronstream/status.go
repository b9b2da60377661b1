package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/entrystate"
	"github.com/cronstream/cronstream/internal/failpause"
	"github.com/cronstream/cronstream/internal/forecast"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/stall"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

func init() { subcommands = append(subcommands, newStatusCommand) }

// recovererNote is said plainly wherever recovery is shown (docs/design.md
// "Recovery of lease-expired tasks").
const recovererNote = "asynq servers run their own recoverer (every minute, 30s cutoff) and it cannot be switched off; " +
	"cronstream's recoverer acts first with its defaults (every 5s, 20s grace: 20-25s after a lease expired). " +
	"A task asynq recovers first has no cronstream event."

// statusReport is everything `status` shows; --json prints it as is.
type statusReport struct {
	Prefix    string           `json:"prefix"`
	Replicas  []replica.Status `json:"replicas"`
	Shards    shardsStatus     `json:"shards"`
	Entries   entryCounts      `json:"entries"`
	Config    streamPosition   `json:"config_stream"`
	Activity  streamPosition   `json:"activity_stream"`
	Outbox    outboxStatus     `json:"outbox"`
	Queues    []queueStatus    `json:"queues"` // null, with QueuesErr, when Redis could not be read
	QueuesErr string           `json:"queues_error,omitempty"`
	NextFires []nextFireView   `json:"next_fires"`
	// Late are the entries whose tick is overdue for longer than
	// LateAfter, oldest first, with the reason their fires failed as the
	// replicas report it.
	Late      []stall.Late `json:"late"`
	LateAfter string       `json:"late_after"`
	Warnings  []string     `json:"warnings"`
	Notes     []string     `json:"notes"`
	Errors    []string     `json:"errors,omitempty"`
}

// entryCounts are the entries in each state (entrystate.Count, as the
// console's overview counts them) and the quarantined ones.
type entryCounts struct {
	entrystate.Counts
	Quarantined int              `json:"quarantined"`
	Bad         []quarantineView `json:"quarantined_entries,omitempty"`
	// FailurePaused are entries paused on failure (failpause), reason in
	// the note, at most maxFailurePaused of them.
	FailurePaused []quarantineView `json:"paused_on_failure,omitempty"`
	// CompletedIDs are the completed entries, at most maxFailurePaused.
	CompletedIDs []string `json:"completed_entries,omitempty"`
	// CountUnknown are the completed entries among them whose fires count
	// could not be rebuilt after Redis lost data.
	CountUnknown []string `json:"max_fires_count_unknown,omitempty"`
}

const maxFailurePaused = 20

type quarantineView struct {
	ID       string    `json:"id"`
	Revision uint64    `json:"revision"`
	Time     time.Time `json:"time"`
	Reason   string    `json:"reason"`
}

type streamPosition struct {
	Stream   string     `json:"stream"`
	LastSeq  uint64     `json:"last_seq"`
	LastTime *time.Time `json:"last_time,omitempty"`
	Messages uint64     `json:"messages"`
}

type outboxStatus struct {
	// Backlog is the number of fire and recovery records in Redis that the
	// relay has not yet published to the activity stream; null, with
	// Error, when it could not be read.
	Backlog *int64           `json:"backlog"`
	ByQueue map[string]int64 `json:"by_queue"`
	Error   string           `json:"error,omitempty"`
}

type queueStatus struct {
	Queue          string `json:"queue"`
	Pending        int64  `json:"pending"`
	Active         int64  `json:"active"`
	Scheduled      int64  `json:"scheduled"`
	Retry          int64  `json:"retry"`
	Archived       int64  `json:"archived"`
	Completed      int64  `json:"completed"`
	Processed      int64  `json:"processed"`
	Failed         int64  `json:"failed"`
	ProcessedToday int64  `json:"processed_today"`
	FailedToday    int64  `json:"failed_today"`
	Paused         bool   `json:"paused"`
	Outbox         int64  `json:"outbox"`
	// Held are the ticks held by overlap buffer-one now, HeldDropped those
	// dropped rather than fired (entry paused, removed, moved or off
	// buffer-one), ever.
	Held        int64 `json:"held"`
	HeldDropped int64 `json:"held_dropped"`
}

type nextFireView struct {
	Entry string    `json:"entry"`
	Queue string    `json:"queue"`
	Time  time.Time `json:"time"`
}

// maxNextFires is how many upcoming fires status lists.
const maxNextFires = 10

func newStatusCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var output outputFlag
	var lateAfter, clockOffset time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show replicas, entries, backlog, queues and the next fires",
		Long: `Show the state of one cronstream tenant (--prefix):

  replicas      replicas from their heartbeats: live, or unresponsive (no
                beat for three heartbeats: frozen, killed or cut off;
                listed for 5m after their last beat), and whether each is
                ready (its /readyz, when reachable from here)
  entries       active, paused and quarantined (last config event cannot
                be applied: the entry does not fire until fixed)
  streams       last sequence and time of the config and activity streams
  outbox        fire and recovery records in Redis not yet published to the
                activity stream (the relay's backlog)
  queues        asynq's sizes and counters per queue
  next fires    the next ticks of the active entries
  late          entries whose tick is overdue for longer than --late-after
                (computed here from the projection and the watermarks in
                Redis), with the last refusal or error the replicas saw
  warnings      Redis settings that break exactly-once (eviction, no
                persistence); stream settings that differ from a
                replica's flags (which it leaves as they are)

Ages, next fires and lateness are taken on the replicas' clock: this
host's clock corrected to Redis TIME, so a host whose clock is off shows
what the replicas see. Without Redis they fall back to this host's clock,
and a note says so.

Exits non-zero when a part could not be read (what could be read is
still shown).`,
		Example: `  cronstream status
  cronstream status --json | jq .outbox.backlog`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			format, err := output.resolve(cmd)
			if err != nil {
				return err
			}
			s, err := openStreamsSession(ctx, g, &conn)
			if err != nil {
				return err
			}
			defer s.Close()
			rep := collectStatus(ctx, g, &conn, s, lateAfter, clockOffset)
			if ok, err := printStructured(cmd.OutOrStdout(), format, rep); ok {
				if err != nil {
					return err
				}
			} else {
				printStatus(cmd.OutOrStdout(), rep)
			}
			if len(rep.Errors) > 0 {
				return fmt.Errorf("status incomplete: %s", strings.Join(rep.Errors, "; "))
			}
			return nil
		},
	}
	addOutput(cmd, &output, outTable, outWide, outJSON, outYAML)
	cmd.Flags().DurationVar(&lateAfter, "late-after", stall.DefaultLateAfter, "list an entry as late when its tick is overdue (due time plus jitter) for longer than this")
	cmd.Flags().DurationVar(&clockOffset, "test-clock-offset", 0, "TEST ONLY: run this command's local clock this far off, to test clock skew")
	_ = cmd.Flags().MarkHidden("test-clock-offset")
	addConn(cmd, &conn, true)
	return cmd
}

// addReplicaReports adds what each replica reports of itself: its
// warnings, and its relay's view of Redis replication.
func (rep *statusReport) addReplicaReports() {
	for _, r := range rep.Replicas {
		for _, w := range r.Warnings {
			rep.Warnings = append(rep.Warnings, "replica "+r.ID+": "+w)
		}
		if w, note := redisWaitReport(r.ID, r.RedisWait); w != "" {
			rep.Warnings = append(rep.Warnings, w)
		} else if note != "" {
			rep.Notes = append(rep.Notes, note)
		}
	}
}

// redisWaitReport says what a replica's relay reports of Redis replication
// (--redis-wait-replicas): a warning while it publishes events the
// replicas have not confirmed, else a note when it did earlier.
func redisWaitReport(id string, w *relay.WaitStatus) (warning, note string) {
	switch {
	case w == nil:
	case w.Behind:
		return fmt.Sprintf("replica %s: publishing events whose Redis writes its replicas have not confirmed (WAIT for %d: %s) since %s, %d so far; a Redis failover now may lose their tasks (the restore then records the loss)",
			id, w.Replicas, w.Reason, fmtTime(w.Since), w.Unconfirmed), ""
	case w.Unconfirmed > 0:
		return "", fmt.Sprintf("replica %s published %d events its Redis replicas had not confirmed (header %s); they confirm again", id, w.Unconfirmed, events.HeaderRedisUnconfirmed)
	}
	return "", ""
}

// maxRetentionWarnings bounds the entries status names one by one for a
// catch-up window longer than the activity retention.
const maxRetentionWarnings = 20

func collectStatus(ctx context.Context, g *globalFlags, conn *connFlags, s *session, lateAfter, clockOffset time.Duration) statusReport {
	lateAfter = max(lateAfter, time.Second)
	rep := statusReport{Prefix: s.names.Prefix(), Replicas: []replica.Status{}, Queues: []queueStatus{},
		NextFires: []nextFireView{}, Late: []stall.Late{}, LateAfter: lateAfter.String(), Warnings: []string{}, Notes: []string{recovererNote},
		Outbox: outboxStatus{ByQueue: map[string]int64{}}}
	fail := func(what string, err error) { rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", what, err)) }

	// The replicas stamp their beats and decide what is due on their
	// clock, corrected to Redis TIME; ages and next fires are taken on the
	// same clock, so a host whose own clock is off shows what they see.
	store, rc, storeErr := openStore(ctx, g, conn)
	if storeErr == nil {
		defer rc.Close()
	}
	clk, synced := clock.New(nil, clock.Options{LocalOffset: clockOffset}), false
	if storeErr == nil {
		clk = clock.New(store.Time, clock.Options{LocalOffset: clockOffset})
		if err := clk.Sync(ctx); err != nil {
			fail("redis time", err)
		} else {
			synced = true
		}
	}
	if !synced {
		rep.Notes = append(rep.Notes, "Redis TIME could not be read: beat ages, next fires and ended entries are by this host's clock")
	}
	now := clk.Now()

	// Replicas, read as the console's overview reads them: live ones and
	// unresponsive ones (no beat for three heartbeats) until the bucket
	// drops them.
	replicas, err := replica.ReadStatuses(ctx, s.js, s.names, now)
	switch {
	case errors.Is(err, replica.ErrNoReplicasBucket):
		rep.Warnings = append(rep.Warnings, err.Error()+": replicas cannot beat, and each keeps the last replicas it knew")
	case err != nil:
		fail("replicas", err)
	}
	rep.Replicas = replicas
	rep.addReplicaReports()
	var states []projector.State // nil: the projection could not be read
	var ptrs []*projector.State  // states, for entrystate
	// What the replicas report stands until it is computed here.
	rep.Late = mergeLate(nil, rep.Replicas, true)

	// Streams.
	var activityMaxAge time.Duration // 0: unknown or kept forever
	for _, p := range []struct {
		name string
		dst  *streamPosition
	}{{s.names.ConfigStream(), &rep.Config}, {s.names.ActivityStream(), &rep.Activity}} {
		p.dst.Stream = p.name
		st, err := s.js.Stream(ctx, p.name)
		if err != nil {
			fail(p.name, err)
			continue
		}
		info := st.CachedInfo()
		p.dst.LastSeq, p.dst.Messages = info.State.LastSeq, info.State.Msgs
		if p.name == s.names.ActivityStream() {
			activityMaxAge = info.Config.MaxAge
		}
		if !info.State.LastTime.IsZero() {
			t := info.State.LastTime.UTC()
			p.dst.LastTime = &t
		}
	}

	// Entries: a projection of our own, run until caught up, is exactly
	// what a replica sees (quarantine included).
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	proj, err := projector.New(projector.Config{JS: s.js, Names: s.names, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil {
		err = proj.Start(pctx)
	}
	if err != nil {
		fail("entries", err)
	} else {
		if err := proj.WaitCaughtUp(pctx); err != nil {
			fail("entries", fmt.Errorf("projection did not catch up: %w", err))
		}
		entries, bad := proj.Entries(), proj.Quarantined()
		_ = proj.Stop(pctx) // nothing to drain: never fails
		states = entries
		for i := range states {
			ptrs = append(ptrs, &states[i])
		}
		// Counted with nothing completed until Redis is read.
		rep.Entries.Counts = entrystate.Count(ptrs, nil, now)
		var fires []nextFireView
		beyond := 0
		for _, st := range entries {
			if err := events.CatchupBeyondRetention(st.Entry, activityMaxAge); err != nil {
				if beyond++; beyond <= maxRetentionWarnings {
					rep.Warnings = append(rep.Warnings, err.Error())
				}
			}
			switch entrystate.Of(st.Entry, now) {
			case entrystate.Ended:
				continue
			case entrystate.Paused:
				if strings.HasPrefix(st.Entry.Note, failpause.NotePrefix) && len(rep.Entries.FailurePaused) < maxFailurePaused {
					rep.Entries.FailurePaused = append(rep.Entries.FailurePaused, quarantineView{ID: st.Entry.ID, Revision: st.Revision, Time: st.Time.UTC(), Reason: st.Entry.Note})
				}
				continue
			}
			if t, ok := nextFire(st.Entry, now); ok {
				fires = append(fires, nextFireView{Entry: st.Entry.ID, Queue: st.Entry.Options.QueueName(), Time: t})
			}
		}
		slices.SortFunc(fires, func(a, b nextFireView) int {
			if c := a.Time.Compare(b.Time); c != 0 {
				return c
			}
			return strings.Compare(a.Entry, b.Entry)
		})
		if beyond > maxRetentionWarnings {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%d more entries have a catch-up window longer than the activity stream's retention", beyond-maxRetentionWarnings))
		}
		if fires != nil { // trimmed to maxNextFires once completed entries are known
			rep.NextFires = fires
		}
		rep.Entries.Quarantined = len(bad)
		for _, q := range bad {
			rep.Entries.Bad = append(rep.Entries.Bad, quarantineView{ID: q.ID, Revision: q.Seq, Time: q.Time.UTC(), Reason: q.Reason})
		}
	}

	// Redis: outbox, queues, configuration.
	// What cannot be read is null with its error, never a zero.
	if err := storeErr; err != nil {
		fail("redis", err)
		rep.Outbox = outboxStatus{Error: err.Error()}
		rep.Queues, rep.QueuesErr = nil, err.Error()
		rep.NextFires = rep.NextFires[:min(len(rep.NextFires), maxNextFires)]
		return rep
	}
	rep.Warnings = append(rep.Warnings, replica.RedisWarnings(ctx, rc)...)
	if states != nil {
		var warnings []string
		rep.Shards, warnings = collectShards(ctx, store, s.names, states, rep.Replicas)
		rep.Warnings = append(rep.Warnings, warnings...)
	}
	// An active limited entry whose counter reached its limit is completed
	// (docs/design.md INV-max-fires).
	if left, err := entrystate.FiresLeft(ctx, store, s.names.Prefix(), ptrs); err != nil {
		fail("completed entries", err)
	} else {
		rep.Entries.Counts = entrystate.Count(ptrs, left, now)
		for _, st := range ptrs {
			if entrystate.Current(st, left, now) != entrystate.Completed {
				continue
			}
			id := st.Entry.ID
			if len(rep.Entries.CompletedIDs) < maxFailurePaused {
				rep.Entries.CompletedIDs = append(rep.Entries.CompletedIDs, id)
			}
			if left[id].Unknown && len(rep.Entries.CountUnknown) < maxFailurePaused {
				rep.Entries.CountUnknown = append(rep.Entries.CountUnknown, id)
			}
			// It fires nothing more.
			rep.NextFires = slices.DeleteFunc(rep.NextFires, func(f nextFireView) bool { return f.Entry == id })
		}
	}
	rep.NextFires = rep.NextFires[:min(len(rep.NextFires), maxNextFires)]
	if states != nil && synced {
		late, err := stall.Check(ctx, store, s.names, states, clk.Now(), lateAfter)
		if err != nil {
			// Some queues could not be read: keep what the replicas
			// report for the entries not computed here.
			fail("late entries", err)
		}
		rep.Late = mergeLate(late, rep.Replicas, err != nil)
	}
	outboxQueues, err := store.OutboxQueues(ctx, s.names.Prefix())
	var backlog int64
	outboxErr := err
	for _, q := range outboxQueues {
		n, err := store.OutboxLen(ctx, s.names.Prefix(), q)
		if err != nil {
			outboxErr = err
			continue
		}
		rep.Outbox.ByQueue[q] = n
		backlog += n
	}
	if outboxErr != nil {
		fail("outbox", outboxErr)
		rep.Outbox.Error = outboxErr.Error()
	} else {
		rep.Outbox.Backlog = &backlog
	}
	queues, err := store.Queues(ctx)
	if err != nil {
		fail("queues", err)
		rep.QueuesErr = err.Error()
	}
	for _, q := range outboxQueues {
		if !slices.Contains(queues, q) {
			queues = append(queues, q)
		}
	}
	slices.Sort(queues)
	for _, q := range queues {
		qs, err := store.QueueStats(ctx, q)
		if err != nil {
			fail("queue "+q, err)
			continue
		}
		v := queueView(qs, rep.Outbox.ByQueue[q])
		if v.Held, v.HeldDropped, err = store.HeldCounts(ctx, s.names.Prefix(), q); err != nil {
			fail("queue "+q, err)
		}
		rep.Queues = append(rep.Queues, v)
	}
	return rep
}

// mergeLate adds to each late entry the reason a replica reports for it in
// its heartbeat (the last refusal or error its fires met); with
// addReported, the entries only replicas report late are added too.
func mergeLate(late []stall.Late, replicas []replica.Status, addReported bool) []stall.Late {
	reported := map[string]stall.Late{}
	for _, r := range replicas {
		for _, l := range r.Late {
			if prev, ok := reported[l.Entry]; !ok || prev.Reason == "" && l.Reason != "" {
				if l.Reason != "" {
					l.Replica = r.ID
				}
				reported[l.Entry] = l
			}
		}
	}
	computed := make(map[string]bool, len(late))
	for i := range late {
		computed[late[i].Entry] = true
		if r, ok := reported[late[i].Entry]; ok && late[i].Reason == "" {
			late[i].Reason, late[i].Replica = r.Reason, r.Replica
		}
	}
	if addReported {
		for id, l := range reported {
			if !computed[id] {
				late = append(late, l)
			}
		}
		slices.SortFunc(late, func(a, b stall.Late) int {
			if c := a.Tick.Compare(b.Tick); c != 0 {
				return c
			}
			return strings.Compare(a.Entry, b.Entry)
		})
	}
	if late == nil {
		return []stall.Late{}
	}
	return late
}

func queueView(qs taskstate.QueueStats, outbox int64) queueStatus {
	return queueStatus{Queue: qs.Queue, Pending: qs.Pending, Active: qs.Active, Scheduled: qs.Scheduled,
		Retry: qs.Retry, Archived: qs.Archived, Completed: qs.Completed, Processed: qs.Processed,
		Failed: qs.Failed, ProcessedToday: qs.ProcessedToday, FailedToday: qs.FailedToday,
		Paused: qs.Paused, Outbox: outbox}
}

// printable replaces control characters, so text from errors cannot drive
// the terminal.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return '?'
		}
		return r
	}, s)
}

// printReplicas prints the Replicas section: live and unresponsive ones.
func printReplicas(w io.Writer, r statusReport) {
	live := 0
	for _, x := range r.Replicas {
		if x.State == replica.StateLive {
			live++
		}
	}
	fmt.Fprintf(w, "Replicas: %d live", live)
	if n := len(r.Replicas) - live; n > 0 {
		fmt.Fprintf(w, ", %d unresponsive", n)
	}
	fmt.Fprintln(w)
	if len(r.Replicas) > 0 {
		tw := newTable(w)
		fmt.Fprintln(tw, "  ID\tSTATE\tHOST\tPID\tVERSION\tSTARTED\tLAST BEAT\tCONFIG SEQ\tLAG\tFIRES/S SHOWN\tHTTP\tREADY")
		for _, x := range r.Replicas {
			lag := "-"
			if r.Config.LastSeq >= x.ConfigSeq {
				lag = fmt.Sprint(r.Config.LastSeq - x.ConfigSeq)
			}
			shown := "unknown"
			if x.FireCapacity > 0 {
				shown = forecast.Thousands(int64(x.FireCapacity))
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\t%s ago\t%d\t%s\t%s\t%s\t%s\n", terminalSafe(x.ID), x.State, terminalSafe(x.Host), x.PID, terminalSafe(dash(x.Version)), fmtTime(x.Started), x.BeatAge, x.ConfigSeq, lag, shown, terminalSafe(dash(x.HTTP)), terminalSafe(x.Ready))
		}
		tw.Flush()
	}
	if live == 0 {
		fmt.Fprintln(w, "  no live replica: no entry fires and no task is recovered until one runs (cronstream run)")
	}
	printShards(w, r.Shards)
}

func printStatus(w io.Writer, r statusReport) {
	fmt.Fprintf(w, "cronstream status (prefix %s)\n\n", r.Prefix)

	printReplicas(w, r)

	fmt.Fprintf(w, "\nEntries: %d active, %d paused, %d ended, %d completed, %d quarantined\n", r.Entries.Active, r.Entries.Paused, r.Entries.Ended, r.Entries.Completed, r.Entries.Quarantined)
	for _, q := range r.Entries.Bad {
		fmt.Fprintf(w, "  quarantined %s at revision %d (%s): %s\n", terminalSafe(q.ID), q.Revision, fmtTime(q.Time), terminalSafe(q.Reason))
	}
	for _, q := range r.Entries.FailurePaused {
		fmt.Fprintf(w, "  paused %s at revision %d (%s): %s\n", terminalSafe(q.ID), q.Revision, fmtTime(q.Time), terminalSafe(q.Reason))
	}
	for _, id := range r.Entries.CompletedIDs {
		if slices.Contains(r.Entries.CountUnknown, id) {
			fmt.Fprintf(w, "  completed %s: %s\n", terminalSafe(id), maxFiresUnknownReason)
			continue
		}
		fmt.Fprintf(w, "  completed %s: fired its max_fires, fires nothing more\n", terminalSafe(id))
	}

	fmt.Fprintln(w, "\nStreams:")
	for _, p := range []streamPosition{r.Config, r.Activity} {
		last := "-"
		if p.LastTime != nil {
			last = fmtTime(*p.LastTime)
		}
		fmt.Fprintf(w, "  %-24s last seq %d at %s, %d messages\n", p.Stream, p.LastSeq, last, p.Messages)
	}

	backlog := "unknown (see below)"
	if r.Outbox.Backlog != nil {
		backlog = fmt.Sprint(*r.Outbox.Backlog)
	}
	fmt.Fprintf(w, "\nOutbox backlog (in Redis, not yet in %s): %s\n", r.Activity.Stream, backlog)

	fmt.Fprintln(w, "\nQueues:")
	switch {
	case r.QueuesErr != "":
		fmt.Fprintln(w, "  unknown (see below)")
	case len(r.Queues) == 0:
		fmt.Fprintln(w, "  none yet")
	default:
		tw := newTable(w)
		fmt.Fprintln(tw, "  QUEUE\tPENDING\tACTIVE\tSCHEDULED\tRETRY\tARCHIVED\tPROCESSED\tFAILED\tTODAY OK/FAILED\tOUTBOX\tPAUSED")
		for _, q := range r.Queues {
			paused := "-"
			if q.Paused {
				paused = "yes"
			}
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d/%d\t%d\t%s\n", terminalSafe(q.Queue), q.Pending, q.Active, q.Scheduled,
				q.Retry, q.Archived, q.Processed, q.Failed, q.ProcessedToday-q.FailedToday, q.FailedToday, q.Outbox, paused)
		}
		tw.Flush()
		for _, q := range r.Queues {
			if q.Held > 0 || q.HeldDropped > 0 {
				fmt.Fprintf(w, "  %s: %d held tick(s) waiting (overlap buffer-one), %d dropped unfired (skipped: overlap-dropped)\n",
					terminalSafe(q.Queue), q.Held, q.HeldDropped)
			}
		}
	}

	fmt.Fprintln(w, "\nNext fires:")
	if len(r.NextFires) == 0 {
		fmt.Fprintln(w, "  none")
	} else {
		tw := newTable(w)
		for _, f := range r.NextFires {
			fmt.Fprintf(tw, "  %s\t(in %s)\t%s\tqueue %s\n", fmtTime(f.Time), time.Until(f.Time).Round(time.Second), terminalSafe(f.Entry), terminalSafe(f.Queue))
		}
		tw.Flush()
	}

	fmt.Fprintf(w, "\nLate (tick overdue for more than %s): %d\n", r.LateAfter, len(r.Late))
	if len(r.Late) > 0 {
		tw := newTable(w)
		fmt.Fprintln(tw, "  ENTRY\tQUEUE\tTICK\tOVERDUE\tREASON")
		for _, l := range r.Late {
			why := "no failure reported by a replica"
			if l.Reason != "" {
				why = printable(l.Reason)
				if l.Replica != "" {
					why += " (" + printable(l.Replica) + ")"
				}
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", printable(l.Entry), printable(l.Queue), fmtTime(l.Tick),
				(time.Duration(l.OverdueSeconds) * time.Second).String(), why)
		}
		tw.Flush()
	}

	if len(r.Warnings) > 0 {
		fmt.Fprintln(w, "\nWarnings:")
		for _, x := range r.Warnings {
			fmt.Fprintf(w, "  ! %s\n", terminalSafe(x))
		}
	}
	fmt.Fprintln(w, "\nNote:")
	for _, x := range r.Notes {
		fmt.Fprintf(w, "  %s\n", x)
	}
	if len(r.Errors) > 0 {
		fmt.Fprintln(w, "\nCould not read:")
		for _, x := range r.Errors {
			fmt.Fprintf(w, "  %s\n", terminalSafe(x))
		}
	}
}
