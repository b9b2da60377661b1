package taskstate

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/internal/testenv"
)

func bufferFire(n int) Fire {
	f := tickFire("buf", "default", tickAt(n), tickAt(n-1))
	f.OverlapBuffer, f.OverlapRecord = true, record("overlap", "buf", tickAt(n))
	return f
}

// TestFireOverlapBuffer: while the previous task is busy the first tick is
// held (watermark moved, nothing created, no record), a further one is
// skipped as overlap, and the held tick is released exactly once, as a
// pending task with its own fired record, once a real asynq worker finished
// the previous task.
func TestFireOverlapBuffer(t *testing.T) {
	// Not parallel: it checks that the asynq server leaves no goroutine
	// behind, which other tests' goroutines would cloud.
	ctx := context.Background()
	s, rc := newTestStore(t)
	first := tickFire("buf", "default", tickAt(0), time.Time{})
	mustFire(t, s, first, StatusFired)

	res := mustFire(t, s, bufferFire(1), StatusHeld)
	if res.TaskID != taskIDFor("buf", tickAt(1)) {
		t.Fatalf("held result %+v", res)
	}
	// The watermark moved past the held tick and still names the busy task.
	assertWatermark(t, s, "default", "buf", tickAt(1), first.Msg.ID)
	if rc.Exists(ctx, Keys("default").Task(res.TaskID)).Val() != 0 {
		t.Fatal("the held tick created its task")
	}
	// A replica racing for the same tick is refused by the watermark.
	mustFire(t, s, bufferFire(1), StatusWatermarkMismatch)
	// A second tick while one is held is skipped.
	mustFire(t, s, bufferFire(2), StatusSkippedOverlap)

	held, err := s.HeldTicks(ctx, testPrefix, []string{"default", "other"})
	if err != nil {
		t.Fatal(err)
	}
	want := HeldTick{Prefix: testPrefix, Queue: "default", Entry: "buf", Tick: tickAt(1),
		TaskID: taskIDFor("buf", tickAt(1)), PrevTaskID: first.Msg.ID}
	if len(held) != 1 || held[0] != want {
		t.Fatalf("held ticks %+v, want %+v", held, want)
	}
	if out, err := s.ReleaseHeld(ctx, testFences, held[0], HeldRelease{}); err != nil || out != HeldWaiting {
		t.Fatalf("release while the previous task is pending: %v, %v", out, err)
	}

	done := make(chan string, 10)
	startAsynqServer(t, rc, asynq.Config{Concurrency: 4, Queues: map[string]int{"default": 1}}, asynq.HandlerFunc(
		func(ctx context.Context, task *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			done <- id
			return nil
		}))
	if id := <-done; id != first.Msg.ID {
		t.Fatalf("worker took %q", id)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		return rc.Exists(ctx, Keys("default").Task(first.Msg.ID)).Val() == 0
	}, "first task done")

	// Replicas checking at once: exactly one releases it.
	outs := make([]HeldOutcome, 8)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.ReleaseHeld(ctx, testFences, held[0], HeldRelease{})
			if err != nil {
				t.Error(err)
			}
			outs[i] = out
		}()
	}
	wg.Wait()
	if n := len(slices.DeleteFunc(slices.Clone(outs), func(o HeldOutcome) bool { return o != HeldReleased })); n != 1 {
		t.Fatalf("release outcomes %v, want exactly one released", outs)
	}
	if id := <-done; id != want.TaskID {
		t.Fatalf("worker took %q, want the held task", id)
	}
	if held, err := s.HeldTicks(ctx, testPrefix, []string{"default"}); err != nil || len(held) != 0 {
		t.Fatalf("held ticks after release: %v, %v", held, err)
	}
	// The watermark names the released task: the next tick checks it.
	assertWatermark(t, s, "default", "buf", tickAt(2), want.TaskID)
	wantIDs := []string{record("fired", "buf", tickAt(0)).ID, record("overlap", "buf", tickAt(2)).ID,
		record("fired", "buf", tickAt(1)).ID}
	if got := outboxIDs(t, s, "default"); !slices.Equal(got, wantIDs) {
		t.Fatalf("outbox %v, want %v", got, wantIDs)
	}
}

