package scheduler

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/schedule"
)

// loadBatch bounds the entries one turn of the loop loads: a replica that
// takes many shards at once (at start, or from a dead replica) loads them
// over several turns, so its loop keeps turning (its leases are renewed
// only while it does) and fires between them.
const loadBatch = 10_000

// loadBudget bounds the time one turn spends loading. Some steps of a load
// take a round trip per entry (a restore's proposal, a queue handover, a
// history read): with Redis or NATS far away, a shard's entries loaded in
// one turn held the loop past the ownership's progress bound, so its
// leases lapsed, the shards moved, and their next owner stalled the same
// way. The entries left load in the next turns, which follow at once, even
// when the pass held entries for a restore (nextLoad).
const loadBudget = 500 * time.Millisecond

// loadWatermarks reads the watermark of the entries that need one (at most
// loadBatch, for at most loadBudget after the first), per queue in one
// round trip, doing queue handovers first. Entries whose load failed stay
// loading and are retried after a backoff; those left for the next turn
// follow at once.
func (s *Scheduler) loadWatermarks(ctx context.Context) {
	var p loadPass
	began := s.clock.Mono()
	spent := func() bool { return s.clock.Since(began) >= loadBudget }
	byQueue := s.takeLoadBatch(ctx, &p, spent)
	now := s.clock.Now()
	loaded := false
queues:
	for q, runs := range byQueue {
		if loaded && spent() {
			p.cut = true
			break
		}
		wms, ok := s.readWatermarks(ctx, q, runs, &p)
		if !ok {
			continue // stay loading; retried after a backoff
		}
		for i, r := range runs {
			if loaded && spent() {
				p.cut = true
				break queues
			}
			s.loadRun(ctx, r, wms[i], now, &p)
			loaded = true
		}
	}
	p.held.report(s)
	if n := s.hist.fires.gaveUp; n > 0 {
		s.hist.fires.gaveUp = 0
		s.log.Warn("entries loaded without checking their watermarks against the activity stream: its read did not answer before their next tick would have aged past the catch-up grace",
			"entries", n)
	}
	if len(p.restored) > 0 {
		s.log.Warn("watermarks missing in Redis or older than ticks known to be handled (did Redis lose data?): restored from the running replicas' positions and the activity stream",
			"entries", len(p.restored), "first", p.restored[0])
	}
	s.nextLoad(&p)
}

// loadPass is what one loadWatermarks learns on the way: whether a step
// failed (retried after a backoff) or waits for the history (later), the
// entries whose watermark it restored, and those held by a restore.
type loadPass struct {
	// batch is how many entries the pass took (takeLoadBatch).
	batch         int
	failed, later bool
	restored      []string
	held          restoreHolds
	// waitFires: some entries wait for the stream's last fires
	// (lastFireOf), whose read wakes the loop when it ends, or until
	// checkBy, the first of their deadlines (zero: none).
	waitFires bool
	checkBy   clock.Mono
	// cut: the pass stopped at loadBatch or loadBudget, leaving entries
	// it did not reach.
	cut bool
}

// takeLoadBatch takes at most loadBatch loading entries, by queue, until
// spent (after the first). An entry whose queue changed live is closed in
// its old queue first: firing into the new queue before the old one is
// closed could fire a tick in both, so one whose handover fails waits.
// An entry held by a restore proposal is not taken again before the
// proposal may have settled: proposing it again would only say so, and
// the passes that follow a cut one at once would spend their budget on
// it instead of on the entries left.
func (s *Scheduler) takeLoadBatch(ctx context.Context, p *loadPass, spent func() bool) map[string][]*entryRun {
	byQueue := map[string][]*entryRun{}
	taken := 0
	for _, r := range s.loading {
		if left := s.clock.Until(r.loading.heldUntil); r.loading.held && left > 0 {
			p.held.waiting(left)
			continue
		}
		if taken++; taken > loadBatch || (taken > 1 && spent()) {
			p.cut = true
			break
		}
		if r.loading.fromQueue != "" {
			if _, err := s.handover(ctx, r, []string{r.loading.fromQueue}); err != nil {
				p.failed = true
				continue
			}
		}
		byQueue[r.queue] = append(byQueue[r.queue], r)
		p.batch++
	}
	return byQueue
}

