package entrystate_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/entrystate"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.LeakOptions()...) }

// TestCount: each entry is in one state: ended before paused, completed
// only for an active limited entry whose counter, of its limit's revision,
// reached the limit (read from a real Redis); without the counters none is
// completed.
func TestCount(t *testing.T) {
	ctx := context.Background()
	store := taskstate.New(testenv.StartRedis(t).Client(t))
	now := time.Date(2027, 3, 1, 12, 0, 0, 0, time.UTC)
	const prefix = "es"
	states := []*projector.State{
		{Entry: events.Entry{ID: "plain", Cron: "@hourly"}},
		{Entry: events.Entry{ID: "paused", Cron: "@hourly", Paused: true}},
		{Entry: events.Entry{ID: "ended-paused", Cron: "@hourly", Paused: true, EndAt: now.Add(-time.Second)}},
		{Entry: events.Entry{ID: "ends-later", Cron: "@hourly", EndAt: now.Add(time.Hour)}},
		{Entry: events.Entry{ID: "done", Cron: "@hourly", MaxFires: 2}, MaxFiresSince: 7},
		{Entry: events.Entry{ID: "old-limit", Cron: "@hourly", MaxFires: 2}, MaxFiresSince: 9},
		{Entry: events.Entry{ID: "lost", Cron: "@hourly", MaxFires: 3, Options: events.Options{Queue: "q2"}}, MaxFiresSince: 4},
		{Entry: events.Entry{ID: "paused-done", Cron: "@hourly", MaxFires: 1, Paused: true}, MaxFiresSince: 5},
		{Entry: events.Entry{ID: "never-fired", Cron: "@hourly", MaxFires: 1}, MaxFiresSince: 5},
	}
	for _, c := range []struct {
		queue, entry string
		count        taskstate.FireCount
	}{
		{"default", "done", taskstate.FireCount{Since: 7, Count: 2}},
		{"default", "old-limit", taskstate.FireCount{Since: 8, Count: 5}}, // an earlier limit's
		{"q2", "lost", taskstate.FireCount{Since: 4, Count: taskstate.FireCountUnknown}},
		{"default", "paused-done", taskstate.FireCount{Since: 5, Count: 1}},
	} {
		if _, err := store.SeedFireCount(ctx, prefix, c.queue, c.entry, c.count); err != nil {
			t.Fatal(err)
		}
	}
	left, err := entrystate.FiresLeft(ctx, store, prefix, states)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]entrystate.State{
		"plain": entrystate.Active, "paused": entrystate.Paused, "ended-paused": entrystate.Ended, "ends-later": entrystate.Active,
		"done": entrystate.Completed, "old-limit": entrystate.Active, "lost": entrystate.Completed,
		"paused-done": entrystate.Paused, "never-fired": entrystate.Active,
	}
	for _, st := range states {
		if got := entrystate.Current(st, left, now); got != want[st.Entry.ID] {
			t.Errorf("%s is %s, want %s", st.Entry.ID, got, want[st.Entry.ID])
		}
	}
	if l := left["lost"]; !l.Unknown || l.Left != 0 {
		t.Errorf("lost count: %+v, want unknown with none left", l)
	}
	if l, ok := left["old-limit"]; !ok || l.Left != 2 || l.Unknown {
		t.Errorf("a counter of an earlier limit: %+v %v, want both fires left", l, ok)
	}
	if _, ok := left["plain"]; ok {
		t.Error("an entry without a limit has fires left")
	}
	if got, want := entrystate.Count(states, left, now), (entrystate.Counts{Active: 4, Paused: 2, Ended: 1, Completed: 2}); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	if got, want := entrystate.Count(states, nil, now), (entrystate.Counts{Active: 6, Paused: 2, Ended: 1}); got != want {
		t.Errorf("counts without Redis %+v, want %+v", got, want)
	}
}
