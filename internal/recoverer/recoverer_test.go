package recoverer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/recoverer"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// hookStore is a real taskstate.Store with a hook that runs between the
// recoverer's scan and its move, to race it deterministically.
type hookStore struct {
	*taskstate.Store
	mu            sync.Mutex
	beforeRecover func(queue string, decisions []taskstate.Decision)
}

func (h *hookStore) RecoverBatch(ctx context.Context, prefix, queue string, cutoff time.Time, ds []taskstate.Decision) ([]taskstate.Outcome, error) {
	h.mu.Lock()
	hook := h.beforeRecover
	h.beforeRecover = nil // once
	h.mu.Unlock()
	if hook != nil {
		hook(queue, ds)
	}
	return h.Store.RecoverBatch(ctx, prefix, queue, cutoff, ds)
}

// TestScanMoveRaces: between the recoverer's scan and its move, a worker's
// heartbeat extends one task's lease (asynq's ExtendLease), and another task
// is retried by asynq, run again and lost again (its stored message
// changes). Both are left alone; the rest of the batch moves; the changed
// task is recovered by the next pass from its new message.
func TestScanMoveRaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	const q = "races"
	k := taskstate.Keys(q)
	now := time.Now()
	msgs := seedActive(t, rc, q, []string{"extended", "changed", "plain1", "plain2"}, now.Add(-time.Minute), nil)

	var changedMsg []byte
	extendedTo := now.Add(30 * time.Second).Unix()
	store := &hookStore{Store: taskstate.New(rc)}
	store.beforeRecover = func(_ string, ds []taskstate.Decision) {
		if len(ds) != 4 {
			t.Errorf("first batch has %d decisions, want 4", len(ds))
		}
		if err := rc.ZAddXX(ctx, k.Lease(), redis.Z{Score: float64(extendedTo), Member: "extended"}).Err(); err != nil {
			t.Error(err)
		}
		m, _ := taskstate.DecodeTaskMessage(msgs["changed"])
		m.Retried, m.ErrorMsg, m.LastFailedAt = 1, "boom", now.Unix()
		changedMsg, _ = taskstate.EncodeTaskMessage(m)
		if err := rc.HSet(ctx, k.Task("changed"), "msg", changedMsg).Err(); err != nil {
			t.Error(err)
		}
	}
	reg := prometheus.NewRegistry()
	metrics := recoverer.NewMetrics(reg)
	rec := newRecoverer(t, recoverer.WithStore(recoverer.Config{Queues: []string{q}, Metrics: metrics}, store), nil)

	res := rec.Pass(ctx)
	if res.Err != nil || res.Moved != 2 {
		t.Fatalf("first pass: %+v", res)
	}
	if s := rec.Stats()[q]; s.Retried != 2 || s.Skipped != 2 {
		t.Fatalf("stats %+v", s)
	}
	if got := counterValue(t, metrics.Recovered.WithLabelValues(q, "skipped")); got != 2 {
		t.Fatalf("skipped metric %v", got)
	}
	for _, id := range []string{"extended", "changed"} {
		if st, _ := rc.HGet(ctx, k.Task(id), "state").Result(); st != taskstate.StateActive {
			t.Errorf("%s: state %s", id, st)
		}
		if _, err := rc.LPos(ctx, k.Active(), id, redis.LPosArgs{}).Result(); err != nil {
			t.Errorf("%s: left the active list: %v", id, err)
		}
	}
	if sc, _ := rc.ZScore(ctx, k.Lease(), "extended").Result(); int64(sc) != extendedTo {
		t.Errorf("extended lease is now %v, want %d", sc, extendedTo)
	}
	if got, _ := rc.HGet(ctx, k.Task("extended"), "msg").Result(); got != string(msgs["extended"]) {
		t.Error("extended task's message rewritten")
	}
	if got, _ := rc.HGet(ctx, k.Task("changed"), "msg").Result(); got != string(changedMsg) {
		t.Error("changed task's message overwritten with a stale decision")
	}
	var ids []string
	for _, ev := range outboxEvents(t, rc, q) {
		ids = append(ids, recovered(t, ev).TaskID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"plain1", "plain2"}) {
		t.Fatalf("outbox records for %v", ids)
	}

	// Next pass: the changed task is recovered from its new message; the
	// extended lease is still in the future.
	if res := rec.Pass(ctx); res.Err != nil || res.Moved != 1 {
		t.Fatalf("second pass: %+v", res)
	}
	m := storedMsg(t, rc, q, "changed")
	if m.Retried != 2 || m.ErrorMsg != taskstate.ErrLeaseExpiredText {
		t.Fatalf("changed task after recovery: retried %d error %q", m.Retried, m.ErrorMsg)
	}
	if st, _ := rc.HGet(ctx, k.Task("extended"), "state").Result(); st != taskstate.StateActive {
		t.Fatalf("extended task: state %s", st)
	}
	if n := outboxEventCount(t, rc, q); n != 3 {
		t.Fatalf("outbox has %d events, want 3", n)
	}
}

