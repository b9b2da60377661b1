package scheduler

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testlog"
	"github.com/cronstream/cronstream/schedule"
)

// planScheduler is a scheduler built without running, for plan.
func planScheduler() *Scheduler {
	return &Scheduler{cfg: Config{ReplicaID: "r1", Grace: DefaultGrace, MaxCatchup: DefaultMaxCatchup, Names: events.MustNames(events.DefaultPrefix)},
		src: events.ReplicaSource("r1"), m: NewMetrics(nil), clock: clock.Local()}
}

func planEntry(t *testing.T, spec string, cursor time.Time) *entryRun {
	t.Helper()
	en := events.Entry{ID: "e1", Cron: spec, Task: events.Task{Type: "t"}}
	if err := en.Validate(); err != nil {
		t.Fatal(err)
	}
	en = en.Normalize()
	sched, err := schedule.NewSchedule(en)
	if err != nil {
		t.Fatal(err)
	}
	r := &entryRun{id: en.ID, sched: sched, queue: "default", cursor: cursor, hasCursor: true, state: stateReady, index: -1}
	r.st.Entry = en
	return r
}

// TestPlanFiresDueTickWithSkip: an entry found with missed ticks (older
// than the grace) whose next tick is due already fires that tick in the
// step that records the missed ones: one fire, the skipped run attached,
// the watermark moved to the fired tick. A skip step of its own left the
// entry a grace behind, and a replica whose passes take longer than the
// rest of the grace found it missed again at every pass and fired nothing.
func TestPlanFiresDueTickWithSkip(t *testing.T) {
	s := planScheduler()
	now := time.Date(2026, 12, 2, 1, 0, 0, 300_000_000, time.UTC)
	r := planEntry(t, "@every 1s", now.Add(-20*time.Second).Truncate(time.Second))
	fires, more := s.plan(r, now, nil)
	if len(fires) != 1 || more {
		t.Fatalf("plan = %d fires (more %v), want 1", len(fires), more)
	}
	f := fires[0]
	boundary := now.Add(-s.cfg.Grace)
	if f.Kind != taskstate.FireTick || f.Msg == nil {
		t.Fatalf("fire kind %v (task %v), want a tick that creates its task", f.Kind, f.Msg != nil)
	}
	if f.Tick.Before(boundary) || f.Tick.After(now) || !f.Tick.Equal(r.sched.Next(f.Tick.Add(-time.Second))) {
		t.Fatalf("fired tick %s, want the first tick within the grace (after %s)", f.Tick, boundary)
	}
	if !f.Expected.Equal(r.cursor) {
		t.Fatalf("expected watermark %s, want the cursor %s", f.Expected, r.cursor)
	}
	sk := decodeSkipped(t, f)
	if sk.Until == nil || !sk.Until.Equal(f.Tick.Add(-time.Second)) || !sk.ScheduledAt.Equal(r.cursor.Add(time.Second)) {
		t.Fatalf("skipped %s..%v, want every tick from after the cursor %s to before the fired tick %s", sk.ScheduledAt, sk.Until, r.cursor, f.Tick)
	}
}

// TestPlanSkipsAloneWhenNextNotDue: missed ticks whose next tick is not due
// yet are recorded at once, in a skip step without a task.
func TestPlanSkipsAloneWhenNextNotDue(t *testing.T) {
	s := planScheduler()
	now := time.Date(2026, 12, 2, 1, 0, 30, 0, time.UTC)
	r := planEntry(t, "@every 1m", now.Add(-10*time.Minute).Truncate(time.Minute))
	fires, _ := s.plan(r, now, nil)
	if len(fires) != 1 || fires[0].Kind != taskstate.FireSkip || fires[0].Msg != nil || len(fires[0].SkippedRecords) != 1 {
		t.Fatalf("plan = %+v, want one skip step", fires)
	}
	if !fires[0].Tick.Before(now.Add(-s.cfg.Grace)) {
		t.Fatalf("skip moves the watermark to %s, a tick not missed", fires[0].Tick)
	}
}

