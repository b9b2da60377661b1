package taskstate

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// TestEnqueueOptionStringsMatchAsynq compares our option strings with asynq's
// own Option.String() output.
func TestEnqueueOptionStringsMatchAsynq(t *testing.T) {
	t.Parallel()
	deadline := time.Date(2026, 5, 1, 12, 30, 0, 0, time.UTC)
	got := EnqueueOptions{
		Queue: `re"ports`, MaxRetry: 3, Timeout: 30 * time.Minute, Deadline: deadline,
		Unique: time.Hour, Retention: 24 * time.Hour, Group: "g:1",
	}.Strings()
	want := []string{
		asynq.Queue(`re"ports`).String(), asynq.MaxRetry(3).String(), asynq.Timeout(30 * time.Minute).String(),
		asynq.Deadline(deadline).String(), asynq.Unique(time.Hour).String(), asynq.Retention(24 * time.Hour).String(),
		asynq.Group("g:1").String(),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("option strings\n got %q\nwant %q", got, want)
	}
	minimal := EnqueueOptions{MaxRetry: -1}.Strings()
	if !slices.Equal(minimal, []string{asynq.MaxRetry(-1).String()}) {
		t.Fatalf("minimal options %q", minimal)
	}
	for _, s := range append(got, minimal...) {
		if !strings.Contains(s, "(") {
			t.Fatalf("option %q has no '(' (asynq's Inspector would panic)", s)
		}
	}
}

// TestSchedulerEntriesVisibleToInspector writes our entries under the shared
// scheduler id and reads them with asynq's Inspector.
func TestSchedulerEntriesVisibleToInspector(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rc := newTestStore(t)
	insp := asynq.NewInspectorFromRedisClient(rc)
	next := time.Date(2026, 3, 1, 9, 5, 0, 0, time.UTC)
	prev := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	entries := []SchedulerEntry{
		{
			ID: "daily-report", Spec: "0 9 * * *", TaskType: "report:daily", TaskPayload: []byte(`{"team":"ops"}`),
			EnqueueOptions: EnqueueOptions{Queue: "reports", MaxRetry: 5, Timeout: 10 * time.Minute, Retention: 24 * time.Hour, Group: "g"}.Strings(),
			Next:           next, Prev: prev,
		},
		{
			ID: "never-fired", Spec: "@every 5m", TaskType: "ping",
			EnqueueOptions: EnqueueOptions{Queue: "default", MaxRetry: 25, Timeout: 30 * time.Minute, Unique: time.Hour}.Strings(),
			Next:           next,
		},
	}
	id := SchedulerID(testPrefix)
	// Three replicas write the same entries: each is listed once.
	for range 3 {
		if err := s.WriteSchedulerEntries(ctx, id, entries, 20*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	got, err := insp.SchedulerEntries()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("Inspector lists %d entries, want 2", len(got))
	}
	byID := map[string]*asynq.SchedulerEntry{}
	for _, e := range got {
		byID[e.ID] = e
	}
	d := byID["daily-report"]
	if d == nil || d.Spec != "0 9 * * *" || d.Task.Type() != "report:daily" || string(d.Task.Payload()) != `{"team":"ops"}` ||
		!d.Next.Equal(next) || !d.Prev.Equal(prev) {
		t.Fatalf("daily-report listed as %+v", d)
	}
	var opts []string
	for _, o := range d.Opts {
		opts = append(opts, o.String())
	}
	// asynq parses back every option but Group.
	wantOpts := []string{`Queue("reports")`, "MaxRetry(5)", "Timeout(10m0s)", "Retention(24h0m0s)"}
	if !slices.Equal(opts, wantOpts) {
		t.Fatalf("options %q, want %q", opts, wantOpts)
	}
	if n := byID["never-fired"]; n == nil || !n.Prev.IsZero() {
		t.Fatalf("never-fired entry's prev = %v, want zero (CLI shows N/A)", n)
	}

	key := SchedulerEntriesKey(id)
	if ttl := rc.TTL(ctx, key).Val(); ttl <= 15*time.Second || ttl > 20*time.Second {
		t.Fatalf("entries key ttl %s, want 20s", ttl)
	}
	score := rc.ZScore(ctx, AllSchedulersKey, key).Val()
	if d := score - float64(time.Now().Add(20*time.Second).Unix()); d < -2 || d > 2 {
		t.Fatalf("asynq:schedulers score %v, want now+20s", score)
	}
	if n := rc.ZCard(ctx, AllSchedulersKey).Val(); n != 1 {
		t.Fatalf("%d schedulers registered, want the one shared id", n)
	}

	// A bad entry is skipped and reported; the others, before and after
	// it, are still written whole.
	bad := []SchedulerEntry{entries[0], {ID: "bad", Spec: "\xff", TaskType: "x"}, entries[1]}
	if err := s.WriteSchedulerEntries(ctx, id, bad, 20*time.Second); err == nil {
		t.Fatal("bad entry not reported")
	}
	after, _ := insp.SchedulerEntries()
	if len(after) != 2 {
		t.Fatalf("after a bad entry the Inspector lists %d entries, want 2", len(after))
	}
	for _, e := range after {
		if e.ID == "never-fired" && (e.Spec != "@every 5m" || e.Task.Type() != "ping" || !e.Next.Equal(next)) {
			t.Fatalf("the entry written after the bad one reads back as %+v", e)
		}
	}

	if err := s.ClearSchedulerEntries(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got, err := insp.SchedulerEntries(); err != nil || len(got) != 0 {
		t.Fatalf("after clear: %d entries, %v", len(got), err)
	}
}

// TestSchedulerHistory records enqueue events that asynq's Inspector lists
// newest first, capped at 1000 like asynq.
func TestSchedulerHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rc := newTestStore(t)
	insp := asynq.NewInspectorFromRedisClient(rc)
	start := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	const total = MaxSchedulerHistory + 5
	for i := range total {
		ev := SchedulerEnqueueEvent{TaskID: fmt.Sprintf("task-%04d", i), EnqueueTime: start.Add(time.Duration(i) * time.Second)}
		if err := s.RecordSchedulerEnqueueEvent(ctx, "daily-report", ev); err != nil {
			t.Fatal(err)
		}
	}
	if n := rc.ZCard(ctx, SchedulerHistoryKey("daily-report")).Val(); n != MaxSchedulerHistory {
		t.Fatalf("history holds %d events, want %d", n, MaxSchedulerHistory)
	}
	evs, err := insp.ListSchedulerEnqueueEvents("daily-report", asynq.PageSize(3))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 {
		t.Fatalf("listed %d events", len(evs))
	}
	for i, ev := range evs {
		n := total - 1 - i
		if ev.TaskID != fmt.Sprintf("task-%04d", n) || !ev.EnqueuedAt.Equal(start.Add(time.Duration(n)*time.Second)) {
			t.Fatalf("event %d = %+v, want task-%04d", i, ev, n)
		}
	}
	oldest, err := insp.ListSchedulerEnqueueEvents("daily-report", asynq.PageSize(1), asynq.Page(MaxSchedulerHistory))
	if err != nil || len(oldest) != 1 || oldest[0].TaskID != "task-0005" {
		t.Fatalf("oldest kept event %+v, %v; want task-0005", oldest, err)
	}
	if err := s.ClearSchedulerHistory(ctx, "daily-report"); err != nil {
		t.Fatal(err)
	}
	if rc.Exists(ctx, SchedulerHistoryKey("daily-report")).Val() != 0 {
		t.Fatal("history not cleared")
	}
}