// TestOrphanedActiveTask: an active task whose lease entry is gone (asynq
// issues 1144, 1051) gets a lease at now + 30 s; once that lease passes the
// cutoff with no heartbeat it is recovered like any other. A stray id (no
// hash) and an id whose hash is not active are removed from the active list.
func TestOrphanedActiveTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	const q = "orphans"
	k := taskstate.Keys(q)
	client := testenv.AsynqClient(t, rc)
	insp := asynq.NewInspectorFromRedisClient(rc)
	for _, id := range []string{"orphan", "healthy"} {
		if _, err := client.Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID(id)); err != nil {
			t.Fatal(err)
		}
	}
	// asynq's Dequeue (pending → active, state active, no pending_since, a
	// lease), then the orphan's lease entry is lost.
	start := time.Now()
	for range 2 {
		id, err := rc.RPopLPush(ctx, k.Pending(), k.Active()).Result()
		if err != nil {
			t.Fatal(err)
		}
		rc.HSet(ctx, k.Task(id), "state", taskstate.StateActive)
		rc.HDel(ctx, k.Task(id), "pending_since")
		rc.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(start.Add(time.Hour).Unix()), Member: id})
	}
	rc.ZRem(ctx, k.Lease(), "orphan")
	// A stray id without a hash, and one whose hash says pending.
	rc.LPush(ctx, k.Active(), "ghost")
	if _, err := client.Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID("pendingtask")); err != nil {
		t.Fatal(err)
	}
	rc.LPush(ctx, k.Active(), "pendingtask")

	clock := &fakeClock{now: start}
	rec := newRecoverer(t, recoverer.Config{Redis: rc, Queues: []string{q}, Now: clock.Now}, nil)
	if res := rec.Pass(ctx); res.Err != nil || res.Moved != 0 {
		t.Fatalf("first pass: %+v", res)
	}
	if s := rec.Stats()[q]; s.OrphansLeased != 1 || s.OrphansRemoved != 2 || s.Retried != 0 {
		t.Fatalf("stats after first pass %+v", s)
	}
	sc, err := rc.ZScore(ctx, k.Lease(), "orphan").Result()
	if err != nil || int64(sc) < start.Add(30*time.Second).Unix() {
		t.Fatalf("orphan's lease %v (%v), want at or after now + 30 s", sc, err)
	}
	active, _ := rc.LRange(ctx, k.Active(), 0, -1).Result()
	slices.Sort(active)
	if !slices.Equal(active, []string{"healthy", "orphan"}) {
		t.Fatalf("active list %v", active)
	}
	if n, _ := rc.LLen(ctx, k.Pending()).Result(); n != 1 {
		t.Fatalf("the pending task left the pending list: %d", n)
	}

	// While the new lease runs, nothing happens; once it is past the grace,
	// the orphan is recovered, the healthy task is not.
	clock.Set(time.Unix(int64(sc), 0))
	if res := rec.Pass(ctx); res.Err != nil || res.Moved != 0 {
		t.Fatalf("pass at the orphan's lease expiry: %+v", res)
	}
	clock.Set(time.Unix(int64(sc), 0).Add(2 * time.Second))
	if res := rec.Pass(ctx); res.Err != nil || res.Moved != 1 {
		t.Fatalf("pass after the grace: %+v", res)
	}
	ti, err := insp.GetTaskInfo(q, "orphan")
	if err != nil {
		t.Fatal(err)
	}
	if ti.State != asynq.TaskStateRetry || ti.Retried != 1 || ti.LastErr != "asynq: task lease expired" {
		t.Fatalf("orphan after recovery: %s retried %d err %q", ti.State, ti.Retried, ti.LastErr)
	}
	if ti, err := insp.GetTaskInfo(q, "healthy"); err != nil || ti.State != asynq.TaskStateActive {
		t.Fatalf("healthy task: %+v %v", ti, err)
	}
	if s := rec.Stats()[q]; s.OrphansLeased != 1 || s.OrphansRemoved != 2 || s.Retried != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestOrphanWithLiveWorkerKeepsTask: when a live asynq worker still holds a
