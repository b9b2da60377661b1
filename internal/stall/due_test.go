package stall

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// base is a fixed instant on a minute boundary: the tests run on a fake
// clock.
var base = time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC)

func state(t *testing.T, e events.Entry, registered time.Time) projector.State {
	t.Helper()
	if e.Task.Type == "" {
		e.Task.Type = "t"
	}
	e = e.Normalize()
	if err := e.Validate(); err != nil {
		t.Fatalf("entry %q: %v", e.ID, err)
	}
	return projector.State{Entry: e, Revision: 1, Time: registered}
}

// lateAt reports whether tr is late at now by bound (the detector started
// at since) and the overdue tick.
func lateAt(tr *track, now, since time.Time, bound time.Duration) (time.Time, bool) {
	l, over, ok := tr.lateness(now, since)
	return l.Tick, ok && over > bound
}

func TestDueEveryMinute(t *testing.T) {
	tr := newTrack(state(t, events.Entry{ID: "e", Cron: "@every 1m"}, base.Add(-time.Hour)))
	tr.wm, tr.hasWM, tr.known = base, true, true
	bound := 30 * time.Second
	next := base.Add(time.Minute)
	if _, late := lateAt(tr, next.Add(bound), time.Time{}, bound); late {
		t.Error("late exactly at the bound")
	}
	tick, late := lateAt(tr, next.Add(bound+time.Second), time.Time{}, bound)
	if !late || !tick.Equal(next) {
		t.Errorf("late, tick = %v, %v; want true, %v", late, tick, next)
	}
	// The tick fired: the next one is due a minute later.
	tr.wm = next
	if _, late := lateAt(tr, next.Add(bound+time.Second), time.Time{}, bound); late {
		t.Error("late after its tick fired")
	}
	// A fired event seen before the watermark was read again counts too.
	tr.wm = base
	tr.seen = next
	if _, late := lateAt(tr, next.Add(bound+time.Second), time.Time{}, bound); late {
		t.Error("late although a fired event for its tick was seen")
	}
}

func TestDueJitter(t *testing.T) {
	st := state(t, events.Entry{ID: "jittery", Cron: "@every 1m", Jitter: events.Duration(50 * time.Second)}, base.Add(-time.Hour))
	tr := newTrack(st)
	tr.wm, tr.hasWM, tr.known = base, true, true
	sched, err := schedule.NewSchedule(st.Entry)
	if err != nil {
		t.Fatal(err)
	}
	next := base.Add(time.Minute)
	j := sched.Jitter(next)
	bound := 5 * time.Second
	if _, late := lateAt(tr, next.Add(j+bound), time.Time{}, bound); late {
		t.Errorf("late within the bound after tick plus jitter (%s)", j)
	}
	if _, late := lateAt(tr, next.Add(j+bound+time.Second), time.Time{}, bound); !late {
		t.Errorf("not late past the bound after tick plus jitter (%s)", j)
	}
}

