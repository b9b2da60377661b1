package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
)

// TestBulkPauseResumeRm acts on several entries by ids and by filters, as
// an operator would: the guard rails, the summary and the exit statuses.
func TestBulkPauseResumeRm(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.raceCLI = true // bulk writes run concurrently
	put := func(id string, args ...string) {
		e.ok(append([]string{"entry", "put", id, "--cron", "@hourly", "--type", "job:" + id}, args...)...)
	}
	put("a1", "--label", "team=billing")
	put("a2", "--label", "team=billing", "--queue", "critical")
	put("a3", "--label", "team=billing")
	put("b1", "--label", "team=ops")
	put("c1", "--label", "team=web", "--label", "env=dev")
	// entry put sets no owner (sync does): these two come from a program.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := events.NewClient(e.nats.JetStream(t), events.MustNames("cronstream"))
	for _, id := range []string{"d1", "d2"} {
		if _, err := client.Put(ctx, events.Entry{ID: id, Cron: "@hourly", Task: events.Task{Type: "job:" + id}, Owner: "team-gone"}); err != nil {
			t.Fatal(err)
		}
	}
	e.ok("entry", "pause", "a3")
	paused := func(id string) bool {
		var got entryJSON
		e.okJSON(&got, "entry", "get", id, "--json")
		return got.Paused
	}

	// Several ids.
	if out := e.ok("entry", "pause", "a1", "b1", "--note", "freeze"); !strings.Contains(out, "paused 2 entries") {
		t.Errorf("pause a1 b1: %s", out)
	}
	// A selector: what is paused already is unchanged, and said.
	out := e.ok("entry", "pause", "--selector", "team in (billing,ops)")
	if !strings.Contains(out, "paused 1 entry, 3 unchanged (already paused)") || !paused("a2") || paused("c1") {
		t.Errorf("pause by selector: %s", out)
	}
	// Without a terminal, more than --max-changes is refused whole.
	r := e.run("entry", "resume", "--selector", "team in (billing,ops)", "--max-changes", "2")
	if r.code != exitUsage || !strings.Contains(r.stderr, "would resume 4 entries, more than --max-changes 2") || !strings.Contains(r.stderr, "nothing changed") || !paused("a1") {
		t.Errorf("over --max-changes:\n%s", r)
	}
	// A dry run shows and changes nothing, in text and JSON.
	out = e.ok("entry", "resume", "--selector", "team in (billing,ops)", "--dry-run")
	if !strings.Contains(out, "a1 (revision") || !strings.Contains(out, "dry run: would resume 4 entries; nothing changed") || !paused("a2") {
		t.Errorf("dry run: %s", out)
	}
	var plan bulkPlan
	e.okJSON(&plan, "entry", "resume", "--type", "job:a*", "--dry-run", "--json")
	if len(plan.Would) != 3 || plan.Would[0].ID != "a1" || plan.Would[0].Revision == 0 {
		t.Errorf("dry run --json: %+v", plan)
	}
	// --yes goes beyond --max-changes.
	if out := e.ok("entry", "resume", "--selector", "team in (billing,ops)", "--max-changes", "2", "--yes"); !strings.Contains(out, "resumed 4 entries") || paused("b1") {
		t.Errorf("resume --yes: %s", out)
	}
	// Filters combine, as entry ls's do.
	if out := e.ok("entry", "pause", "--selector", "team=billing", "--queue", "critical"); !strings.Contains(out, "paused 1 entry") || !paused("a2") || paused("a1") {
		t.Errorf("selector and queue: %s", out)
	}
	// An id that does not exist: the others are written, exit 3.
	r = e.run("entry", "pause", "a1", "nope")
	if r.code != exitNotFound || !strings.Contains(r.stdout, "paused 1 entry, 1 not found") || !paused("a1") {
		t.Errorf("pause a1 nope:\n%s", r)
	}
	// rm by owner.
	if out := e.ok("entry", "rm", "--owner", "team-gone", "--yes"); !strings.Contains(out, "removed 2 entries") {
		t.Errorf("rm by owner: %s", out)
	}
	if r := e.run("entry", "get", "d1"); r.code != exitNotFound {
		t.Errorf("d1 after rm: %s", r)
	}
	// Ids and filters together, filters and --if-revision: usage errors.
	for _, args := range [][]string{
		{"entry", "pause", "a1", "--selector", "team=ops"},
		{"entry", "pause"},
		{"entry", "resume", "--selector", "team=ops", "--if-revision", "3"},
		{"entry", "pause", "--selector", "team in (billing"},
	} {
		if r := e.run(args...); r.code != exitUsage {
			t.Errorf("%v: exit %d, want %d\n%s", args, r.code, exitUsage, r)
		}
	}
}

// TestBulkWriteConditionalOnPreviewedRevision: an entry changed between the
// listing a bulk write showed and its write is left alone and counted as
// conflicted.
func TestBulkWriteConditionalOnPreviewedRevision(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.ok("entry", "put", "x1", "--cron", "@hourly", "--type", "t")
	e.ok("entry", "put", "x2", "--cron", "@hourly", "--type", "t")
	c := events.NewClient(e.nats.JetStream(t), events.MustNames("cronstream"))
	listed, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// x2 changes after the listing.
	if _, err := c.Pause(ctx, "x2", "by someone else"); err != nil {
		t.Fatal(err)
	}
	var out bulkResult
	w := bulkWrite{verb: "remove", done: "removed", write: func(ctx context.Context, c *events.Client, id string, opts ...events.WriteOption) (events.Result, error) {
		return c.Remove(ctx, id, opts...)
	}}
	bulkApply(ctx, c, listed, w, &out)
	if len(out.Changed) != 1 || out.Changed[0].ID != "x1" || len(out.Conflicted) != 1 || out.Conflicted[0] != "x2" {
		b, _ := json.Marshal(out)
		t.Fatalf("result %s, want x1 removed and x2 conflicted", b)
	}
	if cur, _, err := c.Get(ctx, "x2"); err != nil || !cur.Paused {
		t.Errorf("x2 after the bulk remove: %+v %v (want it paused, not removed)", cur, err)
	}
}
