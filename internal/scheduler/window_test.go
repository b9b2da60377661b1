package scheduler_test

import (
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/schedule"
)

// TestWindowAndExclusionAcrossReplicas: three replicas, one killed mid-run,
// fire an entry with an active window and one with an exclusion every
// second. No tick fires outside the window or inside the exclusion; every
// tick inside the window fires once; every excluded tick is recorded once
// as skipped with reason excluded, and every other tick fires once.
func TestWindowAndExclusionAcrossReplicas(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: a 20 s run of three replicas (runs without -short, as in CI)")
	}
	e := newEnv(t)
	start := time.Now().Truncate(time.Second).Add(time.Second)
	winStart, winEnd := start.Add(4*time.Second), start.Add(13*time.Second)
	e.put(
		every("win", "@every 1s", func(en *events.Entry) { en.StartAt, en.EndAt = winStart, winEnd }),
		every("exc", "@every 1s", func(en *events.Entry) { en.Exclude = []string{"*/3 * * * * *"} }),
	)
	now := time.Now
	r1 := e.startNode("r1", nodeOpts{})
	r2 := e.startNode("r2", nodeOpts{})
	r3 := e.startNode("r3", nodeOpts{})
	waitUntil(t, now, start.Add(8*time.Second))
	r1.crash()
	waitUntil(t, now, start.Add(18*time.Second))
	r2.stop()
	r3.stop()
	e.waitOutboxEmpty(10*time.Second, "default")

	led := ledgers(e.readActivity())
	pending := map[string]int{}
	for _, id := range e.pendingIDs("default") {
		pending[id]++
	}

	win := led["win"]
	if win == nil {
		t.Fatal("win never fired")
	}
	first, last := win.firedRange()
	if first != winStart.Unix() || last != winEnd.Unix() {
		t.Errorf("win fired %s..%s, want exactly its window %s..%s", fmtUnix(first), fmtUnix(last), fmtUnix(winStart.Unix()), fmtUnix(winEnd.Unix()))
	}
	for s := range win.fired {
		if s < winStart.Unix() || s > winEnd.Unix() {
			t.Errorf("win: tick %s fired outside its window", fmtUnix(s))
		}
	}
	if len(win.skipped) > 0 {
		t.Errorf("win: skipped events %+v", win.skipped)
	}
	checkEverySecond(t, "win", win, winStart.Unix(), winEnd.Unix())

	exc := led["exc"]
	if exc == nil {
		t.Fatal("exc never fired")
	}
	first, last = exc.firedRange()
	for s := range exc.fired {
		if s%3 == 0 {
			t.Errorf("exc: excluded tick %s fired", fmtUnix(s))
		}
	}
	excluded := 0
	for _, sk := range exc.skipped {
		if sk.Reason != events.SkipExcluded {
			t.Errorf("exc: skipped %+v, want reason excluded", sk)
			continue
		}
		if sk.ScheduledAt.Unix()%3 != 0 || sk.Until != nil {
			t.Errorf("exc: skipped record %+v is not one excluded tick", sk)
		}
		excluded++
	}
	if excluded < 4 {
		t.Errorf("exc: %d excluded ticks recorded over ~17 s, want at least 4", excluded)
	}
	checkEverySecond(t, "exc", exc, first, last)
	for s := first; s <= last; s++ {
		task := schedule.TaskID(testPrefix, "exc", time.Unix(s, 0))
		want := 1
		if s%3 == 0 {
			want = 0
		}
		if pending[task] != want {
			t.Errorf("task %s: %d in the pending list, want %d", task, pending[task], want)
		}
	}
	var st counts
	for _, n := range []*node{r2, r3} {
		s := n.counts()
		st.SkippedExcluded += s.SkippedExcluded
		st.SkippedMissed += s.SkippedMissed
	}
	if st.SkippedExcluded == 0 || st.SkippedMissed != 0 {
		t.Errorf("stats of r2 and r3: %d excluded, %d missed; want some excluded and none missed", st.SkippedExcluded, st.SkippedMissed)
	}
}

// TestScheduleWindowAndExclusions: Next keeps to the window (both bounds
// inclusive) for cron and @every specs, NextFire and Ticks pass over
// excluded ticks.
func TestScheduleWindowAndExclusions(t *testing.T) {
	t.Parallel()
	start := time.Date(2027, 3, 1, 9, 0, 0, 0, time.UTC)
	for _, spec := range []string{"@every 1h", "0 * * * *"} {
		e := every("w", spec, func(en *events.Entry) {
			en.StartAt, en.EndAt = start, start.Add(3*time.Hour)
			en.Exclude = []string{"0 10 * * *"}
		})
		s, err := schedule.NewSchedule(e)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Next(start.Add(-48 * time.Hour)); !got.Equal(start) {
			t.Errorf("%s: first tick %s, want the start %s", spec, got, start)
		}
		if got := s.Next(start.Add(2 * time.Hour)); !got.Equal(start.Add(3 * time.Hour)) {
			t.Errorf("%s: tick at the end %s, want %s", spec, got, start.Add(3*time.Hour))
		}
		if got := s.Next(start.Add(3 * time.Hour)); !got.IsZero() {
			t.Errorf("%s: tick after the end %s", spec, got)
		}
		if got := s.Next(start); !got.Equal(start.Add(time.Hour)) || !s.Excluded(got) {
			t.Errorf("%s: Next after start %s should be the excluded 10:00", spec, got)
		}
		if got := s.NextFire(start); !got.Equal(start.Add(2 * time.Hour)) {
			t.Errorf("%s: NextFire after start %s, want 11:00", spec, got)
		}
		ticks, _ := s.Ticks(start.Add(-time.Hour), start.Add(10*time.Hour), 0)
		if len(ticks) != 3 {
			t.Errorf("%s: ticks %v, want 09:00, 11:00, 12:00", spec, ticks)
		}
	}
}
