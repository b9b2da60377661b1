package taskstate

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestIsOwnSchedulerID: both forms cronstream lists its entries under are
// its own, whatever the tenant prefix and replica id; near misses are not,
// and neither is a real asynq scheduler on a host named "cronstream".
func TestIsOwnSchedulerID(t *testing.T) {
	t.Parallel()
	asynqOnCronstreamHost := "cronstream:1234:" + uuid.NewString() // asynq's <host>:<pid>:<uuid>
	for id, want := range map[string]bool{
		SchedulerID("cronstream"):                                                 true,
		SchedulerID("team-a"):                                                     true,
		SchedulerID(""):                                                           true,
		ReplicaSchedulerID("cronstream", "cronstream-1"):                          true,
		ReplicaSchedulerID("team-a", "web-1-4242-a1b2c3"):                         true, // the default replica id
		ReplicaSchedulerID("t_1", "pod.ns/x=1_y"):                                 true,
		ReplicaSchedulerID("1234", "web-1"):                                       true, // a numeric prefix alone is no asynq id
		ReplicaSchedulerID("team-a", "2b7d7b5e-2f6a-4fd1-9b7d-aa0011223344"):      true,
		ReplicaSchedulerID("1234", strings.ReplaceAll(uuid.NewString(), "-", "")): true, // asynq writes a UUID dashed
		asynqOnCronstreamHost:                                                     false,
		"cronstream:99:" + strings.ToUpper(uuid.NewString()):                      false,
		"cronstream.example.com:1234:" + uuid.NewString():                         false,
		"web-1:4242:2b7d7b5e-2f6a-4fd1-9b7d-aa0011223344":                         false,
		"cronstream":                            false,
		"cronstream:":                           false,
		"cronstream::r1":                        false,
		"cronstream:team-a:":                    false,
		"cronstream:team-a:r1:x":                false,
		"cronstream:team-a:r 1":                 false,
		"cronstream:team-a:.r1":                 false,
		"cronstream:team-a:r1.":                 false,
		"cronstream:team-a:r..1":                false,
		"cronstream:bad prefix":                 false,
		"cronstream:bad.prefix:r1":              false,
		"cronstream:" + strings.Repeat("p", 65): false,
		"":                                      false,
	} {
		if got := IsOwnSchedulerID(id); got != want {
			t.Errorf("IsOwnSchedulerID(%q) = %v, want %v", id, got, want)
		}
	}
	for key, want := range map[string]string{
		SchedulerEntriesKey("web-1:42:abc"): "web-1:42:abc",
		"asynq:schedulers:{}":               "",
		"asynq:queues":                      "",
	} {
		if got, ok := SchedulerIDOfKey(key); got != want || ok != (want != "") {
			t.Errorf("SchedulerIDOfKey(%q) = %q, %v", key, got, ok)
		}
	}
}

// enqueues records every task a real asynq scheduler enqueued, from its
// PostEnqueueFunc (which asynq calls before it records the event).
type enqueues struct {
	mu  sync.Mutex
	ids []string
	hit chan struct{} // receives after each enqueue
}

func (e *enqueues) post(info *asynq.TaskInfo, err error) {
	if err != nil {
		return
	}
	e.mu.Lock()
	e.ids = append(e.ids, info.ID)
	e.mu.Unlock()
	select {
	case e.hit <- struct{}{}:
	default:
	}
}

func (e *enqueues) taskIDs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Sorted(slices.Values(e.ids))
}