// readWatermarks reads the watermarks of runs, all in queue q; ok is false
// when the read failed.
func (s *Scheduler) readWatermarks(ctx context.Context, q string, runs []*entryRun, p *loadPass) ([]taskstate.WatermarkInfo, bool) {
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.id
	}
	wms, err := s.broker.Watermarks(ctx, s.cfg.Names.Prefix(), q, ids)
	if err != nil {
		s.countError()
		s.log.Warn("read watermarks", "queue", q, "entries", len(ids), "err", err)
		for _, r := range runs {
			s.outcome(schedule.Outcome{Entry: r.id, Err: err})
		}
		p.failed = true
		return nil, false
	}
	return wms, true
}

// loadRun goes on with r's load, its watermark read as wm: it ends the
// load (loaded, or loadStopped for an entry paused or removed) or leaves r
// loading, p saying why.
func (s *Scheduler) loadRun(ctx context.Context, r *entryRun, wm taskstate.WatermarkInfo, now time.Time, p *loadPass) {
	if r.st.Entry.Paused || r.state.removed() {
		if !s.loadStopped(ctx, r, wm, now) {
			p.later = true
			return
		}
		s.applyWaiting(r)
		return
	}
	// A missing watermark, or one older than a tick known to be handled,
	// is restored (once per load: the stream may hold nothing usable),
	// after the handover that closes the entry's other queues: the restore
	// opens this one.
	restoreNow := !r.loading.restored && !wm.OK
	if !r.loading.restored && wm.OK {
		behind, wait := s.behind(ctx, r, wm.Tick, now, p.batch)
		if wait {
			p.waitFires = true
			if by := r.loading.checkBy; !by.IsZero() && (p.checkBy.IsZero() || by.Before(p.checkBy)) {
				p.checkBy = by
			}
			return
		}
		restoreNow = behind
	}
	if !restoreNow {
		// Nothing (more) to restore: another replica seeded the watermark
		// meanwhile.
		r.loading.seed, r.loading.held = nil, false
	}
	reread, ok := s.closeOtherQueues(ctx, r, wm, restoreNow, p)
	if !ok {
		return
	}
	if restoreNow {
		seeded, ok := s.restoreOnLoad(ctx, r, wm, p)
		if !ok {
			return
		}
		reread = reread || seeded
	}
	if reread {
		return // the watermark changed: read it again next turn
	}
	if !s.floorOnLoad(ctx, r, wm, p) {
		return
	}
	r.loading.floorAtLoad, r.loading.restored = false, false
	s.loaded(r, wm, now)
}

// closeOtherQueues closes r in the queues it used before its current one
// when its watermark is missing, its slot is to be reopened or restored.
// It reports whether the watermark changed (reread), and ok false when r
// stays loading.
func (s *Scheduler) closeOtherQueues(ctx context.Context, r *entryRun, wm taskstate.WatermarkInfo, restoreNow bool, p *loadPass) (reread, ok bool) {
	// A restore in progress (r.loading.seed) did the handover in an
	// earlier turn of this load.
	if (wm.OK && !r.loading.reopen && !restoreNow) || r.loading.seed != nil {
		return false, true
	}
	prev, err := s.previousQueues(ctx, r)
	if err != nil {
		p.later = true
		return false, false
	}
	if len(prev) == 0 && !r.loading.reopen {
		return false, true
	}
	seeded, err := s.handover(ctx, r, prev)
	if err != nil {
		p.failed = true
		return false, false
	}
	if r.loading.reopen || seeded {
		r.loading.reopen = false
		return true, true
	}
	return false, true
}