// task whose lease entry was lost, the lease we give it is extended by the
// worker's next heartbeat, so the task is never recovered and completes.
func TestOrphanWithLiveWorkerKeepsTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	const q = "liveorphan"
	k := taskstate.Keys(q)
	client := testenv.AsynqClient(t, rc)
	if _, err := client.Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID("held")); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	finished := make(chan struct{})
	testenv.StartAsynqServer(t, rc, asynq.Config{Queues: map[string]int{q: 1}}, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		<-release
		close(finished)
		return nil
	}))
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	testenv.Eventually(t, 10*time.Second, func() bool {
		n, _ := rc.ZCard(ctx, k.Lease()).Result()
		return n == 1
	}, "the worker takes the task")
	rc.ZRem(ctx, k.Lease(), "held")

	rec := newRecoverer(t, recoverer.Config{Redis: rc, Queues: []string{q}}, nil)
	if res := rec.Pass(ctx); res.Err != nil {
		t.Fatal(res.Err)
	}
	ours, err := rc.ZScore(ctx, k.Lease(), "held").Result()
	if err != nil {
		t.Fatalf("no lease after the pass: %v", err)
	}
	testenv.Eventually(t, 15*time.Second, func() bool {
		sc, err := rc.ZScore(ctx, k.Lease(), "held").Result()
		return err == nil && sc > ours
	}, "the worker's heartbeat extends the lease we gave")
	if res := rec.Pass(ctx); res.Err != nil || res.Moved != 0 {
		t.Fatalf("second pass: %+v", res)
	}
	close(release)
	<-finished
	testenv.Eventually(t, 10*time.Second, func() bool {
		p, _ := rc.Get(ctx, k.ProcessedTotal()).Int()
		f, _ := rc.Get(ctx, k.FailedTotal()).Int()
		n, _ := rc.Exists(ctx, k.Task("held")).Result()
		return p == 1 && f == 0 && n == 0
	}, "the worker completes the task")
}

