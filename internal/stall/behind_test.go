package stall

import (
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/schedule"
)

// TestMissedTicksShowLate: an entry whose fires keep recording missed
// ticks (a replica offered more than it can fire: each fire is on time
// enough never to be overdue, the ticks between are skipped) shows as late
// with the reason, for LateAfter after its last such fire; not an entry
// that fires without missing, nor one this replica does not track, nor
// one whose ticks were missed once (catch-up after a start or an outage).
func TestMissedTicksShowLate(t *testing.T) {
	now := base.Add(time.Hour)
	d, err := New(Config{Watermarks: taskstate.New(nil), Projection: unusedProjection{}, LateAfter: 10 * time.Second,
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	elapse := func(dur time.Duration) { d.epoch = d.epoch.Add(-dur) }
	for _, id := range []string{"busy", "calm", "once"} {
		d.tracks[id] = &track{id: id, queue: "q"}
	}
	fire := func(id string, lag time.Duration, missed bool) {
		d.Outcome(schedule.Outcome{Entry: id, Tick: now.Add(-lag), Status: schedule.StatusFired, Missed: missed})
	}
	fire("busy", 3*time.Second, true)
	fire("once", time.Second, true)
	fire("untracked", 4*time.Second, true)
	fire("calm", 0, false)
	d.Outcome(schedule.Outcome{Entry: "calm", Tick: now, Status: schedule.StatusWatermarkMismatch, Missed: true})
	elapse(2 * time.Second)
	fire("busy", 4*time.Second, true)
	fire("untracked", 4*time.Second, true)
	fire("once", 0, false)
	fire("calm", 0, false)

	late, byQueue, _ := d.lateSet(now)
	if len(late) != 1 || late[0].Entry != "busy" || late[0].Queue != "q" || late[0].OverdueSeconds != 4 ||
		!strings.Contains(late[0].Reason, "ticks skipped as missed") || byQueue["q"] != 1 {
		t.Fatalf("late %+v by queue %v, want busy alone, 4 s behind, with its reason", late, byQueue)
	}

	// LateAfter after its last fire that missed, the entry is no longer
	// late, and its mark is gone; a missed fire after that starts afresh.
	elapse(11 * time.Second)
	if late, _, _ := d.lateSet(now); len(late) != 0 || len(d.behind) != 0 {
		t.Fatalf("late %+v (marks %v) after LateAfter without a missed tick, want none", late, d.behind)
	}
	fire("busy", 3*time.Second, true)
	if late, _, _ := d.lateSet(now); len(late) != 0 {
		t.Fatalf("late %+v after one missed fire, want none", late)
	}
}