// TestListSchedulers reads what real asynq schedulers publish, beside
// cronstream's own list and a member whose list expired.
func TestListSchedulers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rc := newTestStore(t)
	// asynq writes its list with a TTL of two heartbeats in whole seconds
	// (EXPIRE refuses a fraction).
	sch := asynq.NewSchedulerFromRedisClient(rc, &asynq.SchedulerOpts{HeartbeatInterval: 500 * time.Millisecond, LogLevel: asynq.FatalLevel})
	if _, err := sch.Register("0 9 * * *", asynq.NewTask("report:daily", []byte(`{"team":"ops"}`)), asynq.Queue("reports"), asynq.MaxRetry(5)); err != nil {
		t.Fatal(err)
	}
	if err := sch.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sch.Shutdown)
	if err := s.WriteSchedulerEntries(ctx, SchedulerID("cronstream"), []SchedulerEntry{{ID: "ours", Spec: "@daily", TaskType: "x"}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := rc.ZAdd(ctx, AllSchedulersKey, redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: SchedulerEntriesKey("gone:1:x")}).Err(); err != nil {
		t.Fatal(err)
	}
	var asynqs []ListedScheduler
	testenv.Eventually(t, 10*time.Second, func() bool {
		all, err := s.ListSchedulers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		asynqs = asynqs[:0]
		own := 0
		for _, l := range all {
			switch {
			case IsOwnSchedulerID(l.ID):
				own++
			case l.Exists:
				asynqs = append(asynqs, l)
			case l.ID == "gone:1:x":
			default: // asynq's, between its ZADD and its list's write
			}
		}
		return own == 1 && len(asynqs) == 1
	}, "asynq's scheduler list not read")
	l := asynqs[0]
	if len(l.Entries) != 1 || len(l.Bad) != 0 {
		t.Fatalf("entries %+v bad %v", l.Entries, l.Bad)
	}
	e := l.Entries[0]
	if e.Spec != "0 9 * * *" || e.TaskType != "report:daily" || string(e.TaskPayload) != `{"team":"ops"}` ||
		!slices.Equal(e.EnqueueOptions, []string{`Queue("reports")`, "MaxRetry(5)"}) || e.Next.IsZero() || !e.Prev.IsZero() {
		t.Fatalf("entry as read: %+v", e)
	}
}

// TestHistoryCaptureAcrossShutdown: a real asynq scheduler shut down right
// after an enqueue deletes its entries' history just after recording that
// enqueue; the capture has every enqueue all the same, the ones recorded
// before it started included. Restore puts the history back.
func TestHistoryCaptureAcrossShutdown(t *testing.T) {
	// Not parallel: it checks that the asynq server leaves no goroutine
	// behind, which other tests' goroutines would cloud.
	ctx := context.Background()
	s, rc := newTestStore(t)
	leakOpt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leakOpt) })
	for round := range 3 {
		rec := &enqueues{hit: make(chan struct{}, 1)}
		sch := asynq.NewSchedulerFromRedisClient(rc, &asynq.SchedulerOpts{LogLevel: asynq.FatalLevel, PostEnqueueFunc: rec.post})
		var ids []string
		for _, typ := range []string{"a", "b", "c"} {
			id, err := sch.Register("@every 1s", asynq.NewTask(typ, nil), asynq.Queue("hist"))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := sch.Start(); err != nil {
			t.Fatal(err)
		}
		// Some history before the capture starts.
		testenv.Eventually(t, 10*time.Second, func() bool { return len(rec.taskIDs()) >= 6 }, "scheduler did not enqueue")
		c, err := s.CaptureHistory(ctx, ids)
		if err != nil {
			t.Fatal(err)
		}
		// While it runs asynq's keys stay empty: each event is popped.
		testenv.Eventually(t, 10*time.Second, func() bool { return len(rec.taskIDs()) >= 12 }, "scheduler stopped enqueueing")
		// Shut down right after an enqueue, before asynq records it: its
		// record and then the DEL of the history follow within
		// milliseconds.
		for len(rec.hit) > 0 {
			<-rec.hit
		}
		<-rec.hit
		sch.Shutdown()
		if n, err := rc.Exists(ctx, SchedulerHistoryKey(ids[0]), SchedulerHistoryKey(ids[1]), SchedulerHistoryKey(ids[2])).Result(); err != nil || n != 0 {
			t.Fatalf("round %d: %d history keys left after shutdown (%v)", round, n, err)
		}
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Err(); err != nil {
			t.Fatal(err)
		}
		var captured []string
		for _, evs := range c.Events() {
			for _, ev := range evs {
				captured = append(captured, ev.TaskID)
			}
		}
		slices.Sort(captured)
		if want := rec.taskIDs(); !slices.Equal(captured, want) {
			t.Fatalf("round %d: captured %d events, asynq enqueued %d tasks:\ncaptured %v\nenqueued %v", round, len(captured), len(want), captured, want)
		}
		if err := s.Restore(ctx, c, ids); err != nil {
			t.Fatal(err)
		}
		insp := asynq.NewInspectorFromRedisClient(rc)
		restored := 0
		for _, id := range ids {
			evs, err := insp.ListSchedulerEnqueueEvents(id, asynq.PageSize(1000))
			if err != nil {
				t.Fatal(err)
			}
			restored += len(evs)
		}
		if restored != len(captured) {
			t.Fatalf("round %d: %d events restored, %d captured", round, restored, len(captured))
		}
		if keys := slices.Collect(maps.Keys(c.Events())); len(keys) != 3 {
			t.Fatalf("events of %v", keys)
		}
	}
}