// TestStaleAggregationSetReclaimed: a real asynq aggregator (child process)
// takes a group's tasks into an aggregation set and dies mid-aggregation.
// Once the set's deadline passed, the recoverer returns the tasks to the
// group, lists the group again (asynq forgets it), publishes one
// cronstream.aggregation.reclaimed event, and a real asynq aggregator then
// aggregates the group.
func TestStaleAggregationSetReclaimed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testenv.StartRedis(t, testenv.WithPrivateServer())
	rc := r.Client(t)
	store := taskstate.New(rc)
	js := startActivity(t)
	const q, group = "aggq", "grp:with:colons"
	k := taskstate.Keys(q)
	client := testenv.AsynqClient(t, rc)
	for i := range 3 {
		if _, err := client.Enqueue(asynq.NewTask("part", []byte{byte(i)}), asynq.Queue(q), asynq.Group(group)); err != nil {
			t.Fatal(err)
		}
	}
	kill := testenv.StartAsynqChild(t, testenv.AsynqAggregator, r.Addr, q)
	testenv.Eventually(t, 20*time.Second, func() bool {
		n, _ := rc.ZCard(ctx, k.AggregationSets()).Result()
		return n == 1
	}, "the child's aggregator takes the group into an aggregation set")
	kill()

	sets, _ := rc.ZRange(ctx, k.AggregationSets(), 0, -1).Result()
	setKey := sets[0]
	setID := setKey[strings.LastIndexByte(setKey, ':')+1:]
	if n, _ := rc.ZCard(ctx, setKey).Result(); n != 3 {
		t.Fatalf("aggregation set has %d tasks", n)
	}
	if ok, _ := rc.SIsMember(ctx, k.Groups(), group).Result(); ok {
		t.Fatal("asynq kept the emptied group listed; the test would not show the re-listing")
	}
	// asynq's deadline is creation + 2 min; let it pass.
	if err := rc.ZAddXX(ctx, k.AggregationSets(), redis.Z{Score: float64(time.Now().Add(-time.Second).Unix()), Member: setKey}).Err(); err != nil {
		t.Fatal(err)
	}

	rl := startRelay(t, store, js, "relay1")
	rec := newRecoverer(t, recoverer.Config{Redis: rc, OnRecord: rl.Notify}, nil) // every queue in asynq:queues
	if res := rec.Pass(ctx); res.Err != nil {
		t.Fatal(res.Err)
	}
	if s := rec.Stats()[q]; s.Reclaimed != 1 {
		t.Fatalf("stats %+v", s)
	}
	testenv.CheckReclaimed(t, rc, testenv.ReclaimedSet{GroupKey: k.Group(group), GroupsKey: k.Groups(), Group: group,
		SetKey: setKey, SetsKey: k.AggregationSets(), Tasks: 3})
	// A second pass finds nothing more.
	if res := rec.Pass(ctx); res.Err != nil || rec.Stats()[q].Reclaimed != 1 {
		t.Fatalf("second pass: %+v %+v", res, rec.Stats()[q])
	}

	testenv.Eventually(t, 10*time.Second, func() bool { return activityMsgs(t, js) == 1 }, "the relay publishes the reclaim")
	evs := activityEvents(t, js)
	var d events.AggregationReclaimed
	if err := evs[0].Event.DecodeData(&d); err != nil {
		t.Fatal(err)
	}
	if evs[0].Event.Type != events.TypeAggregationReclaimed || evs[0].Subject != names.RecoverySubject(q) ||
		d.Queue != q || d.Group != group || d.Set != setID || d.Tasks != 3 {
		t.Fatalf("event %+v on %s, data %+v", evs[0].Event, evs[0].Subject, d)
	}

	// A real asynq aggregator now finds the group and aggregates it.
	if n := testenv.AggregateWithAsynq(t, rc, q, 20*time.Second); n != 3 {
		t.Fatalf("aggregated %d tasks, want 3", n)
	}
}

