package scheduler

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

// heldCheckEvery is how often the loop looks for held ticks to release
// (overlap buffer-one): a held tick fires within this long of its previous
// task leaving the busy states. Only the owner of the entry's shard
// releases it, so this alone bounds the wait (a worker then takes up to a
// second more to pick the task up).
const heldCheckEvery = 250 * time.Millisecond

// heldSweepEvery is how often the check also reads the held-tick index of
// every queue asynq knows (asynq:queues, which every fire adds its queue
// to), and does at its first run: a held tick whose entry was removed,
// paused or moved off buffer-one while no replica ran sits in a queue none
// of this replica's buffer-one entries uses, and would otherwise never be
// looked at again.
const heldSweepEvery = time.Minute

// Why a held tick is dropped rather than fired: the reason label of
// cronstream_held_dropped_total and the log line's.
const (
	heldDropPaused    = "paused"    // the entry is paused
	heldDropRemoved   = "removed"   // the entry was removed
	heldDropMoved     = "moved"     // the entry moved to another queue
	heldDropPolicy    = "policy"    // the entry's overlap policy no longer holds ticks
	heldDropExisted   = "existed"   // its task existed already (fired otherwise)
	heldDropCompleted = "completed" // the entry's max_fires is reached
)

// heldDropReasons are the reasons a held tick is dropped, for the metric's
// series to exist from the start.
var heldDropReasons = []string{heldDropPaused, heldDropRemoved, heldDropMoved, heldDropPolicy, heldDropExisted, heldDropCompleted}

// holdsTicks reports whether overlap policy o keeps a held tick to fire
// later; a held tick of an entry whose policy does not is dropped, as
// Temporal drops a buffered action when the policy changes.
func holdsTicks(o events.OverlapPolicy) bool {
	return o == events.OverlapBufferOne || o == events.OverlapCancelPrevious
}

// heldDropReason is why a held tick in queue of an entry whose registered
// state is st (known false: the projection holds none) is dropped, or ""
// when it is to be fired.
func heldDropReason(st projector.State, known bool, queue string) string {
	switch {
	case !known:
		return heldDropRemoved
	case st.Entry.Paused:
		return heldDropPaused
	case st.Entry.Options.QueueName() != queue:
		return heldDropMoved
	case !holdsTicks(st.Entry.Overlap):
		return heldDropPolicy
	}
	return ""
}

// heldCheck is the loop's state of the release check (loop-owned).
type heldCheck struct {
	// holding: some queue may hold a tick (this replica held one, or has a
	// buffer-one entry, or the last check found one); the loop then wakes
	// by next.
	holding bool
	next    clock.Mono
	// swept: the check read every queue asynq knows once; it does again
	// at sweepNext.
	swept     bool
	sweepNext clock.Mono
	// queues that held ticks at the last check, checked again even when no
	// entry of theirs is buffer-one any more.
	queues map[string]bool
	// entries counts, per queue, the live unpaused runs whose overlap
	// policy holds ticks (indexHeld keeps it): the queues the check reads
	// without walking every run.
	entries map[string]int
	// cancels are the running tasks overlap cancel-previous replaced in
	// the last fire pass, to cancel (cancel.go); sent is when this replica
	// last published each held tick's cancellation.
	cancels []heldCancel
	sent    map[string]clock.Mono
}

// wakeAt is when the loop must next run the check: by next while some
// queue may hold a tick or the first sweep is to come, else at the next
// sweep. The loop arms its timer for it, so the check runs on a replica
// with nothing due (no entry, or every one paused) too.
func (h *heldCheck) wakeAt() clock.Mono {
	if h.holding || !h.swept {
		return h.next
	}
	if h.sweepNext.Before(h.next) {
		return h.next
	}
	return h.sweepNext
}