// restoreOnLoad restores r's lost watermark (and its fires counter, for a
// limited entry). It reports whether the watermark changed (reread), and
// ok false when r stays loading: the restore failed or is held.
func (s *Scheduler) restoreOnLoad(ctx context.Context, r *entryRun, wm taskstate.WatermarkInfo, p *loadPass) (reread, ok bool) {
	if r.st.Entry.Limited() && r.loading.seed == nil {
		// The fires counter went with the watermark: rebuilt before the
		// watermark, or a fire in between would count from zero.
		if err := s.restoreFireCount(ctx, r); err != nil {
			p.failed = true
			return false, false
		}
	}
	step, wait := s.restore(ctx, r, wm)
	switch step {
	case restoreFailed:
		p.failed = true
		return false, false
	case restoreHeld:
		r.loading.heldUntil = s.clock.Mono().Add(wait)
		p.held.add(r, wait)
		return false, false
	case restoreSeeded:
		p.restored = append(p.restored, r.id)
		reread = true
	case restoreReread:
		reread = true
	}
	r.loading.restored, r.loading.seed, r.loading.held = true, nil, false
	return reread, true
}

// floorOnLoad moves r's floor, as found at start, to when its schedule
// began, when that matters: only when a tick of its schedule fell between
// the watermark and the last config change is the history read (a daily
// entry edited after its last fire needs nothing). It returns false when
// the history is to be read later.
func (s *Scheduler) floorOnLoad(ctx context.Context, r *entryRun, wm taskstate.WatermarkInfo, p *loadPass) bool {
	if !r.loading.floorAtLoad || !wm.OK || !wm.Tick.Before(r.floor) || r.sched.Next(wm.Tick).After(r.floor) {
		return true
	}
	start, err := s.scheduleStart(ctx, r)
	if err != nil {
		p.later = true
		return false
	}
	r.floor = start.Since
	s.settleBeforeRestart(r, wm, start)
	return true
}

// settleBeforeRestart gives r, found running on a schedule that restarted
// after its watermark (resumed, or registered again after a removal), the
// settle of the stop before it: the ticks of the schedule it stopped that
// were due before the stop and that no replica handled are recorded as
// skipped, as by a replica that saw the stop live. That replica may have
// lost the entry's shard before it could record them (Redis cut off).
func (s *Scheduler) settleBeforeRestart(r *entryRun, wm taskstate.WatermarkInfo, start ScheduleStart) {
	if start.Stop.From == nil || r.settle != nil || !wm.Tick.Before(start.Stop.Stopped) {
		return
	}
	if settle := settleOfStop(start.Stop, s.clock.Now()); settle.sched != nil {
		r.settle = settle // else a state that never had a usable schedule fired nothing
	}
}

// settleOfStop is the settle of the stop span names, applied at now: its
// reason and revision, the ticks due up to it, by the schedule that ran
// before it (sched nil when none ran, or it had no usable schedule).
func settleOfStop(span StopSpan, now time.Time) *stopSettle {
	p := &stopSettle{reason: events.SkipPaused, revision: span.Revision, until: settleUntil(span.Stopped, now), after: span.Since}
	if span.Removed {
		p.reason = events.SkipRemoved
	}
	if span.From != nil {
		if sched, err := schedule.NewSchedule(*span.From); err == nil {
			p.sched = sched
		}
	}
	return p
}