// decodeSkipped is the skipped run a fire records.
func decodeSkipped(t *testing.T, f taskstate.Fire) events.Skipped {
	t.Helper()
	if len(f.SkippedRecords) != 1 {
		t.Fatalf("%d skipped records, want one run", len(f.SkippedRecords))
	}
	ev, err := events.DecodeEvent(f.SkippedRecords[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	var sk events.Skipped
	if err := ev.DecodeData(&sk); err != nil {
		t.Fatal(err)
	}
	return sk
}

// TestPlanBehindAgainFiresLatest: an entry found with missed ticks again
// soon after a committed step that recorded missed ones (a replica with
// more due than it fires in a grace) fires its latest due tick, the ticks
// before it recorded as one skipped run, instead of its oldest tick within
// the grace, which would leave it to be found missed again at the next
// pass: a skipped record with every fire.
func TestPlanBehindAgainFiresLatest(t *testing.T) {
	s := planScheduler()
	now := time.Date(2026, 12, 2, 1, 0, 0, 300_000_000, time.UTC)
	r := planEntry(t, "@every 1s", now.Add(-20*time.Second).Truncate(time.Second))
	r.skippedAt = now.Add(-3 * time.Second)
	fires, _ := s.plan(r, now, nil)
	if len(fires) != 1 || fires[0].Kind != taskstate.FireTick || fires[0].Msg == nil {
		t.Fatalf("plan = %+v, want one tick fire", fires)
	}
	f := fires[0]
	if latest := now.Truncate(time.Second); !f.Tick.Equal(latest) {
		t.Fatalf("fired %s, want the latest due tick %s", f.Tick, latest)
	}
	sk := decodeSkipped(t, f)
	if sk.Until == nil || !sk.Until.Equal(f.Tick.Add(-time.Second)) || !sk.ScheduledAt.Equal(r.cursor.Add(time.Second)) || sk.Count != 19 {
		t.Fatalf("skipped %s..%v (%d), want every tick from after the cursor %s to before the fired tick %s", sk.ScheduledAt, sk.Until, sk.Count, r.cursor, f.Tick)
	}
	if !r.skippedAt.Equal(now.Add(-3 * time.Second)) {
		t.Fatalf("plan moved skippedAt to %s: only a committed step may", r.skippedAt)
	}
}

// TestPlanBehindLongAgoFiresOldestInGrace: a committed skip more than two
// graces ago says nothing of the replica's pace now (an outage, a restore
// after a Redis data loss): the oldest tick within the grace fires, and
// the ticks after it, all within the grace, are left to fire.
func TestPlanBehindLongAgoFiresOldestInGrace(t *testing.T) {
	s := planScheduler()
	now := time.Date(2026, 12, 2, 1, 0, 0, 300_000_000, time.UTC)
	r := planEntry(t, "@every 1s", now.Add(-20*time.Second).Truncate(time.Second))
	r.skippedAt = now.Add(-2*s.cfg.Grace - time.Millisecond)
	fires, _ := s.plan(r, now, nil)
	if len(fires) != 1 {
		t.Fatalf("plan = %d fires, want 1", len(fires))
	}
	if f := fires[0]; f.Tick.Before(now.Add(-s.cfg.Grace)) || !f.Tick.Before(now.Add(-s.cfg.Grace).Add(time.Second)) {
		t.Fatalf("fired %s, want the oldest tick within the grace", f.Tick)
	}
}

// TestApplySetsSkippedAtOnCommit: only a step that recorded missed ticks
// and committed marks the entry; a refused step (a watermark lost in
// Redis, a restore still settling) does not, so an entry reloaded after a
// data loss fires every tick still within the grace.
func TestApplySetsSkippedAtOnCommit(t *testing.T) {
	s := planScheduler()
	s.loading = map[string]*entryRun{}
	now := s.clock.Now()
	r := planEntry(t, "@every 1s", now.Add(-20*time.Second).Truncate(time.Second))
	fires, _ := s.plan(r, now, nil)
	if len(fires) != 1 {
		t.Fatalf("plan = %d fires, want 1", len(fires))
	}
	sent := sentOf(&fires[0], &taskstate.FireResult{})
	s.apply(r, sent, taskstate.FireResult{Status: taskstate.StatusWatermarkMismatch, Watermark: r.cursor, HasWatermark: true}, now)
	if !r.skippedAt.IsZero() {
		t.Fatalf("a refused step set skippedAt %s", r.skippedAt)
	}
	s.apply(r, sent, taskstate.FireResult{Status: taskstate.StatusFired, TaskID: "t1"}, now)
	if r.skippedAt.IsZero() {
		t.Fatal("a committed step that recorded missed ticks left skippedAt unset")
	}
}

// TestMissedTicksLogged: fires that recorded missed ticks are logged in
// one warning naming how many entries and the earliest, and an overloaded
// replica, which records missed ticks at every pass, logs at most one
// line per missedReportEvery.
func TestMissedTicksLogged(t *testing.T) {
	m := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s := planScheduler()
	s.clock = clock.New(nil, clock.Options{Manual: m})
	var logged testlog.Buffer
	s.log = slog.New(slog.NewTextHandler(&logged, nil))
	s.loading = map[string]*entryRun{}
	fireLate := func(id string, behind time.Duration) {
		t.Helper()
		now := s.clock.Now()
		r := planEntry(t, "@every 1s", now.Add(-behind).Truncate(time.Second))
		r.id = id
		fires, _ := s.plan(r, now, nil)
		if len(fires) != 1 || !skipReasons(fires[0].SkippedRecords).missed {
			t.Fatalf("%s: plan = %+v, want one fire carrying missed ticks", id, fires)
		}
		s.apply(r, sentOf(&fires[0], &taskstate.FireResult{}), taskstate.FireResult{Status: taskstate.StatusFired, TaskID: id}, now)
	}
	lines := func() int { return strings.Count(logged.String(), "recorded as skipped (missed)") }

	fireLate("a", 20*time.Second)
	fireLate("b", 30*time.Second)
	s.missed.report(s)
	if lines() != 1 || !strings.Contains(logged.String(), "entries=2 first=a") {
		t.Fatalf("after a pass with two entries' missed ticks, the log holds:\n%s", logged.String())
	}
	fireLate("c", 20*time.Second)
	s.missed.report(s)
	m.Advance(missedReportEvery - time.Second)
	s.missed.report(s)
	if lines() != 1 {
		t.Fatalf("a second line within %s:\n%s", missedReportEvery, logged.String())
	}
	m.Advance(time.Second)
	s.missed.report(s)
	if lines() != 2 || !strings.Contains(logged.String(), "entries=1 first=c") {
		t.Fatalf("the missed ticks since the last line were not logged after %s:\n%s", missedReportEvery, logged.String())
	}
}