// releaseHeld is the per-queue release check of overlap buffer-one, run
// by the loop at most every heldCheckEvery: it reads the held-tick index
// of the queues of buffer-one entries (and of queues that held ticks
// before, and every heldSweepEvery of every queue), and fires each held
// tick whose previous task has left the busy states. A held tick of an
// entry that is paused, removed, moved or no longer buffer-one is dropped
// with a skipped event (reason overlap-dropped). The release is a
// compare-and-set in Redis presenting this replica's fences, so the
// replicas that check at once fire each held tick exactly once, and one
// whose projection lags the slot's decides nothing.
func (s *Scheduler) releaseHeld(ctx context.Context) {
	s.sendCancels(ctx)
	now := s.clock.Mono()
	if now.Before(s.held.next) {
		return
	}
	s.held.next = now.Add(heldCheckEvery)
	queues := s.heldQueues(ctx, now)
	s.held.holding = len(queues) > 0
	if len(queues) == 0 {
		return
	}
	held, err := s.broker.HeldTicks(ctx, s.cfg.Names.Prefix(), queues)
	if err != nil {
		s.countError()
		s.log.Warn("cannot read held ticks; will retry", "err", err)
		return
	}
	// A release presents the fences a fire of this replica would, so a
	// projection that lags the slot's neither releases nor drops.
	seq := s.cfg.Projection.FenceSeq()
	fences := taskstate.Fences{ConfigSeq: seq, ConfigID: s.cfg.Projection.ConfigMessageID(seq),
		FreshAsOf: s.cfg.Projection.LastHeard(), MaxStaleness: s.cfg.MaxStaleness}
	s.held.queues = map[string]bool{}
	if len(held) > 0 {
		s.placeFarOff() // a release follows the fires before it
	}
	var history []taskstate.EnqueueEventRecord
	for _, h := range held {
		s.held.queues[h.Queue] = true
		if rec, ok := s.releaseOne(ctx, fences, h); ok {
			history = append(history, rec)
		}
	}
	s.held.holding = s.held.holding || len(s.held.queues) > 0
	s.sendHistory(history)
}

// heldQueues are the queues the release check reads at now: those of
// buffer-one and cancel-previous entries, those that held ticks at the
// last check, and, at the first check and every heldSweepEvery, every
// queue asynq knows.
func (s *Scheduler) heldQueues(ctx context.Context, now clock.Mono) []string {
	queues := make([]string, 0, len(s.held.queues))
	for q := range s.held.queues {
		queues = append(queues, q)
	}
	for q := range s.held.entries {
		if !s.held.queues[q] {
			queues = append(queues, q)
		}
	}
	if s.held.swept && now.Before(s.held.sweepNext) {
		return queues
	}
	all, err := s.broker.Queues(ctx)
	if err != nil {
		s.countError()
		s.log.Warn("cannot list the queues to look for held ticks; will retry", "err", err)
		return queues
	}
	s.held.swept, s.held.sweepNext = true, now.Add(heldSweepEvery)
	for _, q := range all {
		if !slices.Contains(queues, q) {
			queues = append(queues, q)
		}
	}
	return queues
}

// heldQueue is the queue whose held ticks the release check reads for r:
// its own while it is live, not paused and its overlap policy holds
// ticks, "" otherwise.
func (r *entryRun) heldQueue() string {
	if r.state.live() && holdsTicks(r.st.Entry.Overlap) && !r.st.Entry.Paused {
		return r.queue
	}
	return ""
}

// indexHeld counts r in heldCheck.entries under its heldQueue. The state
// machine calls it after every change of r's state or registered state.
func (s *Scheduler) indexHeld(r *entryRun) {
	want := r.heldQueue()
	if want == r.holdsIn {
		return
	}
	if r.holdsIn != "" {
		if s.held.entries[r.holdsIn]--; s.held.entries[r.holdsIn] == 0 {
			delete(s.held.entries, r.holdsIn)
		}
	}
	if want != "" {
		if s.held.entries == nil {
			s.held.entries = map[string]int{}
		}
		s.held.entries[want]++
	}
	r.holdsIn = want
}

