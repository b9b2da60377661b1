package failpause

import (
	"context"
	"time"

	"github.com/cronstream/cronstream/projector"
)

// follow applies the projection's changes since the last scan to the
// index of armed entries and to the queues followed for moves, and drops
// old queues past their bound.
func (w *Watcher) follow(now time.Time) {
	if w.sub == nil {
		w.sub = w.p.Projection.Subscribe()
	}
	// A done context: Next returns what is pending, never waits.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for {
		changes, err := w.sub.Next(done)
		if err != nil {
			break
		}
		for _, c := range changes {
			w.followChange(c, now)
		}
	}
	for id := range w.moved {
		w.expireMoved(id, w.queueOf[id], now)
	}
}

// followChange follows one change of an entry.
func (w *Watcher) followChange(c projector.Change, now time.Time) {
	if c.New == nil || !c.New.Entry.PauseOnFailure || c.New.Entry.Removed {
		delete(w.armed, c.ID)
		delete(w.unseen, c.ID)
		delete(w.queueOf, c.ID)
		delete(w.moved, c.ID)
		return
	}
	st := c.New
	if w.trackQueue(st, now) {
		w.unseen[c.ID] = true
	}
	if isArmed(st.Entry) {
		w.armed[c.ID] = st.Entry.Options.QueueName()
	} else {
		delete(w.armed, c.ID)
	}
}

// trackQueue follows the queue of an entry with pause_on_failure: a move
// keeps its old queue scanned (MovedScan). It reports an entry first seen
// whose last change is recent enough to follow a move this replica did
// not see (it started after it): readMoves reads its history.
func (w *Watcher) trackQueue(st *projector.State, now time.Time) (unseen bool) {
	e := st.Entry
	id, q := e.ID, e.Options.QueueName()
	if !e.PauseOnFailure || e.Removed {
		delete(w.queueOf, id)
		delete(w.moved, id)
		return false
	}
	prev, seen := w.queueOf[id]
	switch {
	case seen && prev != q:
		w.addMoved(id, prev, now.Add(w.p.MovedScan))
	case !seen && now.Sub(st.Time) < w.p.MovedScan:
		return true
	}
	w.queueOf[id] = q
	w.expireMoved(id, q, now)
	return false
}

// historyTimeout bounds one history read of readMoves, and
// maxHistoryReads the reads of one scan.
const (
	historyTimeout  = 2 * time.Second
	maxHistoryReads = 100
)

// readMoves reads the queue moves of st's entry within MovedScan from its
// history. It reports false when the read failed (tried again next scan).
func (w *Watcher) readMoves(ctx context.Context, st *projector.State, now time.Time) bool {
	id := st.Entry.ID
	rctx, cancel := context.WithTimeout(ctx, historyTimeout)
	defer cancel()
	recs, err := w.p.Entries.History(rctx, id)
	if err != nil {
		w.fail(ctx, candidate{entry: id}, "read the entry's history for its queue moves", err)
		return false
	}
	var last string
	for _, r := range recs {
		if r.Entry == nil || r.Entry.Removed {
			last = ""
			continue
		}
		rq := r.Entry.Options.QueueName()
		if last != "" && rq != last && now.Sub(r.Time) < w.p.MovedScan {
			w.addMoved(id, last, r.Time.Add(w.p.MovedScan))
		}
		last = rq
	}
	q := st.Entry.Options.QueueName()
	w.queueOf[id] = q
	w.expireMoved(id, q, now)
	return true
}

// expireMoved drops the old queues of entry (now in q) past their bound,
// and q itself (it moved back: scanned as its queue).
func (w *Watcher) expireMoved(id, q string, now time.Time) {
	if m := w.moved[id]; m != nil {
		delete(m, q) // moved back: scanned as its queue
		for oq, o := range m {
			if now.After(o.until) {
				w.p.Logger.Info("pause on failure: no longer scanning the entry's old queue (bound reached)", "entry", id, "queue", oq)
				delete(m, oq)
			}
		}
		if len(m) == 0 {
			delete(w.moved, id)
		}
	}
}

func (w *Watcher) addMoved(entry, queue string, until time.Time) {
	if w.moved[entry] == nil {
		w.moved[entry] = map[string]*oldQueue{}
	}
	if o, ok := w.moved[entry][queue]; ok && o.until.After(until) {
		return
	}
	w.moved[entry][queue] = &oldQueue{until: until}
	w.p.Logger.Info("pause on failure: the entry moved; its old queue is still scanned for its archived tasks", "entry", entry, "queue", queue, "until", until.Format(time.RFC3339))
}

// checkMoved looks, at most every busyCheckEvery, whether queue still
// holds a busy task of each entry that moved away from it. One that holds
// none can archive no more there: the read that follows is its last.
func (w *Watcher) checkMoved(ctx context.Context, queue string, entries map[string]bool, now time.Time) {
	for id := range entries {
		o := w.moved[id][queue]
		if o == nil || now.Sub(o.checked) < busyCheckEvery {
			continue
		}
		busy, err := w.p.Store.HasBusyTask(ctx, queue, w.p.Names.Prefix()+":"+id+":")
		if err != nil {
			w.fail(ctx, candidate{entry: id, queue: queue}, "look for the entry's busy tasks in its old queue", err)
			continue
		}
		o.checked, o.idle = now, !busy
	}
}

// doneMoved stops scanning queue for the moved entries it holds no busy
// task of, once a read after that finding succeeded.
func (w *Watcher) doneMoved(queue string, entries map[string]bool) {
	for id := range entries {
		if o := w.moved[id][queue]; o != nil && o.idle {
			w.p.Logger.Info("pause on failure: no longer scanning the entry's old queue (no busy task of it left there)", "entry", id, "queue", queue)
			delete(w.moved[id], queue)
			if len(w.moved[id]) == 0 {
				delete(w.moved, id)
			}
		}
	}
}
