package scheduler

import (
	"context"
	"slices"
	"time"

	"github.com/cronstream/cronstream/clock"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// heldCheckEvery is how often the loop looks for held ticks to release
// (overlap buffer-one): a held tick fires within this long of its previous
// task leaving the busy states.
const heldCheckEvery = 500 * time.Millisecond

// heldCheck is the loop's state of the release check (loop-owned).
type heldCheck struct {
	// holding: some queue may hold a tick (this replica held one, or has a
	// buffer-one entry, or the last check found one); the loop then wakes
	// by next.
	holding bool
	next    clock.Mono
	// queues that held ticks at the last check, checked again even when no
	// entry of theirs is buffer-one any more.
	queues map[string]bool
}

// releaseHeld is the per-queue release check of overlap buffer-one, run
// by the loop at most every heldCheckEvery: it reads the held-tick index
// of the queues of buffer-one entries (and of queues that held ticks
// before), and fires each held tick whose previous task has left the busy
// states. The release is a compare-and-set in Redis, so the replicas that
// check at once fire each held tick exactly once.
func (s *Scheduler) releaseHeld(ctx context.Context) {
	now := s.clock.Mono()
	if now.Before(s.held.next) {
		return
	}
	s.held.next = now.Add(heldCheckEvery)
	queues := make([]string, 0, len(s.held.queues))
	for q := range s.held.queues {
		queues = append(queues, q)
	}
	for _, r := range s.entries {
		if r.st.Entry.Overlap == events.OverlapBufferOne && !slices.Contains(queues, r.queue) {
			queues = append(queues, r.queue)
		}
	}
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
	seq := s.cfg.Projection.LastSeq()
	fences := taskstate.Fences{ConfigSeq: seq, ConfigID: s.cfg.Projection.ConfigMessageID(seq),
		FreshAsOf: s.cfg.Projection.LastHeard(), MaxStaleness: s.cfg.MaxStaleness}
	s.held.queues = map[string]bool{}
	for _, h := range held {
		s.held.queues[h.Queue] = true
		// A paused entry, or one that moved to another queue, fires
		// nothing here: its held tick is dropped. One this replica does not
		// know (its projection lags, or it was removed) is left alone.
		drop := false
		if r := s.entries[h.Entry]; r != nil {
			drop = r.queue != h.Queue
		} else if _, paused := s.pausedEntries[h.Entry]; paused {
			drop = true
		} else {
			continue
		}
		out, err := s.broker.ReleaseHeld(ctx, fences, h, taskstate.HeldRelease{Drop: drop})
		if err != nil {
			s.countError()
			s.log.Warn("cannot release held tick; will retry", "entry", h.Entry, "tick", h.Tick, "err", err)
			continue
		}
		switch out {
		case taskstate.HeldReleased:
			s.count(func(st *Stats) { st.Released++; st.Fired++ })
			s.m.Fired.WithLabelValues(h.Queue).Inc()
			s.m.FireLag.Observe(s.clock.Now().Sub(h.Tick).Seconds())
			if r := s.entries[h.Entry]; r != nil {
				r.lastTask = h.TaskID
			}
			s.log.Debug("held tick released", "entry", h.Entry, "tick", h.Tick, "task", h.TaskID)
		case taskstate.HeldDropped, taskstate.HeldExisted:
			s.count(func(st *Stats) { st.DroppedHeld++ })
			s.log.Info("held tick dropped: the entry is paused, moved, or its task exists", "entry", h.Entry, "tick", h.Tick, "task", h.TaskID)
		case taskstate.HeldFenced, taskstate.HeldStale:
			status := taskstate.StatusRevisionFenced
			if out == taskstate.HeldStale {
				status = taskstate.StatusStale
			}
			s.m.Refused.WithLabelValues(status.String()).Inc()
			s.log.Debug("held tick not released: this replica's configuration is behind the slot's", "entry", h.Entry, "tick", h.Tick, "refused", status)
		}
	}
	s.held.holding = s.held.holding || len(s.held.queues) > 0
}
