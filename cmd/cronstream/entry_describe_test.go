package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/schedule"
)

func TestEntryDescribe(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	act := &activity{t: t, js: e.nats.JetStream(t), names: events.MustNames("cronstream")}
	e.ok("entry", "put", "rep", "--cron", "0 9 * * *", "--type", "report", "--queue", "reports", "--jitter", "30m")
	e.ok("entry", "put", "rep", "--note", "second revision")

	// Three fires: one task pending, one archived, one gone; another
	// entry's fire and recovery, which describe must not count.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opt, err := asynq.ParseRedisURI(e.redis.URL)
	if err != nil {
		t.Fatal(err)
	}
	client := asynq.NewClient(opt)
	defer client.Close()
	ins := asynq.NewInspector(opt)
	defer ins.Close()
	base := time.Now().Add(-3 * time.Hour).Truncate(time.Second).UTC()
	ids := []string{"cronstream:rep:a", "cronstream:rep:b", "cronstream:rep:c"}
	for i, id := range ids {
		tick := base.Add(time.Duration(i) * time.Hour)
		act.publish(act.names.FireSubject("rep"), events.TypeEntryFired, "rep", events.Fired{
			Entry: "rep", ScheduledAt: tick, EnqueuedAt: tick.Add(1500 * time.Millisecond), TaskID: id, Queue: "reports", Revision: 2, Replica: "r1"})
		if i < 2 {
			if _, err := client.EnqueueContext(ctx, asynq.NewTask("report", nil), asynq.Queue("reports"), asynq.TaskID(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := ins.ArchiveTask("reports", ids[1]); err != nil {
		t.Fatal(err)
	}
	act.publish(act.names.FireSubject("rep"), events.TypeEntrySkipped, "rep", events.Skipped{Entry: "rep", ScheduledAt: base, Count: 3, Reason: events.SkipMissed})
	act.publish(act.names.FireSubject("rep"), events.TypeEntrySkipped, "rep", events.Skipped{Entry: "rep", ScheduledAt: base, Reason: events.SkipOverlap})
	act.fired("other", "reports")
	// The archive in a batch, as a recovery of several tasks publishes it.
	act.publishBatch("reports", events.TypeTaskArchived, events.TaskRecovered{
		TaskID: "cronstream:rep2:y", Queue: "reports", Type: "report", Retried: 25, MaxRetry: 25, Error: "other entry", Replica: "r1"}, events.TaskRecovered{
		TaskID: ids[1], Queue: "reports", Type: "report", Retried: 25, MaxRetry: 25, Error: "asynq: task lease expired", Replica: "r1"})
	act.publish(act.names.RecoverySubject("reports"), events.TypeTaskRetried, "reports", events.TaskRecovered{
		TaskID: "cronstream:rep2:x", Queue: "reports", Type: "report", Retried: 1, MaxRetry: 25, Error: "other entry", Replica: "r1"})

	var v describeView
	e.okJSON(&v, "entry", "describe", "rep", "--fires", "2", "--next", "3", "--json")
	if v.Entry.ID != "rep" || v.Entry.Note != "second revision" || v.History.Revisions != 2 || v.History.LastType != "updated" || !strings.HasPrefix(v.History.LastSource, "cronstream/cli") {
		t.Errorf("entry and history: %+v %+v", v.Entry, v.History)
	}
	if len(v.Fires) != 2 || v.Fires[0].TaskID != ids[2] || v.Fires[1].TaskID != ids[1] {
		t.Fatalf("fires (the last 2, newest first): %+v", v.Fires)
	}
	if v.Fires[0].State != "gone" || v.Fires[1].State != "archived" || v.Fires[0].LagSeconds != 1.5 {
		t.Errorf("fire states and lag: %+v", v.Fires)
	}
	if v.FiredInWindow != 3 || v.Skipped["missed"] != 3 || v.Skipped["overlap"] != 1 {
		t.Errorf("counts: fired %d skipped %v", v.FiredInWindow, v.Skipped)
	}
	if len(v.Recoveries) != 1 || v.Recoveries[0].TaskID != ids[1] || v.Recoveries[0].Type != "archived" {
		t.Errorf("recoveries: %+v", v.Recoveries)
	}
	// The next fires are the scheduler's, jitter included.
	ent, _, err := events.NewClient(e.nats.JetStream(t), act.names).Get(ctx, "rep")
	if err != nil {
		t.Fatal(err)
	}
	sched, err := schedule.NewSchedule(ent)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.NextFires) != 3 {
		t.Fatalf("next fires %v", v.NextFires)
	}
	for i, tick := 0, sched.Next(time.Now()); i < 3; i, tick = i+1, sched.Next(tick) {
		if want := tick.Add(sched.Jitter(tick)); !v.NextFires[i].Equal(want) {
			t.Errorf("next fire %d = %s, want %s", i, v.NextFires[i], want)
		}
	}

	// The first fire in the log is pending.
	e.okJSON(&v, "entry", "describe", "rep", "--window", "1d", "--fires", "5", "--json")
	if len(v.Fires) != 3 || v.Fires[2].State != "pending" {
		t.Errorf("--fires 5: %+v", v.Fires)
	}

	text := e.ok("entry", "describe", "rep")
	for _, want := range []string{"id:", "rep", "history: 2 config events; last updated", "3 fired; skipped: 3 missed, 1 overlap",
		"last fires (newest first)", "gone", "archived", "pending", "1.5s", "recoveries of its tasks", "asynq: task lease expired", "next fires (jitter applied)"} {
		if !strings.Contains(text, want) {
			t.Errorf("describe text lacks %q:\n%s", want, text)
		}
	}

	// Without Redis: the rest is shown, the states are unknown.
	noRedis := *e
	noRedis.t = t
	noRedis.vars = append(append([]string(nil), e.vars...), "CRONSTREAM_REDIS=redis://127.0.0.1:1")
	var nv map[string]any
	if err := json.Unmarshal([]byte(noRedis.ok("entry", "describe", "rep", "--json")), &nv); err != nil {
		t.Fatal(err)
	}
	if nv["redis_error"] == nil || !strings.Contains(noRedis.ok("entry", "describe", "rep"), "task states unknown") {
		t.Errorf("without Redis: %v", nv)
	}
	if r := e.run("entry", "describe", "nope"); r.code != exitNotFound {
		t.Errorf("describe of an unknown entry:\n%s", r)
	}
	if r := e.run("entry", "describe", "rep", "--window", "soon"); r.code != exitUsage {
		t.Errorf("describe --window soon:\n%s", r)
	}
}
