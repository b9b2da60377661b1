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

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/entrystate"
	"github.com/cronstream/cronstream/internal/failpause"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/stall"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

// maxRetentionWarnings bounds the entries status names one by one for a
// catch-up window longer than the activity retention.
const maxRetentionWarnings = 20

// statusCollector fills a statusReport one section at a time. A step
// records what it could not read in the report's errors and leaves its
// section as it stands, so every other section is still shown; what a
// later step needs (the clock, the projection) it keeps here.
type statusCollector struct {
	s         *session
	rep       statusReport
	lateAfter time.Duration

	// clk is the replicas' clock: this host's, corrected to Redis TIME
	// when synced.
	clk    *clock.Clock
	synced bool
	now    time.Time
	// activityMaxAge is the activity stream's retention (0: unknown or
	// kept forever).
	activityMaxAge time.Duration
	// states is the projection (nil: it could not be read); ptrs points
	// into it, as entrystate takes it.
	states []projector.State
	ptrs   []*projector.State
}

// collectStatus reads every section of status. What cannot be read is
// null with its error in the report, never a zero.
func collectStatus(ctx context.Context, g *globalFlags, conn *connFlags, s *session, lateAfter, clockOffset time.Duration) statusReport {
	lateAfter = max(lateAfter, time.Second)
	c := &statusCollector{s: s, lateAfter: lateAfter, rep: statusReport{
		Prefix: s.names.Prefix(), Replicas: []replica.Status{}, Queues: []queueStatus{},
		NextFires: []nextFireView{}, Late: []stall.Late{}, LateAfter: lateAfter.String(), Warnings: []string{}, Notes: []string{recovererNote},
		Outbox: outboxStatus{ByQueue: map[string]int64{}},
	}}
	store, rc, storeErr := openStore(ctx, g, conn)
	if storeErr == nil {
		defer rc.Close()
	}
	c.syncClock(ctx, store, clockOffset)
	c.replicas(ctx)
	c.streams(ctx)
	c.entries(ctx)
	if storeErr != nil {
		c.withoutRedis(storeErr)
	} else {
		c.fromRedis(ctx, store, rc)
	}
	// Trimmed only now: completed entries, known from Redis, fire nothing.
	c.rep.NextFires = c.rep.NextFires[:min(len(c.rep.NextFires), maxNextFires)]
	return c.rep
}

func (c *statusCollector) fail(what string, err error) {
	c.rep.Errors = append(c.rep.Errors, fmt.Sprintf("%s: %v", what, err))
}

func (c *statusCollector) warn(w ...string) { c.rep.Warnings = append(c.rep.Warnings, w...) }

// syncClock takes the replicas' clock: they stamp their beats and decide
// what is due on their clock corrected to Redis TIME, so ages and next
// fires taken on the same clock show what they see even from a host whose
// own clock is off. store is nil when Redis could not be reached.
func (c *statusCollector) syncClock(ctx context.Context, store *taskstate.Store, offset time.Duration) {
	c.clk = clock.New(nil, clock.Options{LocalOffset: offset})
	if store != nil {
		c.clk = clock.New(store.Time, clock.Options{LocalOffset: offset})
		if err := c.clk.Sync(ctx); err != nil {
			c.fail("redis time", err)
		} else {
			c.synced = true
		}
	}
	if !c.synced {
		c.rep.Notes = append(c.rep.Notes, "Redis TIME could not be read: beat ages, next fires and ended entries are by this host's clock")
	}
	c.now = c.clk.Now()
}