// TestBadTasksAndBrokenQueue: undecodable, missing and mismatched messages
// in the lease set are reported once each and skipped, while the other
// tasks of the same (small) batches are recovered in the same pass; a queue
// whose listing fails is counted and logged with its name and does not stop
// the queues after it. Nothing is fatal, pass after pass.
func TestBadTasksAndBrokenQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	now := time.Now()
	const good, broken, last = "good", "broken", "zlast"
	k := taskstate.Keys(good)
	// Tied lease scores come back in member order: the bad ones first, so
	// they fill most of the first batch.
	goodIDs := []string{"t1", "t2", "t3", "t4", "t5", "t6", "t7"}
	seedActive(t, rc, good, append([]string{"a-garbage", "a-nomsg", "a-otherq", "a-utf8"}, goodIDs...), now.Add(-time.Minute), nil)
	rc.HSet(ctx, k.Task("a-garbage"), "msg", []byte{0x0a, 0x05, 'x'})
	rc.HDel(ctx, k.Task("a-nomsg"), "msg")
	wrong, _ := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "x", ID: "a-otherq", Queue: "elsewhere"})
	rc.HSet(ctx, k.Task("a-otherq"), "msg", wrong)
	rc.HSet(ctx, k.Task("a-utf8"), "msg", []byte{0x0a, 0x02, 0xff, 0xfe})
	// A queue whose lease key has the wrong type: its listing fails.
	rc.SAdd(ctx, taskstate.AllQueuesKey, broken)
	rc.Set(ctx, taskstate.Keys(broken).Lease(), "not a zset", 0)
	seedActive(t, rc, last, []string{"z1", "z2"}, now.Add(-time.Minute), nil)

	reg := prometheus.NewRegistry()
	metrics := recoverer.NewMetrics(reg)
	sink := &logSink{t: t}
	rec := newRecoverer(t, recoverer.Config{Redis: rc, Batch: 3, Metrics: metrics}, sink)
	for pass := 1; pass <= 2; pass++ {
		res := rec.Pass(ctx)
		if res.Err == nil || !strings.Contains(res.Err.Error(), `queue "broken"`) || strings.Contains(res.Err.Error(), good) {
			t.Fatalf("pass %d: error %v, want one naming only the broken queue", pass, res.Err)
		}
		st := rec.Stats()
		if pass == 1 && res.Moved != len(goodIDs)+2 {
			t.Fatalf("pass 1 moved %d, want %d", res.Moved, len(goodIDs)+2)
		}
		if s := st[good]; s.Retried != uint64(len(goodIDs)) || s.Bad != 4 || s.Errors != 0 {
			t.Fatalf("pass %d: queue %s %+v", pass, good, s)
		}
		if s := st[last]; s.Retried != 2 || s.Errors != 0 {
			t.Fatalf("pass %d: queue %s %+v", pass, last, s)
		}
		if s := st[broken]; s.Errors != uint64(pass) {
			t.Fatalf("pass %d: queue %s %+v", pass, broken, s)
		}
		if got := counterValue(t, metrics.Errors.WithLabelValues(broken)); got != float64(pass) {
			t.Fatalf("pass %d: error metric %v", pass, got)
		}
		if sink.count("queue failed", "queue="+broken) != pass {
			t.Fatalf("pass %d: broken queue logged %d times:\n%s", pass, sink.count("queue="+broken), strings.Join(sink.msgs, "\n"))
		}
	}
	if got := counterValue(t, metrics.Bad.WithLabelValues(good)); got != 4 {
		t.Fatalf("bad metric %v", got)
	}
	for _, id := range []string{"a-garbage", "a-nomsg", "a-otherq", "a-utf8"} {
		if n := sink.count("cannot be recovered", "task="+id); n != 1 {
			t.Errorf("bad task %s reported %d times", id, n)
		}
		// Left as it is, for a human.
		if _, err := rc.ZScore(ctx, k.Lease(), id).Result(); err != nil {
			t.Errorf("bad task %s left the lease set", id)
		}
		if _, err := rc.LPos(ctx, k.Active(), id, redis.LPosArgs{}).Result(); err != nil {
			t.Errorf("bad task %s left the active list", id)
		}
	}
	for _, id := range goodIDs {
		if st, _ := rc.HGet(ctx, k.Task(id), "state").Result(); st != taskstate.StateRetry {
			t.Errorf("task %s: state %s", id, st)
		}
	}
	if n := outboxEventCount(t, rc, good); n != int64(len(goodIDs)) {
		t.Fatalf("outbox of %s has %d events", good, n)
	}
}

