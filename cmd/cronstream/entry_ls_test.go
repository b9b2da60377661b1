package main

import (
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
)

func TestEntryLsFiltersAndLastFire(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	act := &activity{t: t, js: e.nats.JetStream(t), names: events.MustNames("cronstream")}
	e.ok("entry", "put", "inv", "--cron", "@daily", "--type", "invoice:send", "--queue", "billing")
	e.ok("entry", "put", "rep", "--cron", "@hourly", "--type", "report:daily", "--queue", "reports")
	e.ok("entry", "pause", "rep")
	e.ok("sync", "-f", writeFile(t, "s.yaml", "entries:\n  - {id: synced, cron: '@daily', task: {type: invoice:remind}, options: {queue: billing}}\n"), "--owner", "team")

	tick := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	act.publish(act.names.FireSubject("inv"), events.TypeEntryFired, "inv", events.Fired{Entry: "inv", ScheduledAt: tick.Add(-time.Hour), EnqueuedAt: tick, TaskID: "cronstream:inv:1", Queue: "billing", Revision: 1, Replica: "r"})
	act.publish(act.names.FireSubject("inv"), events.TypeEntryFired, "inv", events.Fired{Entry: "inv", ScheduledAt: tick, EnqueuedAt: tick, TaskID: "cronstream:inv:2", Queue: "billing", Revision: 1, Replica: "r"})
	act.publish(act.names.FireSubject("rep"), events.TypeEntrySkipped, "rep", events.Skipped{Entry: "rep", ScheduledAt: tick, Reason: events.SkipOverlap})

	ids := func(args ...string) string {
		var vs []entryView
		e.okJSON(&vs, append([]string{"entry", "ls", "--json"}, args...)...)
		var out []string
		for _, v := range vs {
			out = append(out, v.ID)
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "inv,rep,synced"},
		{[]string{"--queue", "billing"}, "inv,synced"},
		{[]string{"--state", "paused"}, "rep"},
		{[]string{"--state", "active", "--queue", "billing"}, "inv,synced"},
		{[]string{"--owner", "team"}, "synced"},
		{[]string{"--owner", ""}, "inv,rep"},
		{[]string{"--type", "invoice:*"}, "inv,synced"},
		{[]string{"--type", "invoice:*", "--owner", "team"}, "synced"},
		{[]string{"--queue", "nowhere"}, ""},
	} {
		if got := ids(tc.args...); got != tc.want {
			t.Errorf("entry ls %v = %s, want %s", tc.args, got, tc.want)
		}
	}

	var vs []entryView
	e.okJSON(&vs, "entry", "ls", "--json")
	if vs[0].LastFire == nil || !vs[0].LastFire.Equal(tick) || vs[0].LastOutcome != "fired" {
		t.Errorf("inv last fire %v %q, want %s fired", vs[0].LastFire, vs[0].LastOutcome, tick)
	}
	if vs[1].LastOutcome != "skipped (overlap)" || vs[2].LastFire != nil {
		t.Errorf("rep %q, synced %v", vs[1].LastOutcome, vs[2].LastFire)
	}
	out := e.ok("entry", "ls")
	if !strings.Contains(out, "LAST FIRE") || !strings.Contains(out, fmtTime(tick)+" skipped (overlap)") {
		t.Errorf("entry ls:\n%s", out)
	}
	if r := e.run("entry", "ls", "--state", "sleeping"); r.code != exitUsage {
		t.Errorf("--state sleeping:\n%s", r)
	}
}
