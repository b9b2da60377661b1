package configsync

import (
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
)

// TestParseScheduleFields: the schedules file carries start_at, end_at,
// exclude and labels, and names the field and line of a bad value.
func TestParseScheduleFields(t *testing.T) {
	cfgs, err := Parse([]byte(`entries:
  - id: a
    cron: "@every 1h"
    task: {type: t}
    start_at: 2027-03-01
    end_at: "2027-04-01T12:00:00+02:00"
    exclude: "* * 25 12 *"
    labels: {team: payments, example.com/tier: critical}
`), "f")
	if err != nil {
		t.Fatal(err)
	}
	e := cfgs[0].Entry.Normalize()
	if !e.StartAt.Equal(time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)) || !e.EndAt.Equal(time.Date(2027, 4, 1, 10, 0, 0, 0, time.UTC)) ||
		len(e.Exclude) != 1 || e.Labels["example.com/tier"] != "critical" {
		t.Errorf("parsed %+v", e)
	}
	_, err = Parse([]byte(`entries:
  - id: b
    cron: "@every 1h"
    task: {type: t}
    start_at: 2027-05-01
    end_at: 2027-04-01
    exclude: ["@every 1m"]
    labels: {team: "a b"}
`), "f")
	for _, want := range []string{"end_at (line 6)", "exclude (line 7)", "labels.team (line 8)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %q", err, want)
		}
	}
}

// TestSelect: a selector narrows both sides of a sync, and an entry whose
// labels leave the selector is still updated when the file selects it.
func TestSelect(t *testing.T) {
	entry := func(id string, labels map[string]string) events.Entry {
		return events.Entry{ID: id, Cron: "@daily", Task: events.Task{Type: "t"}, Labels: labels, Owner: DefaultOwner}
	}
	pay, ops := map[string]string{"team": "payments"}, map[string]string{"team": "ops"}
	current := []events.Current{
		{ID: "p1", Entry: entry("p1", pay)},
		{ID: "p2", Entry: entry("p2", pay)},
		{ID: "o1", Entry: entry("o1", ops)},
		{ID: "moved", Entry: entry("moved", ops)},
	}
	desired := []Config{{Entry: entry("p1", pay)}, {Entry: entry("o2", ops)}, {Entry: entry("moved", pay)}}
	sel, err := events.ParseSelector("team=payments")
	if err != nil {
		t.Fatal(err)
	}
	cur, des := Select(current, desired, sel)
	plan := MakePlan(cur, des, DefaultOwner, true)
	got := map[string]ActionKind{}
	for _, a := range plan.Actions {
		got[a.ID] = a.Kind
	}
	if len(got) != 2 || got["p2"] != Remove || got["moved"] != Update {
		t.Errorf("plan %+v: want p2 removed, moved updated, o1 and o2 untouched", plan.Actions)
	}
	if c, d := Select(current, desired, events.Selector{}); len(c) != len(current) || len(d) != len(desired) {
		t.Error("the empty selector dropped something")
	}
}