// TestPassListsInRounds: a pass lists ten batches of ids at a time. Bad
// tasks stay in the lease set at its lowest ranks, so each listing after
// the first starts past them (a first listing of nothing but bad tasks
// must not end the pass, nor repeat forever); every good task moves in the
// one pass, each bad one is reported once, and the next pass finds nothing
// new.
func TestPassListsInRounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	now := time.Now()
	const q = "rounds"
	k := taskstate.Keys(q)
	var good []string
	for i := range 75 {
		good = append(good, fmt.Sprintf("t%03d", i))
	}
	// Tied lease scores come back in member order: the bad ones first,
	// more of them than one listing holds (ten batches of 2).
	var bad []string
	for i := range 25 {
		bad = append(bad, fmt.Sprintf("a-nomsg%02d", i))
	}
	seedActive(t, rc, q, append(slices.Clone(bad), good...), now.Add(-time.Minute), nil)
	for _, id := range bad {
		rc.HDel(ctx, k.Task(id), "msg")
	}
	sink := &logSink{t: t}
	rec := newRecoverer(t, recoverer.Config{Redis: rc, Queues: []string{q}, Batch: 2}, sink)
	if res := rec.Pass(ctx); res.Err != nil || res.Moved != len(good) {
		t.Fatalf("pass 1 moved %d (%v), want %d", res.Moved, res.Err, len(good))
	}
	if res := rec.Pass(ctx); res.Err != nil || res.Moved != 0 {
		t.Fatalf("pass 2 moved %d (%v)", res.Moved, res.Err)
	}
	if st := rec.Stats()[q]; st.Retried != uint64(len(good)) || st.Bad != uint64(len(bad)) {
		t.Fatalf("stats %+v", st)
	}
	for _, id := range bad {
		if n := sink.count("cannot be recovered", "task="+id); n != 1 {
			t.Errorf("bad task %s reported %d times", id, n)
		}
	}
	if n := outboxEventCount(t, rc, q); n != int64(len(good)) {
		t.Fatalf("outbox has %d events, want %d", n, len(good))
	}
}

