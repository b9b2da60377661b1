package scheduler

import (
	"context"
	"time"

	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

// historyTrimEvery: an entry's asynq enqueue history is trimmed to asynq's
// 1,000 events on every 16th event this replica records for it (and on the
// first), so it holds at most 15 more per replica between trims.
const historyTrimEvery = 16

// writeHistory records asynq's enqueue history beside the loop, so the
// loop does not wait for it.
func (s *Scheduler) writeHistory() {
	for recs := range s.history {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.broker.RecordSchedulerEnqueueEvents(ctx, recs); err != nil {
			s.log.Debug("record asynq enqueue history", "events", len(recs), "err", err)
		}
		cancel()
	}
}

// visibilityGap is how far the next due fire must be for asynq's entries
// to be rewritten: the rewrite writes every entry in one go, which must not
// land on a burst of fires (its cost is in docs/benchmarks.md).
const visibilityGap = time.Second

// maybeWriteVisibility starts the pending rewrite of asynq's scheduler
// entries when nothing is due within visibilityGap; when entries are due
// all the time (every second), right after a tick's fires once it waited
// half a period (after the last pass of a burst larger than one pass, not
// between its passes: the snapshot holds the loop, and the rewrite Redis);
// and after a whole period in any case (the entries expire after two).
func (s *Scheduler) maybeWriteVisibility(afterFire bool) {
	if !s.visPending {
		return
	}
	waited := s.clock.Since(s.visSince)
	bursting := len(s.backlog) > 0
	quiet := !bursting
	if at, ok := s.heap.peek(); ok && at.Sub(s.clock.Now()) < visibilityGap {
		quiet = false
	}
	afterTick := afterFire && !bursting
	if !quiet && !(afterTick && waited >= s.cfg.Visibility/2) && waited < s.cfg.Visibility {
		return
	}
	if len(s.vis) > 0 {
		return // the last snapshot is not even taken up yet: stay pending
	}
	s.placeFarOff() // the snapshot reads every run as applied
	if entries, ok := s.visibilitySnapshot(); ok {
		s.vis <- entries // the loop is the only sender: there is room
	}
	s.visPending = false
}

// writeVisibilityLoop writes the snapshots the loop hands over, beside it.
func (s *Scheduler) writeVisibilityLoop() {
	id := taskstate.ReplicaSchedulerID(s.cfg.Names.Prefix(), s.cfg.ReplicaID)
	wrote := false
	for entries := range s.vis {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := s.broker.WriteSchedulerEntries(ctx, id, entries, 2*s.cfg.Visibility); err != nil {
			s.log.Debug("write asynq scheduler entries", "err", err)
		}
		cancel()
		wrote = true
	}
	if wrote {
		// Stopped: the entries are the next owners' to list, as an asynq
		// scheduler clears its own at shutdown.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := s.broker.ClearSchedulerEntries(ctx, id); err != nil {
			s.log.Debug("clear asynq scheduler entries", "err", err)
		}
		cancel()
	}
}

// visibilitySnapshot lists asynq's scheduler entries for ours, so
// `asynq cron ls` lists them. Each replica lists the entries of the shards
// it owns under a scheduler id of its own, as each asynq scheduler does,
// so the cost follows its share and the previous enqueue time is the one
// it knows. asynq's SchedulerEntry has no paused field: a paused entry is
// listed with its spec marked (taskstate.PausedSpec) and no next enqueue
// time (docs/asynq-compat.md).
func (s *Scheduler) visibilitySnapshot() ([]taskstate.SchedulerEntry, bool) {
	out := make([]taskstate.SchedulerEntry, 0, len(s.entries))
	// Most entries share their options: each distinct set is written out
	// once per snapshot, and its strings shared (the encoder only reads).
	optionStrings := map[taskstate.EnqueueOptions][]string{}
	for _, r := range s.entries {
		if r.state.removed() {
			continue
		}
		var prev time.Time
		if r.hasCursor {
			prev = r.cursor
		}
		switch {
		case r.st.Entry.Paused:
			out = append(out, schedulerEntry(r.id, r.st, time.Time{}, prev, optionStrings))
		case r.sched != nil:
			out = append(out, schedulerEntry(r.id, r.st, r.next(), prev, optionStrings))
		}
	}
	return out, true
}

// schedulerEntry is asynq's view of entry id in state st; optionStrings
// memoizes the options' strings.
func schedulerEntry(id string, st projector.State, next, prev time.Time, optionStrings map[taskstate.EnqueueOptions][]string) taskstate.SchedulerEntry {
	e := st.Entry
	opts := taskstate.EnqueueOptions{
		Queue: e.Options.QueueName(), MaxRetry: e.Options.Retries(), Timeout: e.Options.Timeout.D(),
		Unique: e.Options.Unique.D(), Retention: e.Options.Retention.D(), Group: e.Options.Group,
	}
	strs, ok := optionStrings[opts]
	if !ok {
		strs = opts.Strings()
		optionStrings[opts] = strs
	}
	spec := e.Cron
	if e.Paused {
		spec = taskstate.PausedSpec(spec)
	}
	return taskstate.SchedulerEntry{
		ID: id, Spec: spec, TaskType: e.Task.Type, TaskPayload: e.Task.Payload,
		EnqueueOptions: strs, Next: next, Prev: prev,
	}
}