// releaseOne releases or drops held tick h, presenting fences, and
// returns the asynq history record of a tick it fired.
func (s *Scheduler) releaseOne(ctx context.Context, fences taskstate.Fences, h taskstate.HeldTick) (taskstate.EnqueueEventRecord, bool) {
	// The projection, not the loop's entries, says what became of the
	// entry: it is caught up, and its sequence is the one presented. An
	// entry it does not hold was removed: the fences make sure this
	// replica has seen the fire that held the tick, so it has seen the
	// entry's registration too. A quarantined one is left alone.
	if !s.firesShard(events.ShardOfEntry(h.Queue, h.Entry)) {
		return taskstate.EnqueueEventRecord{}, false // its shard's owner releases it
	}
	st, known := s.cfg.Projection.Get(h.Entry)
	if !known && s.quarantined(h.Entry) {
		return taskstate.EnqueueEventRecord{}, false
	}
	reason := heldDropReason(st, known, h.Queue)
	dropped, err := s.heldDroppedRecord(h, st.Revision)
	if err != nil {
		s.countError()
		s.log.Error("cannot build the skipped event of a held tick", "entry", h.Entry, "tick", h.Tick, "err", err)
		return taskstate.EnqueueEventRecord{}, false
	}
	how := taskstate.HeldRelease{Drop: reason != "", DroppedRecord: dropped}
	if h.Cancel {
		return s.releaseCancel(ctx, fences, h, how, reason)
	}
	if st.Entry.Limited() {
		how.MaxFires, how.MaxFiresSince = st.Entry.MaxFires, st.MaxFiresSince
	}
	out, err := s.broker.ReleaseHeld(ctx, fences, h, how)
	if err != nil {
		s.countError()
		s.log.Warn("cannot release held tick; will retry", "entry", h.Entry, "tick", h.Tick, "err", err)
		return taskstate.EnqueueEventRecord{}, false
	}
	switch out {
	case taskstate.HeldReleased:
		s.log.Debug("held tick released", "entry", h.Entry, "tick", h.Tick, "task", h.TaskID)
		return s.released(h)
	case taskstate.HeldDropped:
		// Without a reason of ours the script found the entry moved out
		// of the queue (its handover marker).
		s.droppedHeld(h, cmp.Or(reason, heldDropMoved))
	case taskstate.HeldExisted:
		s.droppedHeld(h, heldDropExisted)
	case taskstate.HeldCompleted:
		s.droppedHeld(h, heldDropCompleted)
	case taskstate.HeldFenced, taskstate.HeldStale:
		s.refusedHeld(h, out)
	}
	return taskstate.EnqueueEventRecord{}, false
}

// historyHoldMax and historyHoldFor bound what a backlog's passes keep
// (historyHeld) before flushHistory hands it over anyway: a backlog that
// lasts (overload) still shows in asynq's history within seconds. The
// count only bounds memory (about 64 bytes a record): it is well above
// what one instant's burst of a large deployment fires, whose history
// would otherwise be written between its passes.
const (
	historyHoldMax = 256 * 1024
	historyHoldFor = 5 * time.Second
)

// flushHistory hands the records of created tasks that the turn's passes
// kept (historyHeld) to sendHistory, once no backlog of due entries is
// left to fire, or once historyHoldMax of them wait or the oldest waited
// historyHoldFor. Written between the passes of a burst, they would take
// Redis and this process from the fires still to go; asynq's history is
// best effort.
func (s *Scheduler) flushHistory() {
	if len(s.historyHeld) == 0 {
		return
	}
	if len(s.backlog) > 0 && len(s.historyHeld) < historyHoldMax && s.clock.Since(s.historyHeldSince) < historyHoldFor {
		return
	}
	s.sendHistory(s.historyHeld)
	s.historyHeld = nil
}