// TestNewQueuePickedUp: with no queues configured, a queue that appears in
// asynq:queues while the recoverer runs is recovered without a restart.
func TestNewQueuePickedUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	seedActive(t, rc, "first", []string{"f1"}, time.Now().Add(-time.Minute), nil)
	rec := newRecoverer(t, recoverer.Config{Redis: rc, Interval: 50 * time.Millisecond}, nil)
	passes := rec.Passes()
	_ = rec.Start(context.Background())
	t.Cleanup(func() { _ = rec.Stop(context.Background()) })
	select {
	case res := <-passes:
		if res.Err != nil || res.Moved != 1 {
			t.Fatalf("first pass %+v", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no first pass")
	}
	seedActive(t, rc, "late", []string{"l1", "l2"}, time.Now().Add(-time.Minute), nil)
	testenv.Eventually(t, 10*time.Second, func() bool { return rec.Stats()["late"].Retried == 2 },
		"the new queue's tasks are recovered")
	if n, _ := rc.LLen(ctx, taskstate.Keys("late").Active()).Result(); n != 0 {
		t.Fatalf("late queue active list %d", n)
	}
}

// TestDecisions: asynq's rules and the Go API's options. Defaults: archive
// when retried ≥ max retry, else retry after asynq's delay as a failure.
// Options: a custom delay, and an IsFailure that says no (retried and the
// counters stay, as in asynq).
func TestDecisions(t *testing.T) {
	t.Parallel()
	for n, lo := range map[int]int{0: 15, 1: 16, 2: 31, 5: 640} {
		for range 200 {
			d := recoverer.DefaultRetryDelay(n, recoverer.ErrLeaseExpired, nil)
			if hi := lo + 29*(n+1); d < time.Duration(lo)*time.Second || d > time.Duration(hi)*time.Second || d%time.Second != 0 {
				t.Fatalf("DefaultRetryDelay(%d) = %v, want whole seconds in [%ds, %ds]", n, d, lo, hi)
			}
		}
	}
	if !recoverer.DefaultIsFailure(recoverer.ErrLeaseExpired) || recoverer.ErrLeaseExpired.Error() != "asynq: task lease expired" {
		t.Fatal("defaults")
	}

	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	// The recoverer's clock decides retry times and last_failed_at; the
	// Store's (the wall clock) the archive score and the counters' day.
	now := time.Now().Truncate(time.Second)
	nearNow := func(s int64) bool { return s >= now.Unix() && s <= time.Now().Unix()+1 }
	for _, tc := range []struct {
		name      string
		delay     recoverer.RetryDelayFunc
		isFailure recoverer.IsFailureFunc
		retry     int32
		retried   int32
		// want
		state       string
		wantRetried int32
		retryAt     func(int64) bool
		counted     int
	}{
		{name: "first failure", retry: 3, retried: 0, state: taskstate.StateRetry, wantRetried: 1, counted: 1,
			retryAt: func(s int64) bool { return s >= now.Unix()+15 && s <= now.Unix()+44 }},
		{name: "last retry left", retry: 3, retried: 2, state: taskstate.StateRetry, wantRetried: 3, counted: 1,
			retryAt: func(s int64) bool { return s >= now.Unix()+31 && s <= now.Unix()+31+29*3 }},
		{name: "retries used up", retry: 3, retried: 3, state: taskstate.StateArchived, wantRetried: 3, counted: 1,
			retryAt: nearNow}, // the archive's score is the time of archiving
		{name: "over the maximum", retry: 1, retried: 5, state: taskstate.StateArchived, wantRetried: 5, counted: 1,
			retryAt: nearNow},
		{name: "custom delay and not a failure", retry: 3, retried: 1, state: taskstate.StateRetry, wantRetried: 1, counted: 0,
			delay: func(n int, err error, m *recoverer.Task) time.Duration {
				if n != 1 || !errors.Is(err, recoverer.ErrLeaseExpired) || m.Type != "work" {
					return time.Hour
				}
				return 7*time.Minute + 500*time.Millisecond
			},
			isFailure: func(error) bool { return false },
			retryAt:   func(s int64) bool { return s == now.Add(7*time.Minute).Unix() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := strings.ReplaceAll(tc.name, " ", "-")
			k := taskstate.Keys(q)
			seedActive(t, rc, q, []string{"x"}, now.Add(-time.Minute), func(m *taskstate.TaskMessage) {
				m.Retry, m.Retried = tc.retry, tc.retried
			})
			rec := newRecoverer(t, recoverer.Config{Redis: rc, Queues: []string{q},
				RetryDelay: tc.delay, IsFailure: tc.isFailure, Now: func() time.Time { return now }}, nil)
			if res := rec.Pass(ctx); res.Err != nil || res.Moved != 1 {
				t.Fatalf("pass %+v", res)
			}
			st, _ := rc.HGet(ctx, k.Task("x"), "state").Result()
			m := storedMsg(t, rc, q, "x")
			if st != tc.state || m.Retried != tc.wantRetried || m.ErrorMsg != taskstate.ErrLeaseExpiredText || m.LastFailedAt != now.Unix() {
				t.Fatalf("state %s, msg %+v", st, m)
			}
			set := k.Retry()
			if tc.state == taskstate.StateArchived {
				set = k.Archived()
			}
			sc, err := rc.ZScore(ctx, set, "x").Result()
			if err != nil || !tc.retryAt(int64(sc)) {
				t.Fatalf("score in %s: %v %v", set, sc, err)
			}
			p, _ := rc.Get(ctx, k.ProcessedTotal()).Int()
			f, _ := rc.Get(ctx, k.FailedTotal()).Int()
			if p != tc.counted || f != tc.counted {
				t.Fatalf("counters processed %d failed %d, want %d", p, f, tc.counted)
			}
			evs := outboxEvents(t, rc, q)
			if len(evs) != 1 {
				t.Fatalf("%d records", len(evs))
			}
			d := recovered(t, evs[0])
			wantType := events.TypeTaskRetried
			if tc.state == taskstate.StateArchived {
				wantType = events.TypeTaskArchived
			}
			if evs[0].Type != wantType || d.Retried != int(tc.wantRetried) || d.MaxRetry != int(tc.retry) || !evs[0].Time.Equal(now) {
				t.Fatalf("event %+v data %+v", evs[0], d)
			}
			if (d.RetryAt != nil) != (tc.state == taskstate.StateRetry) || (d.RetryAt != nil && d.RetryAt.Unix() != int64(sc)) {
				t.Fatalf("retry_at %v, score %v", d.RetryAt, sc)
			}
			// The event id names the lost attempt: deterministic.
			if want := fmt.Sprintf("recover:%s:x:%d:%d", events.EncodeQueueToken(q), tc.retried, now.Add(-time.Minute).Unix()); evs[0].ID != want {
				t.Fatalf("event id %s, want %s", evs[0].ID, want)
			}
		})
	}
}

// TestConfiguredQueuesNotModified: New keeps its own sorted copy of
// Config.Queues; the caller's slice is neither sorted nor shared.
func TestConfiguredQueuesNotModified(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	queues := []string{"b", "a"}
	rec := newRecoverer(t, recoverer.Config{Redis: rc, Queues: queues}, nil)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res := rec.Pass(ctx); res.Err != nil {
				t.Error(res.Err)
			}
		}()
	}
	wg.Wait()
	if !slices.Equal(queues, []string{"b", "a"}) {
		t.Fatalf("caller's queues changed to %v", queues)
	}
	if _, ok := rec.Stats()["a"]; !ok {
		t.Fatal("queue a not visited")
	}
}

