package firetest

import (
	"testing"
	"time"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/schedule"
)

// Schedule is the schedule of an entry firing by spec in time zone tz
// (empty: UTC) with jitter; the test fails if the entry is not valid.
func Schedule(t testing.TB, spec, tz string, jitter time.Duration) *schedule.Schedule {
	t.Helper()
	e := contract.Entry{ID: "e1", Cron: spec, Timezone: tz, Task: contract.Task{Type: "t"}, Jitter: contract.Duration(jitter)}
	if err := e.Validate(); err != nil {
		t.Fatalf("validate %q: %v", spec, err)
	}
	s, err := schedule.NewSchedule(e)
	if err != nil {
		t.Fatalf("NewSchedule(%q): %v", spec, err)
	}
	return s
}

// UTC is the instant s writes in RFC 3339, in UTC; it panics if s is not
// one, so it serves in a test's table of cases.
func UTC(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}