// nextLoad sets when the loop loads next after pass p: after a backoff
// when a step failed, once the history may be read again when a step
// waits for it, by the first restore proposal to settle when one holds
// entries (or the backoff, when sooner), and at once when the pass was
// cut with entries left: those are not held, and one whose watermark
// Redis lost has not proposed its restore yet. Waiting for the settle of
// the entries held before them would put its own settle after that one,
// and what Redis lost of its fires would be recorded a settle late.
func (s *Scheduler) nextLoad(p *loadPass) {
	switch {
	case p.failed:
		s.loadFails++
		s.loadAfter = s.clock.Mono().Add(min(time.Duration(s.loadFails)*200*time.Millisecond, 5*time.Second))
	case p.later:
		s.loadFails = 0
		s.loadAfter = s.hist.countsAt.Add(historyRefresh)
	case p.cut:
		// At once, also when the pass ran early for a stream read that
		// ended (turn): the entries left have not been asked yet.
		s.loadFails = 0
		s.loadAfter = s.clock.Mono()
		return
	default:
		s.loadFails = 0
	}
	if p.waitFires {
		// The read wakes the loop when it ends, within its bound. (Entries
		// the pass left for the next turn follow at once.)
		at := s.clock.Mono().Add(streamReadTimeout)
		if !p.checkBy.IsZero() && p.checkBy.Before(at) {
			at = p.checkBy
		}
		if !p.failed && !p.later || at.Before(s.loadAfter) {
			s.loadAfter = at
		}
	}
	if p.held.n > 0 {
		at := s.clock.Mono().Add(p.held.wait)
		if (p.failed || p.later) && s.loadAfter.Before(at) {
			at = s.loadAfter
		}
		s.loadAfter = at
	}
}

// loadStopped ends the load of a paused entry, or of one found removed at
// start (foundRemoved). When its watermark shows ticks due before the
// pause or removal that no replica handled, it becomes ready and settles
// (stopSettle); otherwise a paused entry rests (idle) and loads in full
// if it resumes, and a removed one goes. It returns false
// when its history is to be read later (errHistoryLater).
func (s *Scheduler) loadStopped(ctx context.Context, r *entryRun, wm taskstate.WatermarkInfo, now time.Time) bool {
	rest := func() bool {
		s.rested(r)
		return true
	}
	if r.settle == nil || !wm.OK || r.loading.fromQueue != "" || r.loading.reopen || r.loading.seed != nil ||
		(r.hasHandled && wm.Tick.Before(r.handled)) {
		// Nothing to go by: the entry never fired in its queue, or Redis
		// lost its watermark (restored if it resumes).
		return rest()
	}
	if r.loading.floorAtLoad {
		// Found paused or removed at start, or paused before its first
		// load: its history says when it stopped firing, and is read only
		// when a tick fell between the watermark and the entry's last
		// change.
		if next := r.sched.Next(wm.Tick); next.IsZero() || next.After(r.st.Time) {
			return rest()
		}
		span, ok, err := s.stopSince(ctx, r)
		if err != nil {
			return false
		}
		if !ok {
			return rest()
		}
		s.settleStop(r, span, now)
	}
	r.loading = loadSteps{}
	s.loaded(r, wm, now)
	return true
}

// settleStop gives r, found paused or removed, the settle of the stop its
// history names: the skipped event names that stop, which may not be the
// state r was found in. An entry removed while paused stopped at the
// pause; one registered paused right after a removal stopped at the
// removal, and its ticks are of the schedule it ran before it.
func (s *Scheduler) settleStop(r *entryRun, span StopSpan, now time.Time) {
	settle := settleOfStop(span, now)
	settle.revision = cmp.Or(settle.revision, r.settle.revision)
	r.settle, r.floor = settle, span.Since
}

