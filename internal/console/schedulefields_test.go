package console_test

import (
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/console"
)

// TestConsoleScheduleFields: an entry past its end_at shows as ended (not
// paused) in the entries table, under the ended filter and on its page,
// with its window, exclusions and labels.
func TestConsoleScheduleFields(t *testing.T) {
	t.Parallel()
	s := startSite(t, console.Config{})
	end := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	s.put(events.Entry{ID: "over", Cron: "@every 1h", Task: events.Task{Type: "t"}, EndAt: end,
		Exclude: []string{"* * 25 12 *"}, Labels: map[string]string{"team": "payments"}})
	s.put(events.Entry{ID: "live", Cron: "@every 1h", Task: events.Task{Type: "t"}})
	s.waitFor("/entries?state=ended", "over")
	if body := s.page("/entries?state=ended"); strings.Contains(body, ">live<") {
		t.Error("an active entry is listed as ended")
	}
	if body := s.page("/entries?state=active"); strings.Contains(body, ">over<") {
		t.Error("an ended entry is listed as active")
	}
	body := s.page("/entries/over")
	for _, want := range []string{end.Format(time.RFC3339), "* * 25 12 *", "team=payments", "None: ended."} {
		if !strings.Contains(body, want) {
			t.Errorf("entry page lacks %q", want)
		}
	}
}

// TestConsoleMaxFires: an entry that fired its max_fires shows as completed
// in the entries table and on its page, with none left and no next fire.
func TestConsoleMaxFires(t *testing.T) {
	t.Parallel()
	s := startSite(t, console.Config{})
	s.put(events.Entry{ID: "lim", Cron: "@every 1s", Task: events.Task{Type: "t"}, MaxFires: 1})
	s.put(events.Entry{ID: "open", Cron: "@every 1h", Task: events.Task{Type: "t"}, MaxFires: 5})
	s.waitFor("/entries", `<span class="paused">completed</span>`)
	body := s.page("/entries/lim")
	for _, want := range []string{"1 (0 left)", "None: completed."} {
		if !strings.Contains(body, want) {
			t.Errorf("entry page lacks %q", want)
		}
	}
	s.waitFor("/entries?state=completed", ">lim<")
	if body := s.page("/entries?state=completed"); strings.Contains(body, ">open<") {
		t.Error("an entry with fires left is listed as completed")
	}
	body = s.page("/entries?state=active")
	if strings.Contains(body, ">lim<") || !strings.Contains(body, ">open<") {
		t.Errorf("the active filter lists a completed entry or misses an active one:\n%s", body)
	}
	// The forecast counts no tick of the completed entry and at most the
	// fires left of the other (one @every 1h tick in the hour).
	if body := s.page("/forecast?window=1h"); !strings.Contains(body, "1 fires from 1 entries") {
		t.Errorf("forecast counts the completed entry:\n%.2000s", body)
	}
}

// TestConsoleCompletedFilterInBrowser: the state filter offers completed on
// the live table (not on time travel, which cannot know it) and keeps it
// selected.
func TestConsoleCompletedFilterInBrowser(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	s := startSite(t, console.Config{})
	s.put(events.Entry{ID: "lim", Cron: "@every 1s", Task: events.Task{Type: "t"}, MaxFires: 1})
	s.put(events.Entry{ID: "hourly-x", Cron: "@every 1h", Task: events.Task{Type: "t"}})
	s.waitFor("/entries?state=completed", ">lim<")
	text := b.visit(s.url("/entries?state=completed"))
	if !strings.Contains(text, "lim") || strings.Contains(text, "hourly-x") {
		t.Errorf("completed filter shows:\n%s", text)
	}
	if body := s.page("/entries?state=completed"); !strings.Contains(body, `<option value="completed" selected>`) {
		t.Error("the completed option is not selected")
	}
	if body := s.page("/timetravel?at=" + time.Now().UTC().Format(time.RFC3339)); strings.Contains(body, `value="completed"`) {
		t.Error("time travel offers the completed filter")
	}
}

// TestConsoleCalendarEntry: the entry page of a calendar spec lists the
// next fires its dates give (the last Friday of each month at 17:00 in New
// York), and the entries table its next fire.
func TestConsoleCalendarEntry(t *testing.T) {
	t.Parallel()
	s := startSite(t, console.Config{})
	s.put(events.Entry{ID: "payday", Cron: "0 17 ? * 5L", Timezone: "America/New_York", Task: events.Task{Type: "t"}})
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	now := time.Now()
	for m := 0; len(want) < 10; m++ {
		// The last Friday: back from the month's last day.
		d := time.Date(now.Year(), now.Month()+time.Month(m)+1, 0, 17, 0, 0, 0, ny)
		for d.Weekday() != time.Friday {
			d = d.AddDate(0, 0, -1)
		}
		if d.After(now.Add(time.Minute)) { // a tick within the minute may pass while the page loads
			want = append(want, d.UTC().Format("2006-01-02 15:04:05"))
		}
	}
	body := s.waitFor("/entries", ">payday<")
	if !strings.Contains(body, want[0]) {
		t.Errorf("entries table lacks the next fire %s", want[0])
	}
	body = s.page("/entries/payday")
	for _, w := range want {
		if !strings.Contains(body, "<li>"+w+"</li>") {
			t.Errorf("entry page lacks next fire %s", w)
		}
	}
}