func TestDueNeverLate(t *testing.T) {
	bound := time.Second
	now := base.Add(48 * time.Hour)
	for _, c := range []struct {
		name  string
		entry events.Entry
	}{
		{"paused", events.Entry{ID: "p", Cron: "@every 1s", Paused: true}},
		// Validation refuses such a spec; the detector copes anyway.
		{"never fires (30 February)", events.Entry{ID: "feb30", Cron: "0 0 30 2 *", Task: events.Task{Type: "t"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := newTrack(projector.State{Entry: c.entry.Normalize(), Revision: 1, Time: base})
			if _, _, ok := tr.due(); ok {
				t.Error("has a due tick")
			}
			if _, late := lateAt(tr, now, time.Time{}, bound); late {
				t.Error("late")
			}
		})
	}
}

// TestDueEndedNeverLate: past its end_at an entry is never late, even
// when the last ticks of its window never fired; within the window it is.
func TestDueEndedNeverLate(t *testing.T) {
	tr := newTrack(state(t, events.Entry{ID: "ended", Cron: "@every 1s", EndAt: base.Add(time.Minute)}, base))
	if _, late := lateAt(tr, base.Add(30*time.Second), time.Time{}, time.Second); !late {
		t.Error("not late inside its window with no tick fired")
	}
	if _, late := lateAt(tr, base.Add(48*time.Hour), time.Time{}, time.Second); late {
		t.Error("late after its end")
	}
}

// TestDueExcludedNeverLate: an excluded tick is never the due one, however
// long nobody records it; the first tick after it that fires is.
func TestDueExcludedNeverLate(t *testing.T) {
	tr := newTrack(state(t, events.Entry{ID: "x", Cron: "@every 1m", Exclude: []string{"5-9 3 * * *"}}, base.Add(-time.Hour)))
	tr.wm, tr.hasWM, tr.known = base, true, true // 03:04
	bound := 30 * time.Second
	if tick, late := lateAt(tr, base.Add(5*time.Minute), time.Time{}, bound); late {
		t.Errorf("late at 03:09 with tick %s, which is excluded", tick)
	}
	tick, late := lateAt(tr, base.Add(6*time.Minute+bound+time.Second), time.Time{}, bound)
	if !late || !tick.Equal(base.Add(6*time.Minute)) {
		t.Errorf("late %t tick %s, want late for 03:10, the first tick after the exclusion", late, tick)
	}
}

func TestDueFromLastConfigChange(t *testing.T) {
	bound := 5 * time.Second
	// Just registered (or resumed, or moved to another queue: every
	// change is a new floor), no watermark yet: not late before its first
	// tick after the change is due for the bound.
	reg := base.Add(500 * time.Millisecond)
	tr := newTrack(state(t, events.Entry{ID: "new", Cron: "@every 10s"}, reg))
	tr.known = true
	first := base.Add(10 * time.Second)
	if tick, _, _ := tr.due(); !tick.Equal(first) {
		t.Fatalf("first due tick %v, want %v", tick, first)
	}
	if _, late := lateAt(tr, first.Add(bound), time.Time{}, bound); late {
		t.Error("a just-registered entry is late within the bound")
	}
	// An old watermark from before the change does not make it late.
	tr.wm, tr.hasWM = base.Add(-time.Hour), true
	if _, late := lateAt(tr, first.Add(bound), time.Time{}, bound); late {
		t.Error("late from a watermark older than the last config change")
	}
	if _, late := lateAt(tr, first.Add(bound+time.Second), time.Time{}, bound); !late {
		t.Error("not late once its first tick is overdue")
	}
}

// Catch-up none: ticks missed are recorded as skipped, which moves the
// watermark like a fire; until that happens the entry is late.
func TestDueCatchupNone(t *testing.T) {
	bound := 5 * time.Second
	st := state(t, events.Entry{ID: "none", Cron: "@every 1s", Catchup: events.Catchup{Policy: events.CatchupNone}}, base.Add(-time.Hour))
	tr := newTrack(st)
	tr.wm, tr.hasWM, tr.known = base, true, true
	now := base.Add(time.Minute)
	if _, late := lateAt(tr, now, time.Time{}, bound); !late {
		t.Error("not late a minute after its last handled tick")
	}
	// The scheduler skipped the missed ticks up to now-grace and fired
	// the last ones.
	tr.wm = now.Add(-time.Second)
	if _, late := lateAt(tr, now, time.Time{}, bound); late {
		t.Error("late after the missed ticks were skipped")
	}
}

// A detector does not blame the time before it started (a replica
// starting after an outage catches up first).
func TestDueSinceStart(t *testing.T) {
	bound := 5 * time.Second
	tr := newTrack(state(t, events.Entry{ID: "e", Cron: "@every 1s"}, base.Add(-time.Hour)))
	tr.wm, tr.hasWM, tr.known = base, true, true
	now := base.Add(time.Hour)
	if _, late := lateAt(tr, now, now.Add(-bound), bound); late {
		t.Error("late within the bound after the detector started")
	}
	if _, late := lateAt(tr, now, now.Add(-bound-time.Second), bound); !late {
		t.Error("not late past the bound after the detector started")
	}
}

// A config change keeps what was handled and reads the watermark again.
func TestTrackSetKeepsHandled(t *testing.T) {
	tr := newTrack(state(t, events.Entry{ID: "e", Cron: "@every 1s"}, base.Add(-time.Hour)))
	tr.wm, tr.hasWM, tr.known, tr.seen = base, true, true, base.Add(time.Second)
	tr.set(state(t, events.Entry{ID: "e", Cron: "@every 1s", Options: events.Options{Queue: "other"}}, base.Add(2*time.Second)))
	if tr.known || tr.queue != "other" {
		t.Errorf("after a queue change: known %v, queue %q", tr.known, tr.queue)
	}
	if h, ok := tr.handled(); !ok || !h.Equal(base.Add(time.Second)) {
		t.Errorf("handled = %v, %v", h, ok)
	}
}

// unusedProjection is the projection of a detector that is never started.
type unusedProjection struct{}

func (unusedProjection) Subscribe() *projector.Subscription { panic("not started: nothing subscribes") }

func TestOutcomeReadiness(t *testing.T) {
	// Never started: only Outcome and Ready are exercised.
	d, err := New(Config{Watermarks: taskstate.New(nil), Projection: unusedProjection{}, LateAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// elapse moves the detector's monotonic clock on.
	elapse := func(dur time.Duration) { d.epoch = d.epoch.Add(-dur) }

	// Watermark mismatches are routine on non-primaries.
	for range 10 {
		d.Outcome(schedule.Outcome{Entry: "e", Tick: base, Status: schedule.StatusWatermarkMismatch})
		elapse(time.Second)
	}
	if err := d.Ready(); err != nil {
		t.Fatalf("not ready after watermark mismatches: %v", err)
	}

	d.Outcome(schedule.Outcome{Entry: "e", Tick: base, Status: schedule.StatusRevisionFenced})
	if err := d.Ready(); err != nil {
		t.Fatalf("not ready at the first refusal: %v", err)
	}
	elapse(2 * time.Second)
	d.Outcome(schedule.Outcome{Entry: "e", Tick: base, Err: errors.New("i/o timeout")})
	err = d.Ready()
	if err == nil {
		t.Fatal("ready after failing for longer than the bound")
	}
	t.Logf("not ready: %v", err)
	if d.reasons["e"] != "i/o timeout" {
		t.Errorf("reason %q", d.reasons["e"])
	}

	// One success ends the streak and the entry's reason.
	d.Outcome(schedule.Outcome{Entry: "e", Tick: base.Add(time.Second), Status: schedule.StatusFired})
	if err := d.Ready(); err != nil {
		t.Errorf("not ready after a success: %v", err)
	}
	if _, ok := d.reasons["e"]; ok || d.nReasons.Load() != 0 {
		t.Error("reason kept after a success")
	}

	// A streak that stopped long ago (nothing left to fire) has ended.
	elapse(time.Second)
	d.Outcome(schedule.Outcome{Entry: "f", Tick: base, Status: schedule.StatusStale})
	elapse(2 * time.Second)
	d.Outcome(schedule.Outcome{Entry: "f", Tick: base, Status: schedule.StatusStale})
	if d.Ready() == nil {
		t.Fatal("ready while stale")
	}
	elapse(time.Second + retryGap)
	if err := d.Ready(); err != nil {
		t.Errorf("not ready long after the last failure: %v", err)
	}
}

// Check against a real Redis: watermarks read per queue, late entries
// found, paused ones and ones that completed their max_fires left out (a
// limited entry whose counter is of an earlier limit, or below it, is
// late as any other).
func TestCheck(t *testing.T) {
	r := testenv.StartRedis(t)
	store := taskstate.New(r.Client(t))
	names := events.MustNames("stalltest")
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	reg := now.Add(-time.Hour)
	entries := []projector.State{
		state(t, events.Entry{ID: "fresh", Cron: "@every 1s"}, reg),
		state(t, events.Entry{ID: "stuck", Cron: "@every 1s"}, reg),
		state(t, events.Entry{ID: "stuck-q2", Cron: "@every 1s", Options: events.Options{Queue: "q2"}}, reg),
		state(t, events.Entry{ID: "never-fired", Cron: "@every 1s"}, reg),
		state(t, events.Entry{ID: "paused", Cron: "@every 1s", Paused: true}, reg),
		state(t, events.Entry{ID: "new", Cron: "@every 1s"}, now.Add(-time.Second)),
		limitedState(t, "completed", 3, 7, reg),
		limitedState(t, "limit-changed", 3, 9, reg),
		limitedState(t, "below-limit", 3, 7, reg),
	}
	seed := func(queue, entry string, tick time.Time) {
		t.Helper()
		if err := store.SeedWatermark(ctx, names.Prefix(), queue, entry, tick, schedule.TaskID(names.Prefix(), entry, tick), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	seed("default", "fresh", now.Add(-time.Second))
	seed("default", "stuck", now.Add(-time.Minute))
	seed("q2", "stuck-q2", now.Add(-2*time.Minute))
	seed("default", "paused", now.Add(-time.Hour))
	for id, c := range map[string]taskstate.FireCount{"completed": {Since: 7, Count: 3}, "limit-changed": {Since: 7, Count: 3}, "below-limit": {Since: 7, Count: 2}} {
		seed("default", id, now.Add(-time.Minute))
		if _, err := store.SeedFireCount(ctx, names.Prefix(), "default", id, c); err != nil {
			t.Fatal(err)
		}
	}

	late, err := Check(ctx, store, names, entries, now, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range late {
		got = append(got, l.Entry)
	}
	want := []string{"never-fired", "stuck-q2", "below-limit", "limit-changed", "stuck"} // oldest tick first
	if len(got) != len(want) {
		t.Fatalf("late %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("late %v, want %v", got, want)
		}
	}
	if l := late[4]; !l.Tick.Equal(now.Add(-time.Minute+time.Second)) || l.Queue != "default" || l.OverdueSeconds != 59 {
		t.Errorf("stuck: %+v", l)
	}
}

// limitedState is an entry fired every second at most max times, counted
// since revision since.
func limitedState(t *testing.T, id string, max int, since uint64, registered time.Time) projector.State {
	st := state(t, events.Entry{ID: id, Cron: "@every 1s", MaxFires: max}, registered)
	st.MaxFiresSince = since
	return st
}

// TestDueCalendar: an entry on the last weekday of the month is due on
// that day only: not late in the days before it, late once that tick is
// overdue.
func TestDueCalendar(t *testing.T) {
	// base is Wednesday 2030-01-02; January 2030 ends on a Thursday.
	tr := newTrack(state(t, events.Entry{ID: "lw", Cron: "0 0 9 LW * *", Timezone: "Asia/Tokyo"}, base.Add(-time.Hour)))
	tr.wm, tr.hasWM, tr.known = time.Date(2029, 12, 31, 0, 0, 0, 0, time.UTC), true, true // Monday Dec 31st, 09:00 JST
	bound := time.Minute
	due := time.Date(2030, 1, 31, 0, 0, 0, 0, time.UTC) // 09:00 JST
	if tick, late := lateAt(tr, due.Add(-time.Hour), time.Time{}, bound); late {
		t.Errorf("late before its tick, for %s", tick)
	}
	if _, late := lateAt(tr, due.Add(bound), time.Time{}, bound); late {
		t.Error("late at the bound")
	}
	tick, late := lateAt(tr, due.Add(bound+time.Second), time.Time{}, bound)
	if !late || !tick.Equal(due) {
		t.Errorf("late %t for %s, want late for %s", late, tick, due)
	}
}