// handover closes the entry in each old queue and opens its queue, seeded
// with the newest watermark found. It reports whether a watermark was
// seeded (it must then be read again). Both steps are idempotent, so after
// an error the whole handover is simply repeated.
func (s *Scheduler) handover(ctx context.Context, r *entryRun, from []string) (bool, error) {
	prefix := s.cfg.Names.Prefix()
	var best time.Time
	var bestTask string
	found := false
	var fires taskstate.FireCount
	for _, q := range from {
		if q == r.queue {
			continue
		}
		tick, task, ok, err := s.broker.CloseForHandover(ctx, prefix, q, r.id, r.st.Revision, s.revisionID(r))
		if err != nil {
			s.countError()
			s.log.Warn("close entry in its old queue", "entry", r.id, "queue", q, "err", err)
			s.outcome(schedule.Outcome{Entry: r.id, Err: err})
			return false, err
		}
		if ok && (!found || tick.After(best)) {
			best, bestTask, found = tick, task, true
		}
		if r.st.Entry.Limited() {
			// Closed, the old slot's count can no longer move.
			c, ok, err := s.broker.FireCount(ctx, prefix, q, r.id)
			if err != nil {
				s.countError()
				s.log.Warn("read the entry's fires count in its old queue", "entry", r.id, "queue", q, "err", err)
				return false, err
			}
			if ok && c.Since == r.st.MaxFiresSince && c.Count > fires.Count {
				fires = c
			}
		}
	}
	if fires.Count > 0 {
		// Before the new slot opens: its fires count on from here.
		if _, err := s.broker.SeedFireCount(ctx, prefix, r.queue, r.id, fires); err != nil {
			s.countError()
			s.log.Warn("carry the entry's fires count to its new queue", "entry", r.id, "queue", r.queue, "err", err)
			return false, err
		}
	}
	if err := s.broker.SeedWatermark(ctx, prefix, r.queue, r.id, best, bestTask, r.st.Revision, s.revisionID(r)); err != nil {
		if !errors.Is(err, taskstate.ErrHandoverSuperseded) {
			s.countError()
			s.log.Warn("seed entry in its new queue", "entry", r.id, "queue", r.queue, "err", err)
			s.outcome(schedule.Outcome{Entry: r.id, Err: err})
			return false, err
		}
		// A newer configuration moved the entry on; our fires there will
		// be refused until the projection catches up.
	}
	r.loading.fromQueue = ""
	return found, nil
}

// restoreFireCount rebuilds r's fires counter after Redis lost data: the
// scheduled ticks the activity stream recorded as fired since the revision
// its limit counts from, raised into the slot (never lowered: a count the
// slot kept is at least as true). Fires older than the activity stream's
// retention, and fires whose events were still in the lost outbox, are not
// in the stream (docs/design.md INV-max-fires).
func (s *Scheduler) restoreFireCount(ctx context.Context, r *entryRun) error {
	if s.cfg.History == nil {
		return nil
	}
	t, err := s.cfg.History.FiredSince(ctx, r.id, r.st.MaxFiresSince)
	unknown := err == nil && s.firesInGap(r, t)
	n := t.Count
	if unknown {
		n = taskstate.FireCountUnknown
	}
	if err == nil {
		_, err = s.broker.SeedFireCount(ctx, s.cfg.Names.Prefix(), r.queue, r.id, taskstate.FireCount{Since: r.st.MaxFiresSince, Count: n})
	}
	if err != nil {
		s.countError()
		s.log.Warn("rebuild the entry's fires count from the activity stream; not firing it until it is", "entry", r.id, "queue", r.queue, "err", err)
		s.outcome(schedule.Outcome{Entry: r.id, Err: err})
		return err
	}
	if unknown {
		s.m.FireCountUnknown.Inc()
		s.log.Warn("the entry's max_fires count is unknown: Redis lost it and the activity stream no longer holds every fire since the limit was set; firing it no more (completed) until its max_fires is set to another value",
			"entry", r.id, "queue", r.queue, "since", r.st.MaxFiresSince, "counted", t.Count, "events_gone_from", t.GapFrom, "events_gone_until", t.GapTo)
		return nil
	}
	s.log.Info("rebuilt the entry's fires count from the activity stream", "entry", r.id, "queue", r.queue, "since", r.st.MaxFiresSince, "fired", n)
	return nil
}

// firesInGap reports whether r may have fired ticks whose events the
// activity stream no longer holds (t's gap): a tick of its schedule falls
// in the gap, widened by the jitter (a fire is published after its tick
// plus jitter) and a minute for the clocks of Redis and NATS. An entry
// whose schedule had no tick there (it starts later, say) lost nothing.
func (s *Scheduler) firesInGap(r *entryRun, t FireTally) bool {
	if t.GapTo.IsZero() || !t.GapTo.After(t.GapFrom) {
		return false
	}
	const clockMargin = time.Minute
	from := t.GapFrom.Add(-r.st.Entry.Jitter.D() - clockMargin)
	if t.GapFrom.IsZero() {
		from = time.Time{}
	}
	next := r.sched.NextFire(from)
	return !next.IsZero() && next.Before(t.GapTo.Add(clockMargin))
}

