package scheduler

import (
	"testing"
	"time"

	"github.com/cronstream/cronstream/schedule"
)

func TestParseActivityID(t *testing.T) {
	tick := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		id    string
		entry string
		tick  time.Time
		ok    bool
	}{
		{firedEventID("daily-report", tick), "daily-report", tick, true},
		{skippedEventID("e_1", tickRange{First: tick, Last: tick, Count: 1}), "e_1", tick, true},
		// A range reads as its last tick: the watermark is at least there.
		{skippedEventID("e", tickRange{First: tick.Add(-time.Hour), Last: tick, Count: 3600}), "e", tick, true},
		{"trigger:e:req-1", "", time.Time{}, false},
		// A trigger's unique-duplicate record names no entry tick, even when
		// the request id is a number.
		{"skip:e:trigger:12345", "", time.Time{}, false},
		{"fire:e:notanumber", "", time.Time{}, false},
		{"fire:e", "", time.Time{}, false},
		{"retry:q:abc", "", time.Time{}, false},
		{"", "", time.Time{}, false},
	}
	for _, c := range cases {
		entry, at, ok := schedule.ParseActivityID(c.id)
		if ok != c.ok || entry != c.entry || !at.Equal(c.tick) {
			t.Errorf("ParseActivityID(%q) = %q %s %v, want %q %s %v", c.id, entry, at, ok, c.entry, c.tick, c.ok)
		}
	}
}
