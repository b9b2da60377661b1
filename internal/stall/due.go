// Package stall detects entries that stopped firing, whatever stopped them.
//
// It compares what should have fired with what did, independently of the
// firing path: what should have fired comes from the projection (each
// entry's schedule with its jitter applied, schedule.Schedule); what did
// fire comes from each entry's watermark in Redis (its last fired or skipped
// tick) and from the fired and skipped events the replica sees. It never
// reads the scheduler's own bookkeeping, so a bug or a hang in the firing
// path cannot hide from it. The scheduler only tells it why its attempts
// failed (Detector.Outcome), so that a late entry is shown with its reason.
//
// An entry is late when the tick after its last handled one that fires is
// due (tick plus jitter) for more than LateAfter, or when this replica's
// fires of it skipped ticks as missed again and again, the last within
// LateAfter (an overloaded replica fires each entry's latest tick and
// records the ticks before it as skipped: none stays overdue, yet ticks are
// lost; one such fire alone, after a start or an outage, is catch-up). Paused entries and
// entries whose schedule never fires again (an entry past its end_at among
// them) are never late, nor is a tick its exclusions skip; a tick at or before the
// entry's last config change is never due (a registration, a resume or a
// queue change starts the entry afresh). Catch-up policies need nothing
// special: ticks a policy drops are recorded as skipped, which moves the
// watermark like a fire. A tick that overlap buffer-one holds, or
// cancel-previous holds while the running task it replaces is cancelled,
// moves the watermark too (the fire script holds it in the step that would
// have fired it), so
// an entry holding a tick is never late for it, nor for the ticks skipped
// while it is held.
package stall

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// DefaultLateAfter is how long a tick may be overdue before its entry is
// late.
const DefaultLateAfter = 30 * time.Second

// Watermarks reads entries' watermarks, and a limited entry's fires
// counter, in one queue's slot; *taskstate.Store implements it.
type Watermarks interface {
	Watermarks(ctx context.Context, prefix, queue string, entries []string) ([]taskstate.WatermarkInfo, error)
	FireCount(ctx context.Context, prefix, queue, entry string) (taskstate.FireCount, bool, error)
}

// Late is one late entry.
type Late struct {
	Entry string `json:"entry"`
	Queue string `json:"queue"`
	// Tick is the overdue tick; Due is when it was due (tick plus jitter).
	Tick time.Time `json:"tick"`
	Due  time.Time `json:"due"`
	// OverdueSeconds is how long past Due it was when last checked.
	OverdueSeconds int64 `json:"overdue_seconds"`
	// Reason is the last refusal or error seen for the entry's fires.
	Reason string `json:"reason,omitempty"`
	// Replica is the replica that saw Reason (merged by status).
	Replica string `json:"replica,omitempty"`
}

// track is the detector's view of one entry.
type track struct {
	id    string
	queue string
	shard int // events.ShardOf(id)
	st    projector.State
	sched *schedule.Schedule // nil: the entry cannot fire (never late)

	// wm is the watermark last read from Redis (known: read at least
	// once since the entry or its queue changed); seen is the newest
	// fired or skipped tick seen in events.
	wm, seen time.Time
	hasWM    bool
	known    bool
	// completed: the entry's fires counter, last read, says its max_fires
	// are reached (it fires nothing more, so it is never late).
	completed  bool
	memoFrom   time.Time
	memoTick   time.Time
	memoDue    time.Time
	memoValid  bool
	lateLogged time.Time // monotonic: last warning logged for it
}

func newTrack(st projector.State) *track {
	t := &track{id: st.Entry.ID, shard: events.ShardOf(st.Entry.ID)}
	t.set(st)
	return t
}

// set follows a config change. Ticks handled stay handled; the watermark
// is read again, in the entry's queue as it is now.
func (t *track) set(st projector.State) {
	t.st, t.queue, t.known, t.memoValid = st, st.Entry.Options.QueueName(), false, false
	t.completed = false
	t.sched = nil
	if !st.Entry.Paused {
		// The projector validated the entry; one it cannot schedule does
		// not fire, and the scheduler says so.
		t.sched, _ = schedule.NewSchedule(st.Entry)
	}
}

// handled is the entry's last handled tick, if any.
func (t *track) handled() (time.Time, bool) {
	switch {
	case t.hasWM && !t.seen.After(t.wm):
		return t.wm, true
	case !t.seen.IsZero():
		return t.seen, true
	}
	return time.Time{}, false
}

// due returns the entry's next tick to be handled and when it is due; ok is
// false when none ever is (paused, or the schedule never fires again).
func (t *track) due() (tick, due time.Time, ok bool) {
	if t.sched == nil {
		return time.Time{}, time.Time{}, false
	}
	// Ticks at or before the last config change are never due: the
	// scheduler starts a registered, resumed or changed entry from there.
	from := t.st.Time
	if h, ok := t.handled(); ok && h.After(from) {
		from = h
	}
	if !t.memoValid || !t.memoFrom.Equal(from) {
		t.memoFrom, t.memoValid = from, true
		// Excluded ticks are never late: the first tick that fires is.
		t.memoTick = t.sched.NextFire(from)
		t.memoDue = t.memoTick
		if !t.memoTick.IsZero() {
			t.memoDue = t.memoTick.Add(t.sched.Jitter(t.memoTick))
		}
	}
	if t.memoTick.IsZero() {
		return time.Time{}, time.Time{}, false
	}
	return t.memoTick, t.memoDue, true
}

