package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
)

type triggerJSON struct {
	ID        string `json:"id"`
	RequestID string `json:"request_id"`
	TaskID    string `json:"task_id"`
	Queue     string `json:"queue"`
	Created   bool   `json:"created"`
}

type backfillJSON struct {
	Ticks   int      `json:"ticks"`
	Fired   []string `json:"fired"`
	Already int      `json:"already"`
}

func TestTriggerAndBackfill(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	ins := inspector(t, e.redis.URL)
	e.ok("entry", "put", "job", "--cron", "@every 1m", "--type", "job:run", "--payload", "p", "--queue", "jobs")

	// Trigger: idempotent per request id.
	var tr triggerJSON
	e.okJSON(&tr, "entry", "trigger", "job", "--request-id", "deploy-1", "--json")
	if !tr.Created || tr.Queue != "jobs" || tr.TaskID == "" || tr.RequestID != "deploy-1" {
		t.Fatalf("trigger: %+v", tr)
	}
	info, err := ins.GetTaskInfo("jobs", tr.TaskID)
	if err != nil || info.Type != "job:run" || string(info.Payload) != "p" {
		t.Fatalf("triggered task in Redis: %+v, %v", info, err)
	}
	out := e.ok("entry", "trigger", "job", "--request-id", "deploy-1")
	if !strings.Contains(out, "already served") || !strings.Contains(out, tr.TaskID) {
		t.Errorf("second trigger: %s", out)
	}
	// Without a request id each trigger is a new task.
	out = e.ok("entry", "trigger", "job")
	if !strings.Contains(out, "enqueued to queue jobs") {
		t.Errorf("trigger: %s", out)
	}
	if n := len(pendingTasks(t, ins, "jobs")); n != 2 {
		t.Errorf("%d pending tasks after two distinct triggers, want 2", n)
	}

	// Backfill: every tick of the range, once.
	from := time.Now().Add(-10 * time.Minute).Truncate(time.Minute).Add(time.Second)
	to := from.Add(5*time.Minute - time.Second) // ticks at every whole minute after from up to to: 5
	var bf backfillJSON
	e.okJSON(&bf, "entry", "backfill", "job", "--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339), "--before-registration", "--json")
	if bf.Ticks != 5 || len(bf.Fired) != 5 || bf.Already != 0 {
		t.Fatalf("first backfill: %+v", bf)
	}
	for _, id := range bf.Fired {
		if _, err := ins.GetTaskInfo("jobs", id); err != nil {
			t.Errorf("backfilled task %s not in Redis: %v", id, err)
		}
	}
	e.okJSON(&bf, "entry", "backfill", "job", "--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339), "--before-registration", "--json")
	if bf.Ticks != 5 || len(bf.Fired) != 0 || bf.Already != 5 {
		t.Errorf("second backfill created tasks: %+v", bf)
	}
	if n := len(pendingTasks(t, ins, "jobs")); n != 7 {
		t.Errorf("%d pending tasks, want 7 (2 triggers + 5 backfilled)", n)
	}
	text := e.ok("entry", "backfill", "job", "--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339), "--before-registration")
	if !strings.Contains(text, "5 ticks, 0 fired now, 5 had fired already") {
		t.Errorf("backfill text: %s", text)
	}
	msg := e.fail("entry", "backfill", "job", "--from", "-1m", "--to", "+1h")
	if !strings.Contains(msg, "future") {
		t.Errorf("backfill into the future: %s", msg)
	}
	// Guard rails: ticks the entry never had are refused unless asked; a
	// dry run shows what would fire and fires nothing; without a terminal
	// more than --max-changes ticks are refused unless --yes.
	earlier := from.Add(-5 * time.Minute)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--from", earlier.Format(time.RFC3339), "--to", to.Format(time.RFC3339)}, "before entry job was registered"},
		{[]string{"--from", earlier.Format(time.RFC3339), "--to", to.Format(time.RFC3339), "--before-registration", "--max-changes", "2"}, "would fire 5 ticks, more than --max-changes 2"},
		{[]string{"--from", to.Format(time.RFC3339), "--to", from.Format(time.RFC3339)}, "--to"},
	} {
		r := e.run(append([]string{"entry", "backfill", "job"}, c.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("exit %d, want %d saying %q:\n%s", r.code, exitUsage, c.want, r)
		}
	}
	dry := e.ok("entry", "backfill", "job", "--from", earlier.Format(time.RFC3339), "--to", to.Format(time.RFC3339), "--before-registration", "--dry-run")
	if !strings.Contains(dry, "5 fired already, 5 to fire") || !strings.Contains(dry, "dry run: would fire 5 ticks; nothing changed") {
		t.Errorf("dry run: %s", dry)
	}
	if n := len(pendingTasks(t, ins, "jobs")); n != 7 {
		t.Errorf("%d pending tasks after the refusals and the dry run, want 7", n)
	}

	// Every fire wrote its fired record to the outbox with the task (a
	// replica's relay publishes them).
	store := taskstate.New(e.redis.Client(t))
	n, err := store.OutboxLen(context.Background(), events.DefaultPrefix, "jobs")
	if err != nil || n != 7 {
		t.Errorf("outbox holds %d records, %v; want 7", n, err)
	}
}