// replicas reads the replicas as the console's overview reads them: live
// ones and unresponsive ones (no beat for three heartbeats) until the
// bucket drops them, with what each reports of itself.
func (c *statusCollector) replicas(ctx context.Context) {
	replicas, err := replica.ReadStatuses(ctx, c.s.js, c.s.names, c.now)
	switch {
	case errors.Is(err, replica.ErrNoReplicasBucket):
		c.warn(err.Error() + ": replicas cannot beat, and each keeps the last replicas it knew")
	case err != nil:
		c.fail("replicas", err)
	}
	c.rep.Replicas = replicas
	c.rep.addReplicaReports()
	// What the replicas report stands until it is computed here.
	c.rep.Late = mergeLate(nil, c.rep.Replicas, true)
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

// streams reads the last sequence and time of the config and activity
// streams, and the activity stream's retention.
func (c *statusCollector) streams(ctx context.Context) {
	for _, p := range []struct {
		name string
		dst  *streamPosition
	}{{c.s.names.ConfigStream(), &c.rep.Config}, {c.s.names.ActivityStream(), &c.rep.Activity}} {
		p.dst.Stream = p.name
		st, err := c.s.js.Stream(ctx, p.name)
		if err != nil {
			c.fail(p.name, err)
			continue
		}
		info := st.CachedInfo()
		p.dst.LastSeq, p.dst.Messages = info.State.LastSeq, info.State.Msgs
		if p.name == c.s.names.ActivityStream() {
			c.activityMaxAge = info.Config.MaxAge
		}
		if !info.State.LastTime.IsZero() {
			t := info.State.LastTime.UTC()
			p.dst.LastTime = &t
		}
	}
}

// entries reads the entries with a projection of its own, run until
// caught up: exactly what a replica sees, quarantine included.
func (c *statusCollector) entries(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	proj, err := projector.New(projector.Config{JS: c.s.js, Names: c.s.names, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil {
		err = proj.Start(pctx)
	}
	if err != nil {
		c.fail("entries", err)
		return
	}
	if err := proj.WaitCaughtUp(pctx); err != nil {
		c.fail("entries", fmt.Errorf("projection did not catch up: %w", err))
	}
	entries, bad := proj.Entries(), proj.Quarantined()
	_ = proj.Stop(pctx) // nothing to drain: never fails
	c.states = entries
	for i := range c.states {
		c.ptrs = append(c.ptrs, &c.states[i])
	}
	// Counted with nothing completed until Redis is read.
	c.rep.Entries.Counts = entrystate.Count(c.ptrs, nil, c.now)
	c.retentionWarnings()
	c.failurePaused()
	c.nextFires()
	c.rep.Entries.Quarantined = len(bad)
	for _, q := range bad {
		c.rep.Entries.Bad = append(c.rep.Entries.Bad, quarantineView{ID: q.ID, Revision: q.Seq, Time: q.Time.UTC(), Reason: q.Reason})
	}
}

// retentionWarnings names the entries whose catch-up window is longer
// than the activity stream keeps events, at most maxRetentionWarnings.
func (c *statusCollector) retentionWarnings() {
	beyond := 0
	for _, st := range c.states {
		if err := events.CatchupBeyondRetention(st.Entry, c.activityMaxAge); err != nil {
			if beyond++; beyond <= maxRetentionWarnings {
				c.warn(err.Error())
			}
		}
	}
	if beyond > maxRetentionWarnings {
		c.warn(fmt.Sprintf("%d more entries have a catch-up window longer than the activity stream's retention", beyond-maxRetentionWarnings))
	}
}

// failurePaused lists the entries paused on failure, with the reason in
// their note, at most maxFailurePaused.
func (c *statusCollector) failurePaused() {
	for _, st := range c.states {
		if entrystate.Of(st.Entry, c.now) != entrystate.Paused || !strings.HasPrefix(st.Entry.Note, failpause.NotePrefix) {
			continue
		}
		if len(c.rep.Entries.FailurePaused) < maxFailurePaused {
			c.rep.Entries.FailurePaused = append(c.rep.Entries.FailurePaused, quarantineView{ID: st.Entry.ID, Revision: st.Revision, Time: st.Time.UTC(), Reason: st.Entry.Note})
		}
	}
}

// nextFires lists the next tick of every active entry, soonest first.
func (c *statusCollector) nextFires() {
	var fires []nextFireView
	for _, st := range c.states {
		if entrystate.Of(st.Entry, c.now) != entrystate.Active {
			continue
		}
		if t, ok := nextFire(st.Entry, c.now); ok {
			fires = append(fires, nextFireView{Entry: st.Entry.ID, Queue: st.Entry.Options.QueueName(), Time: t})
		}
	}
	slices.SortFunc(fires, func(a, b nextFireView) int {
		if n := a.Time.Compare(b.Time); n != 0 {
			return n
		}
		return strings.Compare(a.Entry, b.Entry)
	})
	if fires != nil {
		c.rep.NextFires = fires
	}
}

// withoutRedis marks every section read from Redis unknown.
func (c *statusCollector) withoutRedis(err error) {
	c.fail("redis", err)
	c.rep.Outbox = outboxStatus{Error: err.Error()}
	c.rep.Queues, c.rep.QueuesErr = nil, err.Error()
}

// fromRedis reads the sections Redis holds, and what of the others only
// Redis can tell (completed entries, late ones).
func (c *statusCollector) fromRedis(ctx context.Context, store *taskstate.Store, rc redis.UniversalClient) {
	c.warn(replica.RedisWarnings(ctx, rc)...)
	if c.states != nil {
		overview, warnings := collectShards(ctx, store, c.s.names, c.states, c.rep.Replicas)
		c.rep.Shards = overview
		c.warn(warnings...)
	}
	c.completed(ctx, store)
	c.late(ctx, store)
	c.queues(ctx, store, c.outbox(ctx, store))
}

// completed counts an active limited entry whose counter reached its
// limit as completed (docs/design.md INV-max-fires), and drops it from the
// next fires: it fires nothing more.
func (c *statusCollector) completed(ctx context.Context, store *taskstate.Store) {
	left, err := entrystate.FiresLeft(ctx, store, c.s.names.Prefix(), c.ptrs)
	if err != nil {
		c.fail("completed entries", err)
		return
	}
	c.rep.Entries.Counts = entrystate.Count(c.ptrs, left, c.now)
	for _, st := range c.ptrs {
		if entrystate.Current(st, left, c.now) != entrystate.Completed {
			continue
		}
		id := st.Entry.ID
		if len(c.rep.Entries.CompletedIDs) < maxFailurePaused {
			c.rep.Entries.CompletedIDs = append(c.rep.Entries.CompletedIDs, id)
		}
		if left[id].Unknown && len(c.rep.Entries.CountUnknown) < maxFailurePaused {
			c.rep.Entries.CountUnknown = append(c.rep.Entries.CountUnknown, id)
		}
		c.rep.NextFires = slices.DeleteFunc(c.rep.NextFires, func(f nextFireView) bool { return f.Entry == id })
	}
}

// late computes the late entries from the projection and the watermarks
// in Redis, on the replicas' clock (so not when it could not be synced).
func (c *statusCollector) late(ctx context.Context, store *taskstate.Store) {
	if c.states == nil || !c.synced {
		return
	}
	late, err := stall.Check(ctx, store, c.s.names, c.states, c.clk.Now(), c.lateAfter)
	if err != nil {
		// Some queues could not be read: keep what the replicas report
		// for the entries not computed here.
		c.fail("late entries", err)
	}
	c.rep.Late = mergeLate(late, c.rep.Replicas, err != nil)
}

// outbox reads the relay's backlog per queue; it returns the queues that
// have an outbox.
func (c *statusCollector) outbox(ctx context.Context, store *taskstate.Store) []string {
	prefix := c.s.names.Prefix()
	queues, err := store.OutboxQueues(ctx, prefix)
	var backlog int64
	for _, q := range queues {
		n, qerr := store.OutboxLen(ctx, prefix, q)
		if qerr != nil {
			err = qerr
			continue
		}
		c.rep.Outbox.ByQueue[q] = n
		backlog += n
	}
	if err != nil {
		c.fail("outbox", err)
		c.rep.Outbox.Error = err.Error()
	} else {
		c.rep.Outbox.Backlog = &backlog
	}
	return queues
}

// queues reads asynq's sizes and counters of every queue, those that only
// have an outbox too, and the ticks overlap buffer-one holds in each.
func (c *statusCollector) queues(ctx context.Context, store *taskstate.Store, outboxQueues []string) {
	queues, err := store.Queues(ctx)
	if err != nil {
		c.fail("queues", err)
		c.rep.QueuesErr = err.Error()
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
			c.fail("queue "+q, err)
			continue
		}
		v := queueView(qs, c.rep.Outbox.ByQueue[q])
		if v.Held, v.HeldDropped, err = store.HeldCounts(ctx, c.s.names.Prefix(), q); err != nil {
			c.fail("queue "+q, err)
		}
		c.rep.Queues = append(c.rep.Queues, v)
	}
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