// lateness is how far past the bound's start the entry's due tick is at
// now, counted from since at the earliest (a detector does not blame the
// time before it ran); ok is false when nothing is due.
func (t *track) lateness(now, since time.Time) (late Late, over time.Duration, ok bool) {
	if t.st.Entry.Ended(now) || t.completed {
		// Past its end_at the entry shows as ended, at its max_fires as
		// completed: never as late.
		return Late{}, 0, false
	}
	tick, due, ok := t.due()
	if !ok || !now.After(due) {
		return Late{}, 0, false
	}
	from := due
	if since.After(from) {
		from = since
	}
	return Late{Entry: t.id, Queue: t.queue, Tick: tick, Due: due, OverdueSeconds: int64(now.Sub(due) / time.Second)}, now.Sub(from), true
}

// readQueue is one queue's watermark read: the entries asked for and,
// once read, their watermarks.
type readQueue struct {
	queue string
	ids   []string
	infos []taskstate.WatermarkInfo // nil: not read
	// limited are the ids with a fire limit (maxFires, counting since);
	// fires their counters as read.
	limited map[string]projector.State
	fires   map[string]taskstate.FireCount
}

// readRequests groups the entries of tracks per queue.
func readRequests(tracks []*track) []readQueue {
	byQueue := map[string][]string{}
	limited := map[string]map[string]projector.State{}
	for _, t := range tracks {
		byQueue[t.queue] = append(byQueue[t.queue], t.id)
		if t.st.Entry.Limited() {
			if limited[t.queue] == nil {
				limited[t.queue] = map[string]projector.State{}
			}
			limited[t.queue][t.id] = t.st
		}
	}
	out := make([]readQueue, 0, len(byQueue))
	for _, q := range slices.Sorted(maps.Keys(byQueue)) {
		out = append(out, readQueue{queue: q, ids: byQueue[q], limited: limited[q]})
	}
	return out
}

// fetch reads the watermarks of reqs, one queue at a time (one MGET per
// thousand entries, in taskstate). It touches no track, so it can run
// beside the loop; a queue whose read failed stays unread.
func fetch(ctx context.Context, wm Watermarks, names events.Names, reqs []readQueue) error {
	var errs []string
	var first error
	for i := range reqs {
		infos, err := wm.Watermarks(ctx, names.Prefix(), reqs[i].queue, reqs[i].ids)
		fires := map[string]taskstate.FireCount{}
		for id := range reqs[i].limited {
			if err != nil {
				break
			}
			var c taskstate.FireCount
			var ok bool
			if c, ok, err = wm.FireCount(ctx, names.Prefix(), reqs[i].queue, id); ok {
				fires[id] = c
			}
		}
		if err != nil {
			if first == nil {
				first = err
			}
			errs = append(errs, err.Error())
			continue
		}
		reqs[i].infos, reqs[i].fires = infos, fires
	}
	if first != nil {
		return fmt.Errorf("read watermarks: %s: %w", strings.Join(errs, "; "), first)
	}
	return nil
}

// record applies what fetch read to the tracks that are still in the
// queue they were read in.
func record(tracks func(id string) *track, reqs []readQueue) {
	for _, r := range reqs {
		if r.infos == nil {
			continue
		}
		for i, id := range r.ids {
			if t := tracks(id); t != nil && t.queue == r.queue {
				t.wm, t.hasWM, t.known = r.infos[i].Tick, r.infos[i].OK, true
				c, ok := r.fires[id]
				t.completed = ok && t.st.Entry.Limited() && c.Since == t.st.MaxFiresSince && c.Count >= t.st.Entry.MaxFires
			}
		}
	}
}

// sortLate orders late entries oldest tick first, then by entry.
func sortLate(l []Late) {
	slices.SortFunc(l, func(a, b Late) int {
		if c := a.Tick.Compare(b.Tick); c != 0 {
			return c
		}
		return strings.Compare(a.Entry, b.Entry)
	})
}

// Check computes once which of entries are late at now, from their
// watermarks in Redis (`cronstream status` runs it). A queue whose
// watermarks cannot be read is left out and reported in the error.
func Check(ctx context.Context, wm Watermarks, names events.Names, entries []projector.State, now time.Time, lateAfter time.Duration) ([]Late, error) {
	lateAfter = cmp.Or(max(lateAfter, 0), DefaultLateAfter)
	tracks := make([]*track, 0, len(entries))
	for _, st := range entries {
		t := newTrack(st)
		if _, _, ok := t.due(); ok {
			tracks = append(tracks, t)
		}
	}
	byID := make(map[string]*track, len(tracks))
	for _, t := range tracks {
		byID[t.id] = t
	}
	reqs := readRequests(tracks)
	err := fetch(ctx, wm, names, reqs)
	record(func(id string) *track { return byID[id] }, reqs)
	var out []Late
	for _, t := range tracks {
		if !t.known {
			continue
		}
		if l, over, ok := t.lateness(now, time.Time{}); ok && over > lateAfter {
			out = append(out, l)
		}
	}
	sortLate(out)
	return out, err
}
