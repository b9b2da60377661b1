package schedule

import (
	"testing"
	"time"
)

func TestTaskEntry(t *testing.T) {
	tick := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	for _, c := range []struct {
		id, entry string
		ok        bool
	}{
		{TaskID("cs", "report-daily", tick), "report-daily", true},
		{"cs:report:trigger:req-1", "report", true},
		{"other:report:" + tick.Format(time.RFC3339), "", false},
		{"cs:report", "", false},
		{"cs::x", "", false},
		{"cs:bad id:x", "", false},
		{"6d5f1c0e-uuid-from-asynq", "", false},
	} {
		entry, ok := TaskEntry("cs", c.id)
		if entry != c.entry || ok != c.ok {
			t.Errorf("TaskEntry(%q) = %q, %v; want %q, %v", c.id, entry, ok, c.entry, c.ok)
		}
	}
}
