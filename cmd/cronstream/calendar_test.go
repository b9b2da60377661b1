package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
)

// lastDays are the last days of the months from the one holding from, at
// hour:00 in loc, that lie in (from, until].
func lastDays(loc *time.Location, hour int, from, until time.Time) []time.Time {
	var out []time.Time
	for m := 0; ; m++ {
		d := time.Date(from.Year(), from.Month()+time.Month(m)+1, 0, hour, 0, 0, 0, loc) // day 0: the last of the month before
		if d.After(until) {
			return out
		}
		if d.After(from) {
			out = append(out, d.UTC())
		}
	}
}

// TestCalendarCLI: a calendar spec through the command line — refused with
// the flag named when bad, written as a gated entry, its next fires in
// describe and ls, its past ticks backfilled, exported and synced back
// unchanged.
func TestCalendarCLI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	if out := e.fail("entry", "put", "bad", "--cron", "0 9 * * L", "--type", "t"); !strings.Contains(out, "--cron") || !strings.Contains(out, "name the day before L") {
		t.Errorf("bad calendar spec: %s", out)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	e.ok("entry", "put", "eom", "--cron", "0 0 6 L * ?", "--timezone", "Europe/Berlin", "--type", "close-books", "--queue", "cal")
	if aud := e.ok("audit", "--json", "--entry", "eom"); !strings.Contains(aud, events.TypeEntryRegistered+events.GatedSuffix) {
		t.Errorf("a calendar entry is not written under the gated type:\n%s", aud)
	}

	now := time.Now()
	var v describeView
	e.okJSON(&v, "entry", "describe", "eom", "--next", "4", "--json")
	want := lastDays(berlin, 6, now, now.AddDate(0, 5, 0))[:4]
	if !slices.EqualFunc(v.NextFires, want, time.Time.Equal) {
		t.Errorf("describe next fires %v, want the last days %v", v.NextFires, want)
	}
	var ls []struct {
		ID       string    `json:"id"`
		NextFire time.Time `json:"next_fire"`
	}
	e.okJSON(&ls, "entry", "ls", "--json")
	if len(ls) != 1 || !ls[0].NextFire.Equal(want[0]) {
		t.Errorf("entry ls: %+v, want next fire %s", ls, want[0])
	}

	// Backfill the last 200 days: one task per month end, each the task of
	// its tick.
	from, to := now.AddDate(0, 0, -200), now.Add(-time.Minute)
	var bf backfillJSON
	e.okJSON(&bf, "entry", "backfill", "eom", "--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339), "--json", "--before-registration")
	past := lastDays(berlin, 6, from, to)
	var wantIDs []string
	for _, d := range past {
		wantIDs = append(wantIDs, events.TaskID(events.DefaultPrefix, "eom", d))
	}
	if bf.Ticks != len(past) || !slices.Equal(bf.Fired, wantIDs) {
		t.Errorf("backfill: %d ticks fired %v, want %v", bf.Ticks, bf.Fired, wantIDs)
	}
	ins := inspector(t, e.redis.URL)
	if n := len(pendingTasks(t, ins, "cal")); n != len(past) {
		t.Errorf("%d tasks pending after the backfill, want %d", n, len(past))
	}

	exp := e.ok("export")
	if !strings.Contains(exp, `cron: 0 0 6 L * ?`) && !strings.Contains(exp, `cron: "0 0 6 L * ?"`) {
		t.Errorf("export lacks the spec:\n%s", exp)
	}
	if out := e.ok("sync", "-f", writeFile(t, "cal.yaml", exp), "--dry-run", "--detailed-exitcode"); !strings.Contains(out, "0 to create, 0 to update, 0 to remove, 1 unchanged") {
		t.Errorf("sync of the export: %s", out)
	}
}