// behind reports whether r's watermark wm is older than a tick known to be
// handled: r.handled when this replica holds one; otherwise, for an entry
// whose next tick after wm is already due, the last tick the activity
// stream recorded for it. A stream ahead of Redis means Redis lost the
// fires after wm (a lagging replica was promoted while no replica ran):
// their events were published only after their Redis writes.
//
// The stream is read off the loop (lastFireOf), per entry or in one pass
// over every entry's last fire, whichever reads less for a load pass of
// batch entries (scanHistory): wait is true while the read runs, and r
// stays loading, until its deadline (checkDeadline). When the read fails
// (NATS unreachable, or no answer within streamReadTimeout) or the
// deadline passes first, wm is taken as Redis holds it, unchecked
// (counted). A last fire far ahead
// of the clock (plausible) is no sign of loss: it would only hold the entry
// while a restore found nothing to seed.
func (s *Scheduler) behind(ctx context.Context, r *entryRun, wm, now time.Time, batch int) (behind, wait bool) {
	if r.hasHandled {
		return wm.Before(r.handled), false
	}
	if s.cfg.History == nil || r.sched.Next(wm).After(now) {
		return false, false
	}
	if r.loading.checkSince.IsZero() {
		r.loading.checkSince = s.clock.Mono()
		r.loading.checkBy = s.checkDeadline(r, wm, now)
	}
	last, read := s.lastFireOf(ctx, r.id, scanHistory(batch, len(s.entries)), r.loading.checkSince)
	if !read && (r.loading.checkBy.IsZero() || s.clock.Until(r.loading.checkBy) > 0) {
		return false, true
	}
	r.loading.checkSince = clock.Mono{} // a later load asks afresh
	switch {
	case !read:
		s.m.Unchecked.Inc()
		s.hist.fires.gaveUp++
		return false, false
	case last.unchecked:
		s.m.Unchecked.Inc()
		return false, false
	}
	return last.ok && last.tick.After(wm) && s.plausible(r.id, last.tick), false
}

// checkFireMargin is what the rest of a load and the fire pass after it
// are given once an entry stops waiting for the check (checkDeadline).
const checkFireMargin = 500 * time.Millisecond

// checkDeadline is how long the load of r, on watermark wm, waits for
// the check against the activity stream (zero: until the read ends). An
// entry whose first tick after wm can still fire within the grace waits
// no longer than keeps it so, and then loads unchecked, as when the read
// fails: a takeover comes up to a lease term and a takeover step after
// the owner's last fire, and a read that waited out its bound on top of
// that (JetStream back without a leader after a restart) made that tick
// missed, a tick lost for certain, where firing it unchecked risks a
// second fire only if Redis also rolled back. An entry whose first tick
// is too old for that anyway (a start after downtime) waits as long as
// the read runs: only its missed ticks' record depends on the wait.
func (s *Scheduler) checkDeadline(r *entryRun, wm, now time.Time) clock.Mono {
	first := r.sched.Next(wm)
	left := first.Add(s.grace(r) - checkFireMargin).Sub(now)
	if first.IsZero() || left <= 0 {
		return clock.Mono{}
	}
	return s.clock.Mono().Add(left)
}

// scanHistory reports whether behind reads the last fire of every entry in
// one pass rather than one entry at a time, for a load pass of loading
// entries out of known. The pass reads the whole stream's last fires: with
// many entries, a throttled replica or a busy server it takes seconds, and
// the entries it checks wait for it. A read per entry costs a round trip or
// more (it looks back past a last message that is not a fire): it is the
// read for a load of a small part of the entries (a takeover or handover
// among many replicas); the pass is the read for the rest.
func scanHistory(loading, known int) bool {
	const scanShare = 8 // the pass when loading is over 1/scanShare of known
	return loading*scanShare > known
}