// sendHistory hands records of created tasks to asynq's enqueue history
// writer, best effort: asynq's own history is best effort too, and ours
// is the activity stream.
func (s *Scheduler) sendHistory(history []taskstate.EnqueueEventRecord) {
	if len(history) == 0 {
		return
	}
	select {
	case s.history <- history:
	default:
		s.log.Debug("asynq enqueue history writer busy: dropping", "events", len(history))
	}
}

// released counts held tick h released (fired) by this replica and
// returns its record in asynq's enqueue history, written as a fire's is
// (apply) for `asynq cron history` and asynqmon; ok is false when the entry
// is not loaded here.
func (s *Scheduler) released(h taskstate.HeldTick) (taskstate.EnqueueEventRecord, bool) {
	s.m.HeldReleased.Inc()
	s.m.Fired.WithLabelValues(h.Queue).Inc()
	s.m.FireLag.Observe(s.clock.Now().Sub(h.Tick).Seconds())
	r := s.liveRun(h.Entry)
	if r == nil {
		return taskstate.EnqueueEventRecord{}, false
	}
	r.lastTask = h.TaskID
	trim := r.recorded%historyTrimEvery == 0
	r.recorded++
	return taskstate.EnqueueEventRecord{Entry: h.Entry,
		Event: taskstate.SchedulerEnqueueEvent{TaskID: h.TaskID, EnqueueTime: s.clock.Now()}, Trim: trim}, true
}

// refusedHeld counts and logs a release of held tick h the slot's fences
// refused (out is HeldFenced or HeldStale): the tick stays held.
func (s *Scheduler) refusedHeld(h taskstate.HeldTick, out taskstate.HeldOutcome) {
	status := taskstate.StatusRevisionFenced
	if out == taskstate.HeldStale {
		status = taskstate.StatusStale
	}
	s.countRefused(status.String())
	s.log.Debug("held tick not released: this replica's configuration is behind the slot's", "entry", h.Entry, "tick", h.Tick, "refused", status)
}

// droppedHeld counts and logs a held tick dropped for reason.
func (s *Scheduler) droppedHeld(h taskstate.HeldTick, reason string) {
	s.m.HeldDropped.WithLabelValues(reason).Inc()
	if reason != heldDropExisted {
		s.m.Skipped.WithLabelValues(events.SkipOverlapDropped).Inc()
	}
	overlap := events.OverlapBufferOne
	if h.Cancel {
		overlap = events.OverlapCancelPrevious
	}
	s.log.Info("held tick dropped, not fired", "overlap", overlap, "entry", h.Entry, "queue", h.Queue,
		"tick", h.Tick, "task", h.TaskID, "reason", reason)
}

// heldDroppedRecord is the skipped event of held tick h (reason
// overlap-dropped), at the entry's revision rev (0: removed), which the
// release script appends when it drops the tick.
func (s *Scheduler) heldDroppedRecord(h taskstate.HeldTick, rev uint64) (taskstate.Record, error) {
	id := skippedEventID(h.Entry, tickRange{First: h.Tick, Last: h.Tick, Count: 1, Exact: true})
	data := events.Skipped{Entry: h.Entry, ScheduledAt: h.Tick.UTC(), Reason: events.SkipOverlapDropped, Revision: rev, Replica: s.cfg.ReplicaID}
	ev, err := events.NewEventAt(id, s.clock.Now(), events.TypeEntrySkipped, s.source(), h.Entry, data)
	if err != nil {
		return taskstate.Record{}, err
	}
	b, err := ev.Marshal()
	return taskstate.Record{ID: id, Data: b}, err
}

// quarantined reports whether the projection holds entry back for a bad
// event (it is not removed).
func (s *Scheduler) quarantined(entry string) bool {
	return slices.ContainsFunc(s.cfg.Projection.Quarantined(), func(q projector.Quarantine) bool { return q.ID == entry })
}