// TestReleaseHeldDrop drops a held tick without creating its task.
func TestReleaseHeldDrop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rc := newTestStore(t)
	mustFire(t, s, tickFire("buf", "default", tickAt(0), time.Time{}), StatusFired)
	mustFire(t, s, bufferFire(1), StatusHeld)
	held, err := s.HeldTicks(ctx, testPrefix, []string{"default"})
	if err != nil || len(held) != 1 {
		t.Fatalf("held ticks %v, %v", held, err)
	}
	if out, err := s.ReleaseHeld(ctx, testFences, held[0], HeldRelease{Drop: true}); err != nil || out != HeldDropped {
		t.Fatalf("drop: %v, %v", out, err)
	}
	if out, err := s.ReleaseHeld(ctx, testFences, held[0], HeldRelease{}); err != nil || out != HeldGone {
		t.Fatalf("release after drop: %v, %v", out, err)
	}
	if rc.Exists(ctx, Keys("default").Task(held[0].TaskID)).Val() != 0 {
		t.Fatal("a dropped tick created its task")
	}
	// Nothing held: the next busy tick is held again.
	mustFire(t, s, bufferFire(2), StatusHeld)
}

// TestReleaseHeldFences: a release presents the fences a fire does. After
// a newer configuration (sequence 11: the entry paused, say) fired into the
// slot, a replica still at sequence 10 neither releases nor drops the held
// tick, and one whose projection lags the freshest by more than its bound
// does neither either; the replica at the newer sequence drops it, with
// the dropped record appended in the same step.
func TestReleaseHeldFences(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rc := newTestStore(t)
	first := tickFire("buf", "default", tickAt(0), time.Time{})
	mustFire(t, s, first, StatusFired)
	mustFire(t, s, bufferFire(1), StatusHeld)
	held, err := s.HeldTicks(ctx, testPrefix, []string{"default"})
	if err != nil || len(held) != 1 {
		t.Fatalf("held ticks %v, %v", held, err)
	}
	// The previous task is done, so only the fences stand in the way.
	if err := rc.Del(ctx, Keys("default").Task(first.Msg.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	newer := Fences{ConfigSeq: 11, FreshAsOf: now, MaxStaleness: 30 * time.Second}
	// Another entry of the slot fires from the newer configuration.
	mustFireWith(t, s, newer, tickFire("other", "default", tickAt(0), time.Time{}), StatusFired)

	for _, drop := range []bool{false, true} {
		if out, err := s.ReleaseHeld(ctx, testFences, held[0], HeldRelease{Drop: drop}); err != nil || out != HeldFenced {
			t.Fatalf("release (drop %v) from sequence 10 after 11 fired: %v, %v; want fenced", drop, out, err)
		}
		stale := Fences{ConfigSeq: 11, FreshAsOf: now.Add(-time.Minute), MaxStaleness: 30 * time.Second}
		if out, err := s.ReleaseHeld(ctx, stale, held[0], HeldRelease{Drop: drop}); err != nil || out != HeldStale {
			t.Fatalf("release (drop %v) a minute stale: %v, %v; want stale", drop, out, err)
		}
	}
	if rc.Exists(ctx, Keys("default").Task(held[0].TaskID)).Val() != 0 {
		t.Fatal("a refused release created the task")
	}
	if got, err := s.HeldTicks(ctx, testPrefix, []string{"default"}); err != nil || len(got) != 1 {
		t.Fatalf("held ticks after refused releases: %v, %v", got, err)
	}

	dropped := record("dropped", "buf", tickAt(1))
	if out, err := s.ReleaseHeld(ctx, newer, held[0], HeldRelease{Drop: true, DroppedRecord: dropped}); err != nil || out != HeldDropped {
		t.Fatalf("drop from sequence 11: %v, %v", out, err)
	}
	if rc.Exists(ctx, Keys("default").Task(held[0].TaskID)).Val() != 0 {
		t.Fatal("a dropped tick created its task")
	}
	if held, n, err := s.HeldCounts(ctx, testPrefix, "default"); err != nil || held != 0 || n != 1 {
		t.Fatalf("held counts after the drop: %d held, %d dropped, %v; want 0, 1", held, n, err)
	}
	ids := outboxIDs(t, s, "default")
	if !slices.Contains(ids, dropped.ID) || slices.Contains(ids, record("fired", "buf", tickAt(1)).ID) {
		t.Fatalf("outbox %v: want the dropped record and no fired record of the held tick", ids)
	}
}

// TestReleaseHeldCountsFires: a release counts against the entry's fire
// limit in the same step (the fires counter moves with the task), and a
// held tick beyond the limit is dropped with its record, not fired.
func TestReleaseHeldCountsFires(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rc := newTestStore(t)
	limited := func(f Fire) Fire {
		f.MaxFires, f.MaxFiresSince = 2, 7
		return f
	}
	first := limited(tickFire("buf", "default", tickAt(0), time.Time{}))
	mustFire(t, s, first, StatusFired)
	mustFire(t, s, limited(bufferFire(1)), StatusHeld)
	rc.Del(ctx, Keys("default").Task(first.Msg.ID))
	held, err := s.HeldTicks(ctx, testPrefix, []string{"default"})
	if err != nil || len(held) != 1 {
		t.Fatalf("held ticks %v, %v", held, err)
	}
	how := HeldRelease{MaxFires: 2, MaxFiresSince: 7, DroppedRecord: record("dropped", "buf", tickAt(1))}
	if out, err := s.ReleaseHeld(ctx, testFences, held[0], how); err != nil || out != HeldReleased {
		t.Fatalf("release: %v, %v", out, err)
	}
	if c, ok, err := s.FireCount(ctx, testPrefix, "default", "buf"); err != nil || !ok || c.Count != 2 || c.Since != 7 {
		t.Fatalf("fires counter after the release: %+v, %t, %v; want 2 since 7", c, ok, err)
	}
	// The limit is reached: the next tick fires nothing.
	mustFire(t, s, limited(bufferFire(2)), StatusCompleted)

	// A tick held under a higher limit, released once the limit is lower
	// again, is dropped with its record and counts nothing.
	raised := func(f Fire) Fire {
		f = limited(f)
		f.MaxFires = 3
		return f
	}
	mustFire(t, s, raised(bufferFire(2)), StatusHeld)
	held, err = s.HeldTicks(ctx, testPrefix, []string{"default"})
	if err != nil || len(held) != 1 {
		t.Fatalf("held ticks %v, %v", held, err)
	}
	rc.Del(ctx, Keys("default").Task(held[0].PrevTaskID))
	how.DroppedRecord = record("dropped", "buf", tickAt(2))
	if out, err := s.ReleaseHeld(ctx, testFences, held[0], how); err != nil || out != HeldCompleted {
		t.Fatalf("release beyond the limit: %v, %v; want completed", out, err)
	}
	if rc.Exists(ctx, Keys("default").Task(held[0].TaskID)).Val() != 0 {
		t.Fatal("a tick beyond the limit created its task")
	}
	if c, _, _ := s.FireCount(ctx, testPrefix, "default", "buf"); c.Count != 2 {
		t.Fatalf("fires counter %+v after a drop, want 2", c)
	}
	if ids := outboxIDs(t, s, "default"); !slices.Contains(ids, how.DroppedRecord.ID) {
		t.Fatalf("outbox %v: no dropped record", ids)
	}
}
