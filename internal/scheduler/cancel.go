package scheduler

import (
	"cmp"
	"context"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// Overlap cancel-previous. The fire script replaces a busy previous task:
// a waiting one is deleted in the step that fires the tick (replacedWaiting
// accounts for it); for a running one the tick is held, as buffer-one
// holds it, and this replica publishes the task's cancellation on asynq's
// cancel channel (sendCancels). asynq cancels the handler's context and
// moves the task to retry; the release check (releaseHeld) then deletes it
// and fires the held tick in one step (releaseCancel). Publishing is not
// part of any atomic step: a lost publish is sent again by whichever
// replica checks the held tick later (cancelResendEvery), and more than one
// replica publishing is harmless.

// cancelResendEvery is how long a held tick waits for its previous task to
// stop before this replica publishes the cancellation again (the first
// publish was lost, or its replica died before sending it).
const cancelResendEvery = 5 * time.Second

// heldCancel is a running task a fire of this replica replaced.
type heldCancel struct{ queue, entry, task string }

// cancelPreviousFire sets f up for overlap cancel-previous: the overlap
// record of a tick skipped while one is held, and the cancelled record of
// the task it replaces.
func (s *Scheduler) cancelPreviousFire(r *entryRun, f taskstate.Fire, now time.Time) (taskstate.Fire, error) {
	var err error
	f.OverlapCancel = true
	if f.OverlapRecord, err = s.skippedRecord(r, tickRange{First: f.Tick, Last: f.Tick, Count: 1, Exact: true}, events.SkipOverlap, now); err != nil {
		return f, err
	}
	id := events.CancelledEventID(r.id, f.Tick)
	ev, err := events.NewEventAt(id, now, events.TypeTaskCancelled, s.source(), r.id, events.TaskCancelled{
		Entry: r.id, Queue: r.queue, ScheduledAt: f.Tick.UTC(), ReplacedBy: f.Msg.ID,
		Revision: r.st.Revision, Replica: s.cfg.ReplicaID,
		TaskID: taskstate.CancelPlaceholderTask, State: taskstate.CancelPlaceholderState, Action: taskstate.CancelPlaceholderAction,
	})
	if err != nil {
		return f, err
	}
	data, err := ev.Marshal()
	if err != nil {
		return f, err
	}
	f.CancelRecord, err = taskstate.NewCancelRecord(id, data)
	return f, err
}

// replacedWaiting accounts for a waiting previous task a fire deleted.
func (s *Scheduler) replacedWaiting(r *entryRun, tick time.Time, res taskstate.FireResult) {
	s.m.Cancels.WithLabelValues(cancelDeleted).Inc()
	s.log.Info("overlap cancel-previous: deleted the waiting previous task and fired the tick", "entry", r.id, "tick", tick,
		"deleted", res.Replaced, "state", res.ReplacedState, "task", res.TaskID)
}

// sendCancels publishes the cancellation of the running tasks the last
// fire pass replaced.
func (s *Scheduler) sendCancels(ctx context.Context) {
	for _, c := range s.held.cancels {
		s.sendCancel(ctx, c, "the tick is held until it stops")
	}
	s.held.cancels = s.held.cancels[:0]
	// A tick another replica released is never seen here again: forget
	// what was sent long ago (a tick still held is sent again at most once
	// more).
	now := s.clock.Mono()
	for task, at := range s.held.sent {
		if now.Add(-cancelForgetAfter).Before(at) {
			continue
		}
		delete(s.held.sent, task)
	}
}

// cancelForgetAfter is how long this replica remembers publishing a
// cancellation.
const cancelForgetAfter = time.Minute

func (s *Scheduler) sendCancel(ctx context.Context, c heldCancel, why string) {
	if err := s.broker.PublishCancel(ctx, c.task); err != nil {
		s.countError()
		s.log.Warn("cannot publish a task's cancellation; will retry", "entry", c.entry, "queue", c.queue, "task", c.task, "err", err)
		return
	}
	if s.held.sent == nil {
		s.held.sent = map[string]clock.Mono{}
	}
	s.held.sent[c.task] = s.clock.Mono()
	s.m.Cancels.WithLabelValues(cancelSent).Inc()
	s.log.Info("overlap cancel-previous: cancelling the running previous task; "+why, "entry", c.entry, "queue", c.queue, "task", c.task)
}

// releaseCancel is releaseHeld's step for a tick held by cancel-previous:
// how and fences as a buffer-one release's, reason why it is dropped ("" =
// to be fired). A fired tick's record in asynq's enqueue history is
// returned (released).
func (s *Scheduler) releaseCancel(ctx context.Context, fences taskstate.Fences, h taskstate.HeldTick, how taskstate.HeldRelease, reason string) (taskstate.EnqueueEventRecord, bool) {
	out, err := s.broker.ReleaseCancel(ctx, fences, h, how)
	if err != nil {
		s.countError()
		s.log.Warn("cannot release held tick; will retry", "entry", h.Entry, "tick", h.Tick, "err", err)
		return taskstate.EnqueueEventRecord{}, false
	}
	var rec taskstate.EnqueueEventRecord
	recorded := false
	if out.Deleted != "" {
		s.m.Cancels.WithLabelValues(cancelDeleted).Inc()
		s.log.Info("overlap cancel-previous: deleted the cancelled previous task", "entry", h.Entry, "task", h.PrevTaskID, "state", out.Deleted)
	}
	switch out.Outcome {
	case taskstate.HeldWaiting:
		// Still running: publish again when the cancellation seems lost.
		now := s.clock.Mono()
		last, sent := s.held.sent[h.PrevTaskID]
		if (!sent && s.clock.Now().Sub(h.HeldAt) >= cancelResendEvery) || (sent && !now.Before(last.Add(cancelResendEvery))) {
			s.sendCancel(ctx, heldCancel{queue: h.Queue, entry: h.Entry, task: h.PrevTaskID}, "it is still running")
		}
		return rec, false
	case taskstate.HeldReleased:
		rec, recorded = s.released(h)
		if out.GaveUp {
			s.log.Warn("overlap cancel-previous: fired the held tick while the previous task is still active past its timeout (its worker is gone or ignores cancellation; the recoverer handles its lease)",
				"entry", h.Entry, "tick", h.Tick, "task", h.TaskID, "previous", h.PrevTaskID)
		} else {
			s.log.Debug("held tick released", "entry", h.Entry, "tick", h.Tick, "task", h.TaskID)
		}
	case taskstate.HeldDropped:
		// Without a reason of ours the script found the entry moved out of
		// the queue (its handover marker).
		s.droppedHeld(h, cmp.Or(reason, heldDropMoved))
	case taskstate.HeldExisted:
		s.droppedHeld(h, heldDropExisted)
	case taskstate.HeldFenced, taskstate.HeldStale:
		// Still held: a replica whose configuration is caught up decides.
		s.refusedHeld(h, out.Outcome)
		return rec, false
	}
	delete(s.held.sent, h.PrevTaskID)
	return rec, recorded
}
