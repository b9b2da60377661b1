package taskstate

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/testenv"
)

// cancelFire is tick n of entry "can" with overlap cancel-previous.
func cancelFire(t testing.TB, n int) Fire {
	t.Helper()
	f := tickFire("can", "default", tickAt(n), tickAt(n-1))
	f.OverlapCancel, f.OverlapRecord = true, record("overlap", "can", tickAt(n))
	id := contract.CancelledEventID("can", tickAt(n))
	data := eventtest.MarshalAt(t, id, tickAt(n), contract.TypeTaskCancelled, "test", "can",
		contract.TaskCancelled{Entry: "can", Queue: "default", ScheduledAt: tickAt(n), ReplacedBy: f.Msg.ID,
			TaskID: CancelPlaceholderTask, State: CancelPlaceholderState, Action: CancelPlaceholderAction})
	var err error
	if f.CancelRecord, err = NewCancelRecord(id, data); err != nil {
		t.Fatal(err)
	}
	return f
}

// outboxCancelled decodes the cancelled events in queue's outbox.
func outboxCancelled(t testing.TB, s *Store, queue string) []contract.TaskCancelled {
	t.Helper()
	recs, err := s.ReadOutbox(context.Background(), testPrefix, queue, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []contract.TaskCancelled
	for _, r := range recs {
		ev, err := contract.DecodeEvent(r.Data)
		if err != nil || ev.Type != contract.TypeTaskCancelled {
			continue
		}
		var c contract.TaskCancelled
		if err := ev.DecodeData(&c); err != nil {
			t.Fatalf("cancelled record %s: %v (%s)", r.EventID, err, r.Data)
		}
		out = append(out, c)
	}
	return out
}

// TestFireOverlapCancelPending: the previous task is still pending (no
// worker): the fire deletes it as asynq's DeleteTask would and creates the
// new one in the same step, with a cancelled record naming it.
func TestFireOverlapCancelPending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rc := newTestStore(t)
	first := tickFire("can", "default", tickAt(0), time.Time{})
	mustFire(t, s, first, StatusFired)

	f := cancelFire(t, 1)
	res := mustFire(t, s, f, StatusFired)
	if res.Replaced != first.Msg.ID || res.ReplacedState != "pending" || res.TaskID != f.Msg.ID {
		t.Fatalf("result %+v, want %s replaced from pending", res, first.Msg.ID)
	}
	k := Keys("default")
	if rc.Exists(ctx, k.Task(first.Msg.ID)).Val() != 0 {
		t.Fatal("the replaced task's hash is still there")
	}
	if got := rc.LRange(ctx, k.Pending(), 0, -1).Val(); !slices.Equal(got, []string{f.Msg.ID}) {
		t.Fatalf("pending list %v, want only the new task", got)
	}
	assertWatermark(t, s, "default", "can", tickAt(1), f.Msg.ID)
	wantIDs := []string{record("fired", "can", tickAt(0)).ID, f.CancelRecord.ID, record("fired", "can", tickAt(1)).ID}
	if got := outboxIDs(t, s, "default"); !slices.Equal(got, wantIDs) {
		t.Fatalf("outbox %v, want %v", got, wantIDs)
	}
	c := outboxCancelled(t, s, "default")
	if len(c) != 1 || c[0].TaskID != first.Msg.ID || c[0].State != "pending" || c[0].Action != contract.CancelDeleted || c[0].ReplacedBy != f.Msg.ID {
		t.Fatalf("cancelled events %+v", c)
	}

	// A scheduled previous task is taken out of the scheduled set.
	g := cancelFire(t, 2)
	g.ProcessAt = time.Now().Add(time.Hour)
	mustFire(t, s, g, StatusFired)
	h := cancelFire(t, 3)
	if res := mustFire(t, s, h, StatusFired); res.Replaced != g.Msg.ID || res.ReplacedState != "scheduled" {
		t.Fatalf("result %+v, want the scheduled task replaced", res)
	}
	if n := rc.ZCard(ctx, k.Scheduled()).Val(); n != 0 {
		t.Fatalf("scheduled set holds %d tasks", n)
	}
	if got := rc.LRange(ctx, k.Pending(), 0, -1).Val(); !slices.Equal(got, []string{h.Msg.ID}) {
		t.Fatalf("pending list %v, want only the newest task", got)
	}
}