// counterValue reads a Prometheus counter (testutil would need a module
// this repository does not require).
func counterValue(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestEventIDsForAnyTaskID: asynq task ids and queue names may be any
// string. Ids that are long or hold spaces or control characters get a
// hashed event id (events readers take at most 256 bytes, and the id is the
// Nats-Msg-Id header); every event still reaches the stream once.
func TestEventIDsForAnyTaskID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	store := taskstate.New(rc)
	js := startActivity(t)
	const q = "queue with spaces"
	long := strings.Repeat("x", 300)
	ids := []string{"plain-id", "with space", "new\nline", long}
	lease := time.Now().Add(-time.Minute)
	seedActive(t, rc, q, ids, lease, nil)
	rl := startRelay(t, store, js, "relay1")
	rec := newRecoverer(t, recoverer.Config{Redis: rc, Queues: []string{q}, OnRecord: rl.Notify}, nil)
	if res := rec.Pass(ctx); res.Err != nil || res.Moved != len(ids) {
		t.Fatalf("pass %+v", res)
	}
	// Read the ids from the stream: the relay may already have drained the
	// outbox.
	testenv.Eventually(t, 10*time.Second, func() bool { return activityEventCount(t, js) == uint64(len(ids)) },
		"every event published")
	published := activityEvents(t, js)
	byTask := map[string]string{}
	for _, se := range published {
		byTask[recovered(t, se.Event).TaskID] = se.Event.ID
	}
	hashed := func(id string) bool {
		h, ok := strings.CutPrefix(id, "recover:")
		return ok && len(h) == 64 && strings.Trim(h, "0123456789abcdef") == ""
	}
	if want := fmt.Sprintf("recover:queue~20with~20spaces:plain-id:0:%d", lease.Unix()); byTask["plain-id"] != want {
		t.Errorf("plain id: event id %q, want %q", byTask["plain-id"], want)
	}
	for _, id := range ids[1:] {
		if !hashed(byTask[id]) {
			t.Errorf("task %q: event id %q, want a hashed one", id, byTask[id])
		}
	}
	seen := map[string]bool{}
	for _, se := range published {
		if se.MsgID != se.Event.ID || seen[se.MsgID] {
			t.Fatalf("message id %q for event %q", se.MsgID, se.Event.ID)
		}
		seen[se.MsgID] = true
	}
}

// The error recovered tasks carry is written by taskstate's scripts; the
// exported error must say the same.
func TestErrLeaseExpiredText(t *testing.T) {
	t.Parallel()
	if recoverer.ErrLeaseExpired.Error() != taskstate.ErrLeaseExpiredText {
		t.Fatalf("ErrLeaseExpired %q, taskstate writes %q", recoverer.ErrLeaseExpired, taskstate.ErrLeaseExpiredText)
	}
}
