package scheduler

import (
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// planScheduler is a scheduler built without running, for plan.
func planScheduler() *Scheduler {
	return &Scheduler{cfg: Config{ReplicaID: "r1", Grace: DefaultGrace, MaxCatchup: DefaultMaxCatchup, Names: events.MustNames(events.DefaultPrefix)},
		src: events.ReplicaSource("r1"), m: NewMetrics(nil)}
}

func planEntry(t *testing.T, spec string, cursor time.Time) *entryRun {
	t.Helper()
	en := events.Entry{ID: "e1", Cron: spec, Task: events.Task{Type: "t"}}
	if err := en.Validate(); err != nil {
		t.Fatal(err)
	}
	en = en.Normalize()
	sched, err := NewSchedule(en)
	if err != nil {
		t.Fatal(err)
	}
	r := &entryRun{id: en.ID, sched: sched, queue: "default", cursor: cursor, hasCursor: true, phase: phaseReady, index: -1}
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
	if len(f.SkippedRecords) != 1 {
		t.Fatalf("%d skipped records, want the missed run as one", len(f.SkippedRecords))
	}
	ev, err := events.DecodeEvent(f.SkippedRecords[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	var sk events.Skipped
	if err := ev.DecodeData(&sk); err != nil {
		t.Fatal(err)
	}
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