// TestFireOverlapCancelActive: a real asynq worker runs the previous task
// until its context is cancelled. The tick is held and a further one
// skipped; the published cancellation sends the task to retry; then, of
// replicas releasing at once, exactly one deletes it from retry and fires
// the held tick.
func TestFireOverlapCancelActive(t *testing.T) {
	// Not parallel: it checks that the asynq server leaves no goroutine
	// behind, which other tests' goroutines would cloud.
	ctx := context.Background()
	s, rc := newTestStore(t)
	started := make(chan string, 10)
	startAsynqServer(t, rc, asynq.Config{Concurrency: 4, Queues: map[string]int{"default": 1}}, asynq.HandlerFunc(
		func(ctx context.Context, task *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			started <- id
			<-ctx.Done()
			return ctx.Err()
		}))
	first := tickFire("can", "default", tickAt(0), time.Time{})
	mustFire(t, s, first, StatusFired)
	if id := <-started; id != first.Msg.ID {
		t.Fatalf("worker took %q", id)
	}
	k := Keys("default")
	f := cancelFire(t, 1)
	res := mustFire(t, s, f, StatusHeld)
	if res.Replaced != first.Msg.ID || res.ReplacedState != "active" {
		t.Fatalf("held result %+v", res)
	}
	mustFire(t, s, cancelFire(t, 2), StatusSkippedOverlap)
	held, err := s.HeldTicks(ctx, testPrefix, []string{"default"})
	if err != nil || len(held) != 1 || !held[0].Cancel || held[0].HeldAt.IsZero() || held[0].PrevTaskID != first.Msg.ID {
		t.Fatalf("held ticks %+v, %v", held, err)
	}
	if r, err := s.ReleaseCancel(ctx, testFences, held[0], HeldRelease{}); err != nil || r.Outcome != HeldWaiting {
		t.Fatalf("release while the previous task runs: %+v, %v", r, err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		if err := s.PublishCancel(ctx, first.Msg.ID); err != nil {
			t.Fatal(err)
		}
		return rc.HGet(ctx, k.Task(first.Msg.ID), "state").Val() == "retry"
	}, "the cancelled task lands in retry")

	outs := make([]CancelRelease, 8)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.ReleaseCancel(ctx, testFences, held[0], HeldRelease{})
			if err != nil {
				t.Error(err)
			}
			outs[i] = r
		}()
	}
	wg.Wait()
	released := slices.DeleteFunc(slices.Clone(outs), func(r CancelRelease) bool { return r.Outcome != HeldReleased })
	if len(released) != 1 || released[0].Deleted != "retry" || released[0].GaveUp {
		t.Fatalf("release outcomes %+v, want exactly one released, deleted from retry", outs)
	}
	if rc.Exists(ctx, k.Task(first.Msg.ID)).Val() != 0 || rc.ZCard(ctx, k.Retry()).Val() != 0 {
		t.Fatal("the cancelled task is still in retry")
	}
	if id := <-started; id != f.Msg.ID {
		t.Fatalf("worker took %q, want the held task", id)
	}
	assertWatermark(t, s, "default", "can", tickAt(2), f.Msg.ID)
	c := outboxCancelled(t, s, "default")
	if len(c) != 1 || c[0].TaskID != first.Msg.ID || c[0].State != "active" || c[0].Action != contract.CancelRequested {
		t.Fatalf("cancelled events %+v", c)
	}
}

// TestReleaseCancelGivesUp: the previous task stays active (its worker is
// gone and no cancellation reaches it): the held tick waits until the
// task's timeout, counted from when the tick was held, has passed.
func TestReleaseCancelGivesUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rc := newTestStore(t)
	first := tickFire("can", "default", tickAt(0), time.Time{})
	first.Msg.Timeout = 60
	mustFire(t, s, first, StatusFired)
	// What asynq's dequeue writes for a task a worker took.
	k := Keys("default")
	rc.LRem(ctx, k.Pending(), 0, first.Msg.ID)
	rc.LPush(ctx, k.Active(), first.Msg.ID)
	rc.HSet(ctx, k.Task(first.Msg.ID), "state", "active")
	rc.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(time.Now().Add(30 * time.Second).Unix()), Member: first.Msg.ID})

	mustFire(t, s, cancelFire(t, 1), StatusHeld)
	held, err := s.HeldTicks(ctx, testPrefix, []string{"default"})
	if err != nil || len(held) != 1 {
		t.Fatalf("held ticks %+v, %v", held, err)
	}
	if r, err := s.ReleaseCancel(ctx, testFences, held[0], HeldRelease{}); err != nil || r.Outcome != HeldWaiting {
		t.Fatalf("release within the timeout: %+v, %v", r, err)
	}
	// Held a timeout plus the grace ago: the task's handler is past its
	// deadline.
	late := held[0]
	late.HeldAt = late.HeldAt.Add(-time.Minute - cancelGrace - time.Second)
	r, err := s.ReleaseCancel(ctx, testFences, late, HeldRelease{})
	if err != nil || r.Outcome != HeldReleased || !r.GaveUp || r.Deleted != "" {
		t.Fatalf("release past the timeout: %+v, %v", r, err)
	}
	if st := rc.HGet(ctx, k.Task(first.Msg.ID), "state").Val(); st != "active" {
		t.Fatalf("the stuck task is %q, want left active for the recoverer", st)
	}
	if got := rc.LRange(ctx, k.Pending(), 0, -1).Val(); !slices.Equal(got, []string{held[0].TaskID}) {
		t.Fatalf("pending list %v, want the released task", got)
	}
}

// setTaskState moves task id of the default queue to state as asynq
// would: out of pending, into active (a worker took it) or retry (its
// cancelled handler returned).
func setTaskState(t testing.TB, rc *redis.Client, id, state string) {
	t.Helper()
	ctx := context.Background()
	k := Keys("default")
	pipe := rc.TxPipeline()
	pipe.LRem(ctx, k.Pending(), 0, id)
	pipe.LRem(ctx, k.Active(), 0, id)
	switch state {
	case "active":
		pipe.LPush(ctx, k.Active(), id)
		pipe.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(time.Now().Add(30 * time.Second).Unix()), Member: id})
	case "retry":
		pipe.ZRem(ctx, k.Lease(), id)
		pipe.ZAdd(ctx, k.Retry(), redis.Z{Score: float64(time.Now().Add(time.Minute).Unix()), Member: id})
	default:
		t.Fatalf("setTaskState: state %q", state)
	}
	pipe.HSet(ctx, k.Task(id), "state", state)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseCancelFences: the cancel-previous release presents the fences
// a fire does, as ReleaseHeld (TestReleaseHeldFences). After a newer
// configuration (sequence 11) fired into the slot, a replica still at
// sequence 10 neither releases nor drops the held tick, nor deletes the
// cancelled previous task, and one whose projection lags the freshest by
// more than its bound does neither either. The replica at the newer
// sequence releases it; a later held tick it drops, counted and with the
// dropped record appended in the same step.
func TestReleaseCancelFences(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rc := newTestStore(t)
	k := Keys("default")
	first := tickFire("can", "default", tickAt(0), time.Time{})
	mustFire(t, s, first, StatusFired)
	setTaskState(t, rc, first.Msg.ID, "active")
	f := cancelFire(t, 1)
	mustFire(t, s, f, StatusHeld)
	held, err := s.HeldTicks(ctx, testPrefix, []string{"default"})
	if err != nil || len(held) != 1 || !held[0].Cancel {
		t.Fatalf("held ticks %+v, %v", held, err)
	}
	// The cancelled task went to retry, so only the fences stand in the way.
	setTaskState(t, rc, first.Msg.ID, "retry")
	now := time.Now()
	newer := Fences{ConfigSeq: 11, FreshAsOf: now, MaxStaleness: 30 * time.Second}
	mustFireWith(t, s, newer, tickFire("other", "default", tickAt(0), time.Time{}), StatusFired)

	stale := Fences{ConfigSeq: 11, FreshAsOf: now.Add(-time.Minute), MaxStaleness: 30 * time.Second}
	for _, drop := range []bool{false, true} {
		dropped := record("dropped", "can", tickAt(1))
		if r, err := s.ReleaseCancel(ctx, testFences, held[0], HeldRelease{Drop: drop, DroppedRecord: dropped}); err != nil || r.Outcome != HeldFenced || r.Deleted != "" {
			t.Fatalf("release (drop %v) from sequence 10 after 11 fired: %+v, %v; want fenced", drop, r, err)
		}
		if r, err := s.ReleaseCancel(ctx, stale, held[0], HeldRelease{Drop: drop, DroppedRecord: dropped}); err != nil || r.Outcome != HeldStale || r.Deleted != "" {
			t.Fatalf("release (drop %v) a minute stale: %+v, %v; want stale", drop, r, err)
		}
	}
	if rc.Exists(ctx, k.Task(f.Msg.ID)).Val() != 0 {
		t.Fatal("a refused release created the task")
	}
	if st := rc.HGet(ctx, k.Task(first.Msg.ID), "state").Val(); st != "retry" {
		t.Fatalf("the cancelled task is %q after refused releases, want left in retry", st)
	}
	if h, n, err := s.HeldCounts(ctx, testPrefix, "default"); err != nil || h != 1 || n != 0 {
		t.Fatalf("held counts after refused releases: %d held, %d dropped, %v; want 1, 0", h, n, err)
	}
	if ids := outboxIDs(t, s, "default"); slices.Contains(ids, record("dropped", "can", tickAt(1)).ID) || slices.Contains(ids, record("fired", "can", tickAt(1)).ID) {
		t.Fatalf("outbox %v after refused releases: want neither the dropped nor the fired record", ids)
	}

	r, err := s.ReleaseCancel(ctx, newer, held[0], HeldRelease{})
	if err != nil || r.Outcome != HeldReleased || r.Deleted != "retry" {
		t.Fatalf("release from sequence 11: %+v, %v; want released, deleted from retry", r, err)
	}
	if got := rc.LRange(ctx, k.Pending(), 0, -1).Val(); !slices.Contains(got, f.Msg.ID) || rc.Exists(ctx, k.Task(first.Msg.ID)).Val() != 0 {
		t.Fatalf("pending list %v: want the released task, and the cancelled one deleted", got)
	}
	assertWatermark(t, s, "default", "can", tickAt(1), f.Msg.ID)

	// The next tick is held behind the released task; the caught-up
	// replica drops it (the entry paused, say).
	setTaskState(t, rc, f.Msg.ID, "active")
	mustFireWith(t, s, newer, cancelFire(t, 2), StatusHeld)
	held, err = s.HeldTicks(ctx, testPrefix, []string{"default"})
	if err != nil || len(held) != 1 || !held[0].Tick.Equal(tickAt(2)) {
		t.Fatalf("held ticks %+v, %v", held, err)
	}
	if r, err := s.ReleaseCancel(ctx, testFences, held[0], HeldRelease{Drop: true}); err != nil || r.Outcome != HeldFenced {
		t.Fatalf("drop from sequence 10: %+v, %v; want fenced", r, err)
	}
	dropped := record("dropped", "can", tickAt(2))
	if r, err := s.ReleaseCancel(ctx, newer, held[0], HeldRelease{Drop: true, DroppedRecord: dropped}); err != nil || r.Outcome != HeldDropped {
		t.Fatalf("drop from sequence 11: %+v, %v", r, err)
	}
	if rc.Exists(ctx, k.Task(held[0].TaskID)).Val() != 0 {
		t.Fatal("a dropped tick created its task")
	}
	if h, n, err := s.HeldCounts(ctx, testPrefix, "default"); err != nil || h != 0 || n != 1 {
		t.Fatalf("held counts after the drop: %d held, %d dropped, %v; want 0, 1", h, n, err)
	}
	ids := outboxIDs(t, s, "default")
	if !slices.Contains(ids, dropped.ID) || slices.Contains(ids, record("fired", "can", tickAt(2)).ID) {
		t.Fatalf("outbox %v: want the dropped record and no fired record of the dropped tick", ids)
	}
	if _, err := s.ReleaseCancel(ctx, newer, held[0], HeldRelease{MaxFires: 3, MaxFiresSince: 11}); !errors.Is(err, ErrInvalidFire) {
		t.Fatalf("release with a fire limit: %v, want ErrInvalidFire", err)
	}
}
