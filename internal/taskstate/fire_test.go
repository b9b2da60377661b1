package taskstate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/testenv"
)

// testPrefix is the tenant prefix of the fire tests.
const testPrefix = "fire"

// baseTick is a whole-second tick the tests count from.
var baseTick = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// tickAt is the n-th minute tick after baseTick.
func tickAt(n int) time.Time { return baseTick.Add(time.Duration(n) * time.Minute) }

func taskIDFor(entry string, tick time.Time) string {
	return testPrefix + ":" + entry + ":" + tick.UTC().Format(time.RFC3339)
}

func record(kind, entry string, tick time.Time) Record {
	id := kind + "/" + entry + "/" + tick.UTC().Format(time.RFC3339)
	return Record{ID: id, Data: []byte(`{"id":"` + id + `"}`)}
}

// testFences are the fences the tests' fires present unless a test says
// otherwise.
var testFences = Fences{ConfigSeq: 10}

// tickFire builds a FireTick of entry at tick expecting prev (zero = none).
func tickFire(entry, queue string, tick, prev time.Time) Fire {
	return NewTickFire(testPrefix, queue, entry, tick, prev, !prev.IsZero(), &TaskMessage{
		Type: "report:daily", Payload: []byte(`{"team":"ops"}`), ID: taskIDFor(entry, tick),
		Retry: 25, Timeout: 1800, Headers: map[string]string{"source": "cron"},
	}, record("fired", entry, tick))
}

func newTestStore(t testing.TB) (*Store, *redis.Client) {
	t.Helper()
	rc := testenv.StartRedis(t).Client(t)
	return New(rc), rc
}

// mustFire fires f presenting testFences and fails the test on an error or
// an unexpected status.
func mustFire(t testing.TB, s *Store, f Fire, want FireStatus) FireResult {
	t.Helper()
	return mustFireWith(t, s, testFences, f, want)
}

// mustFireWith is mustFire presenting fences.
func mustFireWith(t testing.TB, s *Store, fences Fences, f Fire, want FireStatus) FireResult {
	t.Helper()
	res, err := s.FireOnce(context.Background(), fences, f)
	if err != nil {
		t.Fatalf("fire %s of %q at %s: %v", f.Kind, f.Entry, f.Tick.Format(time.RFC3339), err)
	}
	if res.Status != want {
		t.Fatalf("fire %s of %q at %s: status %s, want %s (result %+v)", f.Kind, f.Entry, f.Tick.Format(time.RFC3339), res.Status, want, res)
	}
	return res
}

// outboxIDs returns the event ids in queue's outbox, in order: a
// multi-record's (checked to hold several, under outbox.MultiRecordID)
// one by one.
func outboxIDs(t testing.TB, s *Store, queue string) []string {
	t.Helper()
	recs, err := s.ReadOutbox(context.Background(), testPrefix, queue, "", 100000)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(recs))
	for _, r := range recs {
		if outbox.FormOf(r.Data) != outbox.RecordMulti {
			ids = append(ids, r.EventID)
			continue
		}
		framed := outbox.EventIDs(r.EventID, r.Data)
		if len(framed) < 2 || r.EventID != outbox.MultiRecordID(framed[0]) {
			t.Fatalf("multi-record %s holds %q", r.EventID, framed)
		}
		ids = append(ids, framed...)
	}
	return ids
}

func assertWatermark(t testing.TB, s *Store, queue, entry string, want time.Time, wantTask string) {
	t.Helper()
	tick, task, ok, err := s.Watermark(context.Background(), testPrefix, queue, entry)
	if err != nil {
		t.Fatal(err)
	}
	if want.IsZero() {
		if ok {
			t.Fatalf("watermark of %q in %q = %s, want none", entry, queue, tick)
		}
		return
	}
	if !ok || !tick.Equal(want) || task != wantTask {
		t.Fatalf("watermark of %q in %q = (%s, %q, %v), want (%s, %q)", entry, queue, tick, task, ok, want, wantTask)
	}
}

// TestFireWritesWhatAsynqWrites fires each routing variant and compares the
// resulting task hash and containers with what the real asynq v0.26.0 client
// writes for the same task and options.
func TestFireWritesWhatAsynqWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rc := newTestStore(t)
	client := testenv.AsynqClient(t, rc)

	payload := []byte{0, 1, 2, 0xff}
	headers := map[string]string{"source": "cron", "trace": "abc"}
	later := time.Now().Add(time.Hour)
	cases := []struct {
		name      string
		unique    time.Duration
		group     string
		processAt time.Time
		opts      []asynq.Option
		state     string
		container func(k QueueKeys) string
	}{
		{name: "enqueue", state: StatePending, container: QueueKeys.Pending},
		{name: "enqueue-unique", unique: time.Hour, opts: []asynq.Option{asynq.Unique(time.Hour)}, state: StatePending, container: QueueKeys.Pending},
		{name: "schedule", processAt: later, opts: []asynq.Option{asynq.ProcessAt(later)}, state: StateScheduled, container: QueueKeys.Scheduled},
		{name: "schedule-unique", unique: time.Hour, processAt: later, opts: []asynq.Option{asynq.Unique(time.Hour), asynq.ProcessAt(later)}, state: StateScheduled, container: QueueKeys.Scheduled},
		{name: "group", group: "g1", opts: []asynq.Option{asynq.Group("g1")}, state: StateAggregating, container: func(k QueueKeys) string { return k.Group("g1") }},
		{name: "group-unique", group: "g1", unique: time.Hour, opts: []asynq.Option{asynq.Group("g1"), asynq.Unique(time.Hour)}, state: StateAggregating, container: func(k QueueKeys) string { return k.Group("g1") }},
		{name: "group-delayed", group: "g1", processAt: later, opts: []asynq.Option{asynq.Group("g1"), asynq.ProcessAt(later)}, state: StateScheduled, container: QueueKeys.Scheduled},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ours, theirs := "ours-"+tc.name, "theirs-"+tc.name
			// Distinct payloads per case keep the unique locks apart.
			p := append(slices.Clone(payload), byte(i))
			f := tickFire("e-"+tc.name, ours, tickAt(i), time.Time{})
			f.Msg.Payload, f.Msg.Headers, f.Msg.Retry, f.Msg.Timeout, f.Msg.GroupKey = p, headers, 7, 90, tc.group
			f.UniqueTTL, f.ProcessAt = tc.unique, tc.processAt
			if tc.unique > 0 {
				f.DuplicateRecord = record("dup", f.Entry, f.Tick)
			}
			res := mustFire(t, s, f, StatusFired)
			if res.State != tc.state || res.TaskID != f.Msg.ID {
				t.Fatalf("result %+v, want state %s and task %s", res, tc.state, f.Msg.ID)
			}
			opts := append([]asynq.Option{asynq.Queue(theirs), asynq.MaxRetry(7), asynq.Timeout(90 * time.Second), asynq.TaskID(f.Msg.ID)}, tc.opts...)
			if _, err := client.Enqueue(asynq.NewTaskWithHeaders("report:daily", p, headers), opts...); err != nil {
				t.Fatalf("asynq enqueue: %v", err)
			}
			ok, tk := Keys(ours), Keys(theirs)
			got, err := rc.HGetAll(ctx, ok.Task(f.Msg.ID)).Result()
			if err != nil {
				t.Fatal(err)
			}
			want, err := rc.HGetAll(ctx, tk.Task(f.Msg.ID)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if gk, wk := slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)); !slices.Equal(gk, wk) {
				t.Fatalf("hash fields %v, asynq writes %v", gk, wk)
			}
			if got["state"] != want["state"] || got["state"] != tc.state {
				t.Fatalf("state %q, asynq %q, want %q", got["state"], want["state"], tc.state)
			}
			if got["group"] != want["group"] {
				t.Fatalf("group field %q, asynq %q", got["group"], want["group"])
			}
			if u := got["unique_key"]; u != strings.Replace(want["unique_key"], theirs, ours, 1) {
				t.Fatalf("unique_key %q, asynq %q", u, want["unique_key"])
			}
			if ps := got["pending_since"]; ps != "" {
				ns, err := strconv.ParseInt(ps, 10, 64)
				if err != nil || time.Since(time.Unix(0, ns)).Abs() > 5*time.Second {
					t.Fatalf("pending_since %q is not now in ns", ps)
				}
			}
			gm, err := DecodeTaskMessage([]byte(got["msg"]))
			if err != nil {
				t.Fatal(err)
			}
			wm, err := DecodeTaskMessage([]byte(want["msg"]))
			if err != nil {
				t.Fatal(err)
			}
			wm.Queue, wm.UniqueKey = ours, strings.Replace(wm.UniqueKey, theirs, ours, 1)
			if !sameTaskMessage(gm, wm) {
				t.Fatalf("msg %+v, asynq writes %+v", gm, wm)
			}

			// Same container, same score (secs) where asynq keeps one.
			member := func(key string) (float64, bool) {
				if strings.HasSuffix(key, ":pending") {
					ids, _ := rc.LRange(ctx, key, 0, -1).Result()
					return 0, slices.Contains(ids, f.Msg.ID)
				}
				sc, err := rc.ZScore(ctx, key, f.Msg.ID).Result()
				return sc, err == nil
			}
			gs, gok := member(tc.container(ok))
			ws, wok := member(tc.container(tk))
			if !gok || !wok {
				t.Fatalf("task in %s: ours %v, asynq %v", tc.container(ok), gok, wok)
			}
			if tc.processAt.IsZero() && tc.group == "" {
				return
			}
			if tc.processAt.IsZero() {
				// AddToGroup scores "now"; both were written within a second or two.
				if d := gs - ws; d < -2 || d > 2 {
					t.Fatalf("group score %v, asynq %v", gs, ws)
				}
			} else if gs != ws {
				t.Fatalf("scheduled score %v, asynq %v", gs, ws)
			}
			if tc.group != "" && tc.processAt.IsZero() {
				if !rc.SIsMember(ctx, ok.Groups(), tc.group).Val() {
					t.Fatalf("group %q not in %s", tc.group, ok.Groups())
				}
			}
			if tc.unique > 0 {
				ttl := rc.TTL(ctx, ok.Unique("report:daily", p)).Val()
				wttl := rc.TTL(ctx, tk.Unique("report:daily", p)).Val()
				if d := ttl - wttl; d < -2*time.Second || d > 2*time.Second {
					t.Fatalf("unique lock ttl %s, asynq %s", ttl, wttl)
				}
			}
		})
	}
	queues, err := rc.SMembers(ctx, AllQueuesKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		if !slices.Contains(queues, "ours-"+tc.name) {
			t.Fatalf("queue %q not in %s: %v", "ours-"+tc.name, AllQueuesKey, queues)
		}
	}
	oq, err := s.OutboxQueues(ctx, testPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(oq) != len(cases) {
		t.Fatalf("outbox queues %v, want %d", oq, len(cases))
	}
}

func sameTaskMessage(a, b *TaskMessage) bool {
	return reflect.DeepEqual(withEmptyMaps(a), withEmptyMaps(b))
}

// withEmptyMaps copies m with nil and empty headers and payload made alike.
func withEmptyMaps(m *TaskMessage) TaskMessage {
	c := *m
	if len(c.Headers) == 0 {
		c.Headers = nil
	}
	if len(c.Payload) == 0 {
		c.Payload = nil
	}
	return c
}

// startAsynqServer runs a real asynq server on rc until the test ends, and
// checks at the very end that it left no goroutine behind.
func startAsynqServer(t *testing.T, rc redis.UniversalClient, cfg asynq.Config, h asynq.Handler) {
	t.Helper()
	verifyNoLeaks(t)
	testenv.StartAsynqServer(t, rc, cfg, h)
}

// verifyNoLeaks fails t if goroutines started after this call are still
// running when the cleanups registered after it have run.
func verifyNoLeaks(t *testing.T) {
	leakOpt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leakOpt) })
}

// handled is what a handler saw of one task.
type handled struct {
	Type     string
	Payload  []byte
	Headers  map[string]string
	Queue    string
	MaxRetry int
	Deadline time.Time
	At       time.Time
}

// TestFiredTasksProcessedByAsynqServer has a real asynq v0.26.0 server
// process tasks created by FireOnce: payload, headers, queue, retry, timeout,
// deadline, retention, unique, group (aggregated) and scheduled (jitter).
func TestFiredTasksProcessedByAsynqServer(t *testing.T) {
	// Not parallel: it checks that the asynq server leaves no goroutine
	// behind, which other tests' goroutines would cloud.
	ctx := context.Background()
	s, rc := newTestStore(t)
	insp := asynq.NewInspectorFromRedisClient(rc)

	payload := []byte{0, 1, 2, 0xff}
	now := time.Now()
	deadline := now.Add(time.Hour).Truncate(time.Second)
	fires := map[string]Fire{}
	add := func(name, queue string, mod func(*Fire)) {
		f := tickFire(name, queue, tickAt(1), time.Time{})
		f.Msg.Type = "job:" + name
		f.Msg.Payload = append(slices.Clone(payload), name...)
		f.Msg.Retry = 7
		f.Msg.Timeout = 90
		if mod != nil {
			mod(&f)
		}
		fires[name] = f
	}
	add("plain", "critical", nil)
	add("deadline", "critical", func(f *Fire) { f.Msg.Timeout, f.Msg.Deadline = 0, deadline.Unix() })
	add("retention", "critical", func(f *Fire) { f.Msg.Retention = 3600 })
	add("unique", "critical", func(f *Fire) { f.UniqueTTL, f.DuplicateRecord = time.Hour, record("dup", "unique", f.Tick) })
	add("jitter", "critical", func(f *Fire) { f.ProcessAt = now.Add(1500 * time.Millisecond) })
	add("g1", "batch", func(f *Fire) { f.Msg.Type, f.Msg.GroupKey = "job:grouped", "g" })
	add("g2", "batch", func(f *Fire) { f.Msg.Type, f.Msg.GroupKey = "job:grouped", "g" })

	for _, name := range slices.Sorted(maps.Keys(fires)) {
		mustFire(t, s, fires[name], StatusFired)
	}
	info, err := insp.GetTaskInfo("critical", fires["jitter"].Msg.ID)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != asynq.TaskStateScheduled {
		t.Fatalf("jittered task state %v, want scheduled", info.State)
	}
	// A second unique fire while the lock is held is a duplicate.
	dup := fires["unique"]
	dup.Entry, dup.Msg = "unique-2", &TaskMessage{Type: dup.Msg.Type, Payload: dup.Msg.Payload, ID: "other-id", Retry: 1, Timeout: 10}
	dup.FiredRecord, dup.DuplicateRecord = record("fired", "unique-2", dup.Tick), record("dup", "unique-2", dup.Tick)
	if res := mustFire(t, s, dup, StatusDuplicate); res.TaskID != fires["unique"].Msg.ID {
		t.Fatalf("duplicate names lock holder %q, want %q", res.TaskID, fires["unique"].Msg.ID)
	}

	var mu sync.Mutex
	seen := map[string]handled{}
	h := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		q, _ := asynq.GetQueueName(ctx)
		n, _ := asynq.GetMaxRetry(ctx)
		dl, _ := ctx.Deadline()
		mu.Lock()
		defer mu.Unlock()
		seen[task.Type()+"|"+string(task.Payload())] = handled{
			Type: task.Type(), Payload: task.Payload(), Headers: task.Headers(), Queue: q, MaxRetry: n, Deadline: dl, At: time.Now(),
		}
		return nil
	})
	agg := asynq.GroupAggregatorFunc(func(group string, tasks []*asynq.Task) *asynq.Task {
		var parts []string
		for _, tk := range tasks {
			parts = append(parts, string(tk.Payload()))
		}
		slices.Sort(parts)
		return asynq.NewTask("job:aggregated", []byte(group+"="+strings.Join(parts, ",")))
	})
	start := time.Now()
	startAsynqServer(t, rc, asynq.Config{
		Concurrency: 4, Queues: map[string]int{"critical": 1, "batch": 1},
		GroupAggregator: agg, GroupGracePeriod: time.Second, GroupMaxSize: 2,
	}, h)

	key := func(f Fire) string { return f.Msg.Type + "|" + string(f.Msg.Payload) }
	aggKey := "job:aggregated|g=" + string(fires["g1"].Msg.Payload) + "," + string(fires["g2"].Msg.Payload)
	testenv.Eventually(t, 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, name := range []string{"plain", "deadline", "retention", "unique", "jitter"} {
			if _, ok := seen[key(fires[name])]; !ok {
				return false
			}
		}
		_, ok := seen[aggKey]
		return ok
	}, "asynq server processed every fired task")

	mu.Lock()
	defer mu.Unlock()
	plain := seen[key(fires["plain"])]
	if plain.Queue != "critical" || plain.MaxRetry != 7 || !maps.Equal(plain.Headers, map[string]string{"source": "cron"}) ||
		string(plain.Payload) != string(fires["plain"].Msg.Payload) {
		t.Fatalf("plain task seen as %+v", plain)
	}
	if d := plain.Deadline.Sub(start); d < 85*time.Second || d > 100*time.Second {
		t.Fatalf("timeout 90s gave a handler deadline %s after start", d)
	}
	if dl := seen[key(fires["deadline"])].Deadline; !dl.Equal(deadline) {
		t.Fatalf("deadline task's handler deadline %s, want %s", dl, deadline)
	}
	// asynq scores scheduled tasks in whole seconds, so a task may run up to
	// a second before its exact process-at, never before the second.
	if at, ran := fires["jitter"].ProcessAt, seen[key(fires["jitter"])].At; ran.Before(at.Truncate(time.Second)) {
		t.Fatalf("jittered task ran at %s, before its process-at %s", ran, at)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		info, err := insp.GetTaskInfo("critical", fires["retention"].Msg.ID)
		return err == nil && info.State == asynq.TaskStateCompleted && info.Retention == time.Hour
	}, "retained task is in completed")
	testenv.Eventually(t, 5*time.Second, func() bool {
		return rc.Exists(ctx, Keys("critical").Unique(fires["unique"].Msg.Type, fires["unique"].Msg.Payload)).Val() == 0
	}, "unique lock released by asynq's Done")
}

// TestInspectorReadsFiredTasks checks that asynq's Inspector reads fired tasks.
func TestInspectorReadsFiredTasks(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	insp := asynq.NewInspectorFromRedisClient(rc)
	var ids []string
	for i := range 3 {
		f := tickFire(fmt.Sprintf("e%d", i), "critical", tickAt(1), time.Time{})
		f.Msg.Deadline = baseTick.Add(time.Hour).Unix()
		mustFire(t, s, f, StatusFired)
		ids = append(ids, f.Msg.ID)
	}
	at := time.Now().Add(time.Hour)
	sf := tickFire("later", "critical", tickAt(1), time.Time{})
	sf.ProcessAt = at
	mustFire(t, s, sf, StatusFired)
	gf := tickFire("grouped", "critical", tickAt(1), time.Time{})
	gf.Msg.GroupKey = "g"
	mustFire(t, s, gf, StatusFired)

	info, err := insp.GetTaskInfo("critical", ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if info.State != asynq.TaskStatePending || info.Type != "report:daily" || info.MaxRetry != 25 ||
		info.Timeout != 30*time.Minute || info.Deadline.Unix() != baseTick.Add(time.Hour).Unix() ||
		info.Headers["source"] != "cron" || string(info.Payload) != `{"team":"ops"}` {
		t.Fatalf("GetTaskInfo = %+v", info)
	}
	pending, err := insp.ListPendingTasks("critical")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pending {
		got = append(got, p.ID)
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("ListPendingTasks = %v, want %v (oldest first)", got, ids)
	}
	sched, err := insp.ListScheduledTasks("critical")
	if err != nil {
		t.Fatal(err)
	}
	if len(sched) != 1 || sched[0].ID != sf.Msg.ID || sched[0].NextProcessAt.Unix() != at.Unix() {
		t.Fatalf("ListScheduledTasks = %+v", sched)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		qi, err := insp.GetQueueInfo("critical")
		if err != nil {
			t.Fatalf("GetQueueInfo: %v", err)
		}
		return qi.Size == 5 && qi.Pending == 3 && qi.Scheduled == 1 && qi.Aggregating == 1 && qi.Groups == 1 &&
			qi.Latency >= 50*time.Millisecond && qi.Latency < time.Minute
	}, "GetQueueInfo sizes and latency from pending_since")
}

// TestFireCompareAndSetRace fires the same tick from two goroutines with the
// same expected watermark: exactly one fires, the other learns the new
// watermark.
func TestFireCompareAndSetRace(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	rc := r.Client(t)
	s, s2 := New(rc), New(r.Client(t)) // two replicas, two connections
	prev := time.Time{}
	for i := 1; i <= 30; i++ {
		tick := tickAt(i)
		var wg sync.WaitGroup
		results := make([]FireResult, 2)
		errs := make([]error, 2)
		for g, st := range []*Store{s, s2} {
			wg.Go(func() {
				results[g], errs[g] = st.FireOnce(context.Background(), testFences, tickFire("race", "default", tick, prev))
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		statuses := []FireStatus{results[0].Status, results[1].Status}
		slices.Sort(statuses)
		if statuses[0] != StatusFired || statuses[1] != StatusWatermarkMismatch {
			t.Fatalf("tick %d: statuses %v, want one fired and one mismatch", i, statuses)
		}
		for _, r := range results {
			if !r.HasWatermark || !r.Watermark.Equal(tick) || r.WatermarkTaskID != taskIDFor("race", tick) {
				t.Fatalf("tick %d: result %+v does not carry the new watermark", i, r)
			}
		}
		prev = tick
	}
	ids := outboxIDs(t, s, "default")
	if len(ids) != 30 {
		t.Fatalf("outbox has %d records, want 30: %v", len(ids), ids)
	}
	for i, id := range ids {
		if want := record("fired", "race", tickAt(i+1)).ID; id != want {
			t.Fatalf("outbox[%d] = %q, want %q", i, id, want)
		}
	}
	if n := rc.LLen(context.Background(), Keys("default").Pending()).Val(); n != 30 {
		t.Fatalf("%d pending tasks, want 30", n)
	}
}

// TestFireCatchUpGap fires a tick after a gap: the caller's skipped records
// land in the outbox in the same step, before the fired record.
func TestFireCatchUpGap(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t)
	mustFire(t, s, tickFire("gap", "default", tickAt(0), time.Time{}), StatusFired)
	f := tickFire("gap", "default", tickAt(5), tickAt(0))
	for i := 1; i < 5; i++ {
		f.SkippedRecords = append(f.SkippedRecords, record("skipped", "gap", tickAt(i)))
	}
	// A stale expectation is refused and appends nothing.
	stale := f
	stale.Expected = tickAt(-1)
	if res := mustFire(t, s, stale, StatusWatermarkMismatch); !res.Watermark.Equal(tickAt(0)) {
		t.Fatalf("mismatch carries watermark %s, want %s", res.Watermark, tickAt(0))
	}
	mustFire(t, s, f, StatusFired)
	want := []string{record("fired", "gap", tickAt(0)).ID}
	for i := 1; i < 5; i++ {
		want = append(want, record("skipped", "gap", tickAt(i)).ID)
	}
	want = append(want, record("fired", "gap", tickAt(5)).ID)
	if got := outboxIDs(t, s, "default"); !slices.Equal(got, want) {
		t.Fatalf("outbox = %v, want %v", got, want)
	}
	assertWatermark(t, s, "default", "gap", tickAt(5), taskIDFor("gap", tickAt(5)))
	// The replica that lost the race finds nothing left to do.
	if res := mustFire(t, s, f, StatusWatermarkMismatch); !res.Watermark.Equal(tickAt(5)) {
		t.Fatalf("second catch-up sees watermark %s", res.Watermark)
	}
	if got := outboxIDs(t, s, "default"); len(got) != len(want) {
		t.Fatalf("refused fire appended records: %v", got)
	}
}

// TestFireRevisionFence refuses a fire from an older configuration than one
// already seen in the slot.
func TestFireRevisionFence(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t)
	seq := func(n uint64) Fences { return Fences{ConfigSeq: n} }
	f := tickFire("rev", "default", tickAt(1), time.Time{})
	mustFireWith(t, s, seq(42), f, StatusFired)
	old := tickFire("rev", "default", tickAt(2), tickAt(1))
	if res := mustFireWith(t, s, seq(41), old, StatusRevisionFenced); res.Fence != 42 || !res.Watermark.Equal(tickAt(1)) {
		t.Fatalf("fenced result %+v", res)
	}
	// The fence is per slot, not per entry: another entry of an older
	// projection is refused too.
	other := tickFire("other", "default", tickAt(2), time.Time{})
	mustFireWith(t, s, seq(40), other, StatusRevisionFenced)
	same := old
	mustFireWith(t, s, seq(42), same, StatusFired)
	newer := tickFire("rev", "default", tickAt(3), tickAt(2))
	mustFireWith(t, s, seq(50), newer, StatusFired)
	again := tickFire("other", "default", tickAt(2), time.Time{})
	if res := mustFireWith(t, s, seq(42), again, StatusRevisionFenced); res.Fence != 50 {
		t.Fatalf("fence %d, want 50", res.Fence)
	}
	if got := outboxIDs(t, s, "default"); len(got) != 3 {
		t.Fatalf("outbox %v, want 3 fired records", got)
	}
	// A batch carries one set of fences: after a batch raised the fence, a
	// batch of a lower sequence is refused throughout and never lowers it.
	up := tickFire("b1", "default", tickAt(1), time.Time{})
	down := tickFire("b2", "default", tickAt(1), time.Time{})
	if res, err := s.FireBatch(context.Background(), seq(60), []Fire{up}); err != nil || res[0].Status != StatusFired {
		t.Fatalf("batch at 60: %v %v", res, err)
	}
	res, err := s.FireBatch(context.Background(), seq(55), []Fire{down, down})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != StatusRevisionFenced || res[1].Status != StatusRevisionFenced || res[1].Fence != 60 {
		t.Fatalf("batch statuses %v %v (fence %d)", res[0].Status, res[1].Status, res[1].Fence)
	}
}

// TestFireStalenessFence: a replica whose projection lags the freshest one
// seen in the slot by more than max staleness is refused; replicas that are
// all equally stale (nobody hears NATS) keep firing.
func TestFireStalenessFence(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t)
	heard := time.Now().Add(-10 * time.Minute) // long ago: Redis TIME plays no part
	fire := func(entry string, n int, freshAsOf time.Time, want FireStatus) FireResult {
		var prev time.Time
		if n > 1 {
			prev = tickAt(n - 1)
		}
		f := tickFire(entry, "default", tickAt(n), prev)
		return mustFireWith(t, s, Fences{ConfigSeq: 10, FreshAsOf: freshAsOf, MaxStaleness: 30 * time.Second}, f, want)
	}
	// Nobody hears NATS: three replicas whose projections stopped within a
	// few seconds of each other all keep firing, minutes later.
	fire("a", 1, heard, StatusFired)
	fire("b", 1, heard.Add(3*time.Second), StatusFired)
	fire("a", 2, heard.Add(-2*time.Second), StatusFired)
	// Replica 2 still hears the stream 40 s later; replica 1 does not.
	fire("b", 2, heard.Add(43*time.Second), StatusFired)
	res := fire("a", 3, heard, StatusStale)
	if !res.FreshestAsOf.Equal(heard.Add(43 * time.Second).Truncate(time.Millisecond)) {
		t.Fatalf("stale result names freshest %s", res.FreshestAsOf)
	}
	// Within max staleness of the freshest: fine again.
	fire("a", 3, heard.Add(14*time.Second), StatusFired)
	// A batch carries one set of fences: after a batch raised the
	// freshness, a batch lagging it is stale throughout.
	ahead := tickFire("d", "default", tickAt(1), time.Time{})
	behind := tickFire("e", "default", tickAt(1), time.Time{})
	fresh := func(at time.Time) Fences { return Fences{ConfigSeq: 10, FreshAsOf: at, MaxStaleness: 30 * time.Second} }
	if batch, err := s.FireBatch(context.Background(), fresh(heard.Add(100*time.Second)), []Fire{ahead}); err != nil || batch[0].Status != StatusFired {
		t.Fatalf("batch ahead: %v %v", batch, err)
	}
	batch, err := s.FireBatch(context.Background(), fresh(heard.Add(60*time.Second)), []Fire{behind, behind})
	if err != nil {
		t.Fatal(err)
	}
	if batch[0].Status != StatusStale || batch[1].Status != StatusStale {
		t.Fatalf("batch statuses %v %v", batch[0].Status, batch[1].Status)
	}
	// A fire that presents no freshness is not checked.
	f := tickFire("c", "default", tickAt(1), time.Time{})
	mustFire(t, s, f, StatusFired)
}

// TestFireFenceID: the fence stores the id of the config message at its
// sequence beside it, refusals name both, a fence without a stored id (an
// earlier build's) is refused with no id and gets one from the next fire at
// its sequence; ClearFence and ClearHandover delete only the value compared.
func TestFireFenceID(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	ctx := context.Background()
	own := Own(testPrefix, "default")
	fire := func(entry string, seq uint64, id string, want FireStatus) FireResult {
		t.Helper()
		f := tickFire(entry, "default", tickAt(1), time.Time{})
		return mustFireWith(t, s, Fences{ConfigSeq: seq, ConfigID: id}, f, want)
	}
	fire("a", 5, "aaaaaaaaaaaa", StatusFired)
	if v := rc.Get(ctx, own.FenceID()).Val(); v != "5:aaaaaaaaaaaa" {
		t.Fatalf("fence id %q", v)
	}
	if res := fire("b", 3, "", StatusRevisionFenced); res.Fence != 5 || res.FenceID != "aaaaaaaaaaaa" {
		t.Fatalf("refused by fence %d id %q", res.Fence, res.FenceID)
	}
	// An earlier build raised the fence: its id is unknown.
	if err := rc.Set(ctx, own.Fence(), "9", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if res := fire("c", 6, "cccccccccccc", StatusRevisionFenced); res.Fence != 9 || res.FenceID != "" {
		t.Fatalf("refused by fence %d id %q", res.Fence, res.FenceID)
	}
	fire("d", 9, "dddddddddddd", StatusFired)
	if v := rc.Get(ctx, own.FenceID()).Val(); v != "9:dddddddddddd" {
		t.Fatalf("fence id %q", v)
	}
	// Another message at the same sequence (the stream was recreated and
	// grew to it): the fire's, read from the stream it follows, wins.
	fire("f", 9, "ffffffffffff", StatusFired)
	if v := rc.Get(ctx, own.FenceID()).Val(); v != "9:ffffffffffff" {
		t.Fatalf("fence id %q", v)
	}
	if ok, err := s.ClearFence(ctx, testPrefix, "default", 8); err != nil || ok {
		t.Fatalf("cleared a fence it did not compare: %v %v", ok, err)
	}
	if ok, err := s.ClearFence(ctx, testPrefix, "default", 9); err != nil || !ok {
		t.Fatalf("clear fence: %v %v", ok, err)
	}
	if n := rc.Exists(ctx, own.Fence()).Val(); n != 0 {
		t.Fatal("fence still there")
	}
	fire("e", 2, "eeeeeeeeeeee", StatusFired)
	if v := rc.Get(ctx, own.FenceID()).Val(); v != "2:eeeeeeeeeeee" {
		t.Fatalf("fence id after a new epoch %q", v)
	}
	if _, _, _, err := s.CloseForHandover(ctx, testPrefix, "default", "m", 7, ""); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.ClearHandover(ctx, testPrefix, "default", "m", 6); err != nil || ok {
		t.Fatalf("cleared a marker it did not compare: %v %v", ok, err)
	}
	if ok, err := s.ClearHandover(ctx, testPrefix, "default", "m", 7); err != nil || !ok {
		t.Fatalf("clear marker: %v %v", ok, err)
	}
	fire("m", 7, "", StatusFired)
}

// TestHandoverMarkerID: each handover marker stores the id of the config
// message at its revision beside it, in a key of its own, so the marker
// keeps the format earlier builds read; a marker an earlier build wrote (or
// raised past the stored id) has no known id; ClearHandover deletes both.
func TestHandoverMarkerID(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	ctx := context.Background()
	a, b := Own(testPrefix, "A"), Own(testPrefix, "B")
	idOf := func(queue string, rev uint64) string {
		t.Helper()
		id, err := s.HandoverID(ctx, testPrefix, queue, "mv", rev)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	if _, _, _, err := s.CloseForHandover(ctx, testPrefix, "A", "mv", 20, "aaaaaaaaaaaa"); err != nil {
		t.Fatal(err)
	}
	if err := s.SeedWatermark(ctx, testPrefix, "B", "mv", tickAt(2), "t", 20, "aaaaaaaaaaaa"); err != nil {
		t.Fatal(err)
	}
	for _, own := range []OwnKeys{a, b} {
		if v := rc.Get(ctx, own.HandoverID("mv")).Val(); v != "20:aaaaaaaaaaaa" {
			t.Fatalf("marker id %q", v)
		}
	}
	if m := rc.Get(ctx, a.Handover("mv")).Val(); m != "20 out" {
		t.Fatalf("marker %q, want the earlier builds' format", m)
	}
	if id := idOf("A", 20); id != "aaaaaaaaaaaa" {
		t.Fatalf("HandoverID = %q", id)
	}
	if id := idOf("A", 19); id != "" {
		t.Fatalf("HandoverID of another revision = %q", id)
	}
	// A repeated close without an id keeps the one stored; a refused seed
	// (superseded) writes none.
	if _, _, _, err := s.CloseForHandover(ctx, testPrefix, "A", "mv", 20, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.SeedWatermark(ctx, testPrefix, "A", "mv", time.Time{}, "", 20, "bbbbbbbbbbbb"); !errors.Is(err, ErrHandoverSuperseded) {
		t.Fatalf("seed into a slot closed at the same revision: %v", err)
	}
	if id := idOf("A", 20); id != "aaaaaaaaaaaa" {
		t.Fatalf("HandoverID = %q after a repeat and a refused seed", id)
	}
	// An earlier build moves the entry back at 30: it writes the marker
	// only; the id stored is of another revision, so the marker's is
	// unknown.
	if err := rc.Set(ctx, a.Handover("mv"), "30 in", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if id := idOf("A", 30); id != "" {
		t.Fatalf("HandoverID of an earlier build's marker = %q", id)
	}
	if ok, err := s.ClearHandover(ctx, testPrefix, "B", "mv", 20); err != nil || !ok {
		t.Fatalf("clear marker: %v %v", ok, err)
	}
	if n := rc.Exists(ctx, b.Handover("mv"), b.HandoverID("mv")).Val(); n != 0 {
		t.Fatalf("%d of the marker and its id left after ClearHandover", n)
	}
}

// TestFireFreshnessCapped: a replica whose clock runs an hour fast presents
// a freshness an hour ahead; it is capped at Redis TIME + 2 s, so a replica
// presenting the true time is not stale. A stored freshness beyond TIME + 2 s
// (left by an earlier build) is ignored and overwritten.
func TestFireFreshnessCapped(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	ctx := context.Background()
	key := Own(testPrefix, "default").Freshness()
	fire := func(entry string, freshAsOf time.Time, want FireStatus) {
		t.Helper()
		f := tickFire(entry, "default", tickAt(1), time.Time{})
		mustFireWith(t, s, Fences{ConfigSeq: 10, FreshAsOf: freshAsOf, MaxStaleness: 30 * time.Second}, f, want)
	}
	stored := func() time.Time {
		t.Helper()
		ms, err := rc.Get(ctx, key).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return time.UnixMilli(ms)
	}
	fire("fast", time.Now().Add(time.Hour), StatusFired)
	if got := stored(); got.After(time.Now().Add(10 * time.Second)) {
		t.Fatalf("stored freshness %s: not capped at Redis TIME + 2s", got)
	}
	fire("true-clock", time.Now(), StatusFired)
	// A replica 40 s behind the true clock is still stale: the cap keeps
	// the fence, it only bounds what is believed.
	fire("behind", time.Now().Add(-40*time.Second), StatusStale)

	if err := rc.Set(ctx, key, time.Now().Add(time.Hour).UnixMilli(), 0).Err(); err != nil {
		t.Fatal(err)
	}
	fire("after-old-build", time.Now(), StatusFired)
	if got := stored(); got.After(time.Now().Add(10 * time.Second)) {
		t.Fatalf("stored freshness %s from an earlier build was kept", got)
	}
}

// TestFireOverlapSkip skips a tick while the previous task is pending or
// active (held by a real asynq worker) and fires once it completed.
func TestFireOverlapSkip(t *testing.T) {
	// Not parallel: it checks that the asynq server leaves no goroutine
	// behind, which other tests' goroutines would cloud.
	s, rc := newTestStore(t)
	overlapFire := func(n int) Fire {
		f := tickFire("ov", "default", tickAt(n), tickAt(n-1))
		f.OverlapSkip, f.OverlapRecord = true, record("overlap", "ov", tickAt(n))
		return f
	}
	first := tickFire("ov", "default", tickAt(1), time.Time{})
	mustFire(t, s, first, StatusFired)
	// Pending: skipped; the watermark moves on and keeps the running task.
	if res := mustFire(t, s, overlapFire(2), StatusSkippedOverlap); res.TaskID != first.Msg.ID || res.State != StatePending {
		t.Fatalf("overlap result %+v", res)
	}
	assertWatermark(t, s, "default", "ov", tickAt(2), first.Msg.ID)

	release := make(chan struct{})
	started := make(chan string, 10)
	startAsynqServer(t, rc, asynq.Config{Concurrency: 1, Queues: map[string]int{"default": 1}}, asynq.HandlerFunc(
		func(ctx context.Context, task *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			started <- id
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}))
	select {
	case id := <-started:
		if id != first.Msg.ID {
			t.Fatalf("worker took %q", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("worker did not take the task")
	}
	if res := mustFire(t, s, overlapFire(3), StatusSkippedOverlap); res.State != StateActive {
		t.Fatalf("overlap with active task: %+v", res)
	}
	close(release)
	testenv.Eventually(t, 5*time.Second, func() bool {
		return rc.Exists(context.Background(), Keys("default").Task(first.Msg.ID)).Val() == 0
	}, "task done")
	mustFire(t, s, overlapFire(4), StatusFired)
	want := []string{
		record("fired", "ov", tickAt(1)).ID, record("overlap", "ov", tickAt(2)).ID,
		record("overlap", "ov", tickAt(3)).ID, record("fired", "ov", tickAt(4)).ID,
	}
	if got := outboxIDs(t, s, "default"); !slices.Equal(got, want) {
		t.Fatalf("outbox %v, want %v", got, want)
	}
}

// TestFireTrigger: a trigger is idempotent per request id and never moves the
// watermark.
func TestFireTrigger(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	mustFire(t, s, tickFire("tr", "default", tickAt(1), time.Time{}), StatusFired)
	trig := func(req string) Fire {
		f := tickFire("tr", "default", tickAt(1).Add(17*time.Second), time.Time{})
		f.Kind, f.RequestID, f.ExpectNone = FireTrigger, req, false
		f.Msg.ID = testPrefix + ":tr:trigger:" + req
		f.FiredRecord = Record{ID: "trigger/" + req, Data: []byte(`{}`)}
		return f
	}
	first := mustFire(t, s, trig("req-1"), StatusFired)
	if first.TaskID != testPrefix+":tr:trigger:req-1" {
		t.Fatalf("trigger task %q", first.TaskID)
	}
	again := mustFire(t, s, trig("req-1"), StatusAlreadyExists)
	if again.TaskID != first.TaskID {
		t.Fatalf("repeated trigger names task %q, want %q", again.TaskID, first.TaskID)
	}
	// Even after the task was processed and deleted, the request id holds.
	rc.Del(context.Background(), Keys("default").Task(first.TaskID))
	mustFire(t, s, trig("req-1"), StatusAlreadyExists)
	mustFire(t, s, trig("req-2"), StatusFired)
	assertWatermark(t, s, "default", "tr", tickAt(1), taskIDFor("tr", tickAt(1)))
	if ttl := rc.PTTL(context.Background(), Own(testPrefix, "default").Trigger("req-1")).Val(); ttl <= 23*time.Hour {
		t.Fatalf("trigger key ttl %s, want about 24h", ttl)
	}
	want := []string{record("fired", "tr", tickAt(1)).ID, "trigger/req-1", "trigger/req-2"}
	if got := outboxIDs(t, s, "default"); !slices.Equal(got, want) {
		t.Fatalf("outbox %v, want %v", got, want)
	}
	// The next tick still expects the scheduled watermark.
	mustFire(t, s, tickFire("tr", "default", tickAt(2), tickAt(1)), StatusFired)
}

// TestFireBackfill: backfill ticks are idempotent by task id and never move
// the watermark.
func TestFireBackfill(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t)
	mustFire(t, s, tickFire("bf", "default", tickAt(10), time.Time{}), StatusFired)
	back := func(n int) Fire {
		f := tickFire("bf", "default", tickAt(n), time.Time{})
		f.Kind, f.ExpectNone = FireBackfill, false
		return f
	}
	for n := 3; n <= 5; n++ {
		mustFire(t, s, back(n), StatusFired)
	}
	for n := 3; n <= 5; n++ {
		if res := mustFire(t, s, back(n), StatusAlreadyExists); res.TaskID != taskIDFor("bf", tickAt(n)) {
			t.Fatalf("backfill repeat %+v", res)
		}
	}
	// A backfill of the tick the watermark already fired is a no-op too.
	mustFire(t, s, back(10), StatusAlreadyExists)
	assertWatermark(t, s, "default", "bf", tickAt(10), taskIDFor("bf", tickAt(10)))
	if got := outboxIDs(t, s, "default"); len(got) != 4 {
		t.Fatalf("outbox %v, want 4 fired records", got)
	}
}

// TestFireAlreadyExists: when the watermark was lost but the tick's task
// exists, the fire advances the watermark without a second fired record.
func TestFireAlreadyExists(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	mustFire(t, s, tickFire("ae", "default", tickAt(1), time.Time{}), StatusFired)
	rc.Del(context.Background(), Own(testPrefix, "default").Watermark("ae"))
	f := tickFire("ae", "default", tickAt(1), time.Time{})
	if res := mustFire(t, s, f, StatusAlreadyExists); res.TaskID != f.Msg.ID || !res.Watermark.Equal(tickAt(1)) {
		t.Fatalf("result %+v", res)
	}
	assertWatermark(t, s, "default", "ae", tickAt(1), f.Msg.ID)
	if got := outboxIDs(t, s, "default"); len(got) != 1 {
		t.Fatalf("outbox %v, want only the first fired record", got)
	}
}

// TestFireUniqueDuplicate: a held unique lock skips the tick with the
// duplicate record and moves the watermark.
func TestFireUniqueDuplicate(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	uniq := func(n int, prev time.Time) Fire {
		f := tickFire("uq", "default", tickAt(n), prev)
		f.UniqueTTL, f.DuplicateRecord = time.Hour, record("dup", "uq", tickAt(n))
		return f
	}
	first := mustFire(t, s, uniq(1, time.Time{}), StatusFired)
	res := mustFire(t, s, uniq(2, tickAt(1)), StatusDuplicate)
	if res.TaskID != first.TaskID {
		t.Fatalf("duplicate names %q, want lock holder %q", res.TaskID, first.TaskID)
	}
	assertWatermark(t, s, "default", "uq", tickAt(2), first.TaskID)
	if rc.Exists(context.Background(), Keys("default").Task(taskIDFor("uq", tickAt(2)))).Val() != 0 {
		t.Fatal("duplicate fire created a task")
	}
	want := []string{record("fired", "uq", tickAt(1)).ID, record("dup", "uq", tickAt(2)).ID}
	if got := outboxIDs(t, s, "default"); !slices.Equal(got, want) {
		t.Fatalf("outbox %v, want %v", got, want)
	}
}

// TestHandover moves an entry A→B (a late fire in A is refused, B continues
// from A's watermark) and back B→A.
func TestHandover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newTestStore(t)
	// fireAt fires from a projection at config sequence seq.
	fireAt := func(seq uint64, entry, queue string, n int, want FireStatus) FireResult {
		var prev time.Time
		if n > 1 {
			prev = tickAt(n - 1)
		}
		f := tickFire(entry, queue, tickAt(n), prev)
		return mustFireWith(t, s, Fences{ConfigSeq: seq}, f, want)
	}
	fireAt(10, "mv", "A", 1, StatusFired)
	fireAt(10, "mv", "A", 2, StatusFired)

	// Revision 20 moves the entry to B. Closing twice is harmless.
	for range 2 {
		tick, task, ok, err := s.CloseForHandover(ctx, testPrefix, "A", "mv", 20, "")
		if err != nil || !ok || !tick.Equal(tickAt(2)) || task != taskIDFor("mv", tickAt(2)) {
			t.Fatalf("close A = (%s, %q, %v, %v)", tick, task, ok, err)
		}
	}
	// A replica still on the old configuration fires into A: refused.
	if res := fireAt(10, "mv", "A", 3, StatusMoved); res.MovedAt != 20 || !res.Watermark.Equal(tickAt(2)) {
		t.Fatalf("late fire in A: %+v", res)
	}
	for range 2 {
		if err := s.SeedWatermark(ctx, testPrefix, "B", "mv", tickAt(2), taskIDFor("mv", tickAt(2)), 20, ""); err != nil {
			t.Fatal(err)
		}
	}
	assertWatermark(t, s, "B", "mv", tickAt(2), taskIDFor("mv", tickAt(2)))
	// The handover raised B's fence: an old projection cannot fire there.
	if res := fireAt(10, "mv", "B", 3, StatusRevisionFenced); res.Fence != 20 {
		t.Fatalf("old projection in B: %+v", res)
	}
	fireAt(20, "mv", "B", 3, StatusFired)
	fireAt(20, "mv", "B", 4, StatusFired)
	// A stale seed of B (older watermark) does not move B's watermark back.
	if err := s.SeedWatermark(ctx, testPrefix, "B", "mv", tickAt(2), "x", 20, ""); err != nil {
		t.Fatal(err)
	}
	assertWatermark(t, s, "B", "mv", tickAt(4), taskIDFor("mv", tickAt(4)))

	// Revision 30 moves it back to A.
	tick, task, ok, err := s.CloseForHandover(ctx, testPrefix, "B", "mv", 30, "")
	if err != nil || !ok || !tick.Equal(tickAt(4)) {
		t.Fatalf("close B = (%s, %q, %v, %v)", tick, task, ok, err)
	}
	fireAt(20, "mv", "B", 5, StatusMoved)
	if err := s.SeedWatermark(ctx, testPrefix, "A", "mv", tick, task, 30, ""); err != nil {
		t.Fatal(err)
	}
	assertWatermark(t, s, "A", "mv", tickAt(4), taskIDFor("mv", tickAt(4)))
	// A late repetition of the first handover changes nothing.
	if _, _, _, err := s.CloseForHandover(ctx, testPrefix, "A", "mv", 20, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.SeedWatermark(ctx, testPrefix, "B", "mv", tickAt(2), "", 20, ""); !errors.Is(err, ErrHandoverSuperseded) {
		t.Fatalf("stale seed of B: %v, want ErrHandoverSuperseded", err)
	}
	// A replica still on the configuration from before the first move
	// (queue A) cannot fire in A again; the current one can.
	fireAt(10, "mv", "A", 5, StatusRevisionFenced)
	fireAt(30, "mv", "A", 5, StatusFired)

	// No tick fired into both queues.
	for _, q := range []string{"A", "B"} {
		for _, id := range outboxIDs(t, s, q) {
			other := map[string]string{"A": "B", "B": "A"}[q]
			if slices.Contains(outboxIDs(t, s, other), id) {
				t.Fatalf("%s fired in both queues", id)
			}
		}
	}
	wantA := []string{record("fired", "mv", tickAt(1)).ID, record("fired", "mv", tickAt(2)).ID, record("fired", "mv", tickAt(5)).ID}
	if got := outboxIDs(t, s, "A"); !slices.Equal(got, wantA) {
		t.Fatalf("outbox A %v, want %v", got, wantA)
	}
	wantB := []string{record("fired", "mv", tickAt(3)).ID, record("fired", "mv", tickAt(4)).ID}
	if got := outboxIDs(t, s, "B"); !slices.Equal(got, wantB) {
		t.Fatalf("outbox B %v, want %v", got, wantB)
	}
	// An entry that never fired in its old queue hands over no watermark.
	if _, _, ok, err := s.CloseForHandover(ctx, testPrefix, "A", "fresh", 40, ""); err != nil || ok {
		t.Fatalf("close of never-fired entry: ok %v, err %v", ok, err)
	}
	if err := s.SeedWatermark(ctx, testPrefix, "B", "fresh", time.Time{}, "", 40, ""); err != nil {
		t.Fatal(err)
	}
	fireAt(40, "fresh", "B", 1, StatusFired)
}

// TestFireBatch fires several queues and consecutive ticks of one entry in
// one batch, in both call shapes, and recovers from an empty script cache.
func TestFireBatch(t *testing.T) {
	t.Parallel()
	for _, perCall := range []callSizes{{1, 1}, fireCallSizes} {
		t.Run(fmt.Sprintf("per-call-%d-%d", perCall.each, perCall.bulk), func(t *testing.T) {
			ctx := context.Background()
			s, rc := newTestStore(t)
			if err := rc.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			var fires []Fire
			for i := 1; i <= 150; i++ { // one entry catching up 150 ticks, in order
				var prev time.Time
				if i > 1 {
					prev = tickAt(i - 1)
				}
				fires = append(fires, tickFire("seq", "q1", tickAt(i), prev))
				fires = append(fires, tickFire(fmt.Sprintf("e%d", i), fmt.Sprintf("q%d", 2+i%3), tickAt(1), time.Time{}))
			}
			// A refusal in the middle of a call leaves the rest alone.
			bad := tickFire("seq", "q1", tickAt(500), tickAt(7))
			fires = slices.Insert(fires, 5, bad)
			res, err := s.fireBatch(ctx, testFences, fires, nil, perCall)
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != len(fires) {
				t.Fatalf("%d results for %d fires", len(res), len(fires))
			}
			for i, r := range res {
				want := StatusFired
				if i == 5 {
					want = StatusWatermarkMismatch
				}
				if r.Status != want {
					t.Fatalf("fire %d (%s %s): %s, want %s", i, fires[i].Entry, fires[i].Tick, r.Status, want)
				}
			}
			assertWatermark(t, s, "q1", "seq", tickAt(150), taskIDFor("seq", tickAt(150)))
			ids := outboxIDs(t, s, "q1")
			if len(ids) != 150 || ids[0] != record("fired", "seq", tickAt(1)).ID || ids[149] != record("fired", "seq", tickAt(150)).ID {
				t.Fatalf("q1 outbox has %d records, first %q", len(ids), ids[0])
			}
			for q := 2; q <= 4; q++ {
				if n := len(outboxIDs(t, s, fmt.Sprintf("q%d", q))); n != 50 {
					t.Fatalf("q%d outbox has %d records, want 50", q, n)
				}
			}
		})
	}
}

// TestFireInvalid rejects fires that cannot be sent, before sending anything.
func TestFireInvalid(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	valid := func() Fire { return tickFire("inv", "default", tickAt(2), tickAt(1)) }
	cases := map[string]func(*Fire){
		"no entry":          func(f *Fire) { f.Entry = "" },
		"no queue":          func(f *Fire) { f.Queue = "" },
		"no msg":            func(f *Fire) { f.Msg = nil },
		"blank type":        func(f *Fire) { f.Msg.Type = " " },
		"no task id":        func(f *Fire) { f.Msg.ID = "" },
		"queue mismatch":    func(f *Fire) { f.Msg.Queue = "other" },
		"no expectation":    func(f *Fire) { f.Expected = time.Time{} },
		"tick not after":    func(f *Fire) { f.Tick = tickAt(1) },
		"trigger no req":    func(f *Fire) { f.Kind = FireTrigger },
		"unique below 1s":   func(f *Fire) { f.UniqueTTL, f.DuplicateRecord = time.Millisecond, record("d", "x", tickAt(1)) },
		"unique no record":  func(f *Fire) { f.UniqueTTL = time.Hour },
		"overlap no record": func(f *Fire) { f.OverlapSkip = true },
		"no fired record":   func(f *Fire) { f.FiredRecord = Record{} },
		"record no data":    func(f *Fire) { f.SkippedRecords = []Record{{ID: "x"}} },
		"invalid utf8":      func(f *Fire) { f.Msg.Type = "\xff" },
		"unknown kind":      func(f *Fire) { f.Kind = 9 },
	}
	for name, mod := range cases {
		t.Run(name, func(t *testing.T) {
			f := valid()
			mod(&f)
			_, err := s.FireOnce(context.Background(), testFences, f)
			if !errors.Is(err, ErrInvalidFire) {
				t.Fatalf("err %v, want ErrInvalidFire", err)
			}
			if _, err := s.FireBatch(context.Background(), testFences, []Fire{valid(), f}); !errors.Is(err, ErrInvalidFire) {
				t.Fatalf("batch err %v, want ErrInvalidFire", err)
			}
		})
	}
	if n := rc.DBSize(context.Background()).Val(); n != 0 {
		t.Fatalf("invalid fires wrote %d keys", n)
	}
}

// TestFireCluster runs the fire, batch, outbox and handover scripts on a
// three-master Redis Cluster with queue names that need the hash tag.
func TestFireCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cc := testenv.StartRedisCluster(t).Client(t)
	s := New(cc)
	queues := []string{"critical", "a:b", "x{y"}
	for _, q := range queues {
		f := tickFire("cl", q, tickAt(1), time.Time{})
		f.UniqueTTL, f.DuplicateRecord = time.Hour, record("dup", "cl", tickAt(1))
		f.SkippedRecords = []Record{record("skipped", "cl", tickAt(0))}
		mustFire(t, s, f, StatusFired)
		g := tickFire("grp", q, tickAt(1), time.Time{})
		g.Msg.GroupKey = "g:1"
		mustFire(t, s, g, StatusFired)
		d := tickFire("later", q, tickAt(1), time.Time{})
		d.ProcessAt = time.Now().Add(time.Hour)
		mustFire(t, s, d, StatusFired)
		tr := tickFire("cl", q, tickAt(1), time.Time{})
		tr.Kind, tr.RequestID, tr.Msg.ID = FireTrigger, "r1", "trig-"+q
		tr.FiredRecord = Record{ID: "trigger/" + q, Data: []byte("{}")}
		mustFire(t, s, tr, StatusFired)
		mustFire(t, s, tr, StatusAlreadyExists)
	}
	var batch []Fire
	for _, q := range queues {
		for i := 2; i <= 5; i++ {
			f := tickFire("cl", q, tickAt(i), tickAt(i-1))
			f.OverlapSkip, f.OverlapRecord = true, record("overlap", "cl", tickAt(i))
			batch = append(batch, f)
		}
	}
	res, err := s.FireBatch(ctx, testFences, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Status != StatusSkippedOverlap { // tick 1's task is still pending
			t.Fatalf("batch fire %d: %s", i, r.Status)
		}
	}
	for _, q := range queues {
		if n, err := s.OutboxLen(ctx, testPrefix, q); err != nil || n != 9 {
			t.Fatalf("outbox %q length %d (%v), want 9", q, n, err)
		}
		ok, err := s.AcquireOutbox(ctx, testPrefix, q, "relay-1", time.Minute)
		if err != nil || !ok {
			t.Fatalf("acquire %q: %v %v", q, ok, err)
		}
		recs, err := s.ReadOutbox(ctx, testPrefix, q, "", 100)
		if err != nil || len(recs) != 9 {
			t.Fatalf("read %q: %d records, %v", q, len(recs), err)
		}
		if err := s.AckOutbox(ctx, testPrefix, q, "relay-1", time.Minute, recs[0].StreamID, recs[1].StreamID); err != nil {
			t.Fatal(err)
		}
		if n, _ := s.OutboxLen(ctx, testPrefix, q); n != 7 {
			t.Fatalf("outbox %q length %d after ack, want 7", q, n)
		}
		if err := s.ReleaseOutbox(ctx, testPrefix, q, "relay-1"); err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := s.CloseForHandover(ctx, testPrefix, q, "cl", 5, ""); err != nil {
			t.Fatal(err)
		}
		mustFire(t, s, tickFire("cl", q, tickAt(6), tickAt(5)), StatusMoved)
		if err := s.SeedWatermark(ctx, testPrefix, q, "cl", tickAt(5), "", 6, ""); err != nil {
			t.Fatal(err)
		}
		mustFire(t, s, tickFire("cl", q, tickAt(6), tickAt(5)), StatusFired)
	}
	// A queue name with an empty hash tag cannot be fired into on a cluster.
	bad := tickFire("cl", "}x", tickAt(1), time.Time{})
	if _, err := s.FireOnce(ctx, testFences, bad); !errors.Is(err, ErrInvalidFire) || !errors.Is(err, ErrInvalidQueue) {
		t.Fatalf("fire into %q: %v, want ErrInvalidFire and ErrInvalidQueue", bad.Queue, err)
	}
	oq, err := s.OutboxQueues(ctx, testPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Sort(oq); !slices.Equal(oq, []string{"a:b", "critical", "x{y"}) {
		t.Fatalf("outbox queues %v", oq)
	}
}

// TestFireBulkMultiRecord: a bulk call writes the fired records of the
// fires that fired as one multi-record named after the first of them, in
// order; a lone fired fire's record is a plain record, and a call that
// fires nothing writes none. Calls hold up to fireCallSizes.bulk fires.
func TestFireBulkMultiRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rc := newTestStore(t)
	// raw reads queue's outbox records as written: id and data.
	raw := func(queue string) []Record {
		t.Helper()
		recs, err := s.ReadOutbox(ctx, testPrefix, queue, "", 1000)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]Record, len(recs))
		for i, r := range recs {
			out[i] = Record{ID: r.EventID, Data: r.Data}
		}
		return out
	}
	multi := func(recs ...Record) Record {
		data := []byte(outbox.MultiRecordTag)
		for _, r := range recs {
			data = outbox.AppendFrame(data, r.ID, r.Data)
		}
		return Record{ID: outbox.MultiRecordID(recs[0].ID), Data: data}
	}
	fires := func(queue string, n int) []Fire {
		out := make([]Fire, n)
		for i := range out {
			out[i] = tickFire(fmt.Sprintf("%s-%d", queue, i), queue, tickAt(1), time.Time{})
		}
		return out
	}
	check := func(queue string, want ...Record) {
		t.Helper()
		got := raw(queue)
		if !slices.EqualFunc(got, want, func(a, b Record) bool { return a.ID == b.ID && string(a.Data) == string(b.Data) }) {
			t.Fatalf("outbox of %s:\n%q\nwant\n%q", queue, got, want)
		}
	}

	// All fire: one multi-record.
	all := fires("all", 5)
	if _, err := s.FireBatch(ctx, testFences, all); err != nil {
		t.Fatal(err)
	}
	check("all", multi(all[0].FiredRecord, all[1].FiredRecord, all[2].FiredRecord, all[3].FiredRecord, all[4].FiredRecord))

	// The first and the fourth refused (a watermark ahead, a task there):
	// the others' frames, named after the second.
	some := fires("some", 5)
	if err := rc.Set(ctx, Own(testPrefix, "some").Watermark(some[0].Entry), fmt.Sprint(tickAt(5).UnixMilli())+" x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.HSet(ctx, Keys("some").Task(some[3].Msg.ID), "state", "active").Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.FireBatch(ctx, testFences, some)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != StatusWatermarkMismatch || res[3].Status != StatusAlreadyExists || res[1].Status != StatusFired || res[4].Status != StatusFired {
		t.Fatalf("statuses %v %v %v %v %v", res[0].Status, res[1].Status, res[2].Status, res[3].Status, res[4].Status)
	}
	check("some", multi(some[1].FiredRecord, some[2].FiredRecord, some[4].FiredRecord))

	// Only one fires: its own record. None fires: nothing.
	one := fires("one", 3)
	for _, i := range []int{0, 2} {
		if err := rc.HSet(ctx, Keys("one").Task(one[i].Msg.ID), "state", "pending").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.FireBatch(ctx, testFences, one); err != nil {
		t.Fatal(err)
	}
	check("one", one[1].FiredRecord)
	if _, err := s.FireBatch(ctx, testFences, fires("one", 3)); err != nil {
		t.Fatal(err)
	}
	check("one", one[1].FiredRecord)

	// More than a bulk call holds: one record per call, in order.
	many := fires("many", fireCallSizes.bulk+3)
	if _, err := s.FireBatch(ctx, testFences, many); err != nil {
		t.Fatal(err)
	}
	var first, second []Record
	for i, f := range many {
		if i < fireCallSizes.bulk {
			first = append(first, f.FiredRecord)
		} else {
			second = append(second, f.FiredRecord)
		}
	}
	check("many", multi(first...), multi(second...))
}

// TestFireRefusedWholeWhenRedisFull: a Redis over its maxmemory
// (noeviction) refuses fires whole. Redis refuses a script's first write
// that adds data and lets a script that has written run to its end, and
// the fire script reads before it writes: each fire fails with Redis's OOM
// error and nothing of it is written (no task, watermark or record), so the
// same fires succeed once there is room, each exactly once.
func TestFireRefusedWholeWhenRedisFull(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rc := newTestStore(t)
	var fires []Fire
	for i := range 40 { // enough for the bulk path
		fires = append(fires, tickFire(fmt.Sprintf("e%d", i), "q1", tickAt(1), time.Time{}))
	}
	fires = append(fires, tickFire("alone", "q2", tickAt(1), time.Time{}))
	// Any memory in use is over one byte.
	if err := rc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.FireBatch(ctx, testFences, fires)
	if err == nil {
		for i, r := range res {
			if r.Err == nil || !strings.Contains(r.Err.Error(), "OOM") {
				t.Fatalf("fire %d with Redis full: %s, %v; want Redis's OOM error", i, r.Status, r.Err)
			}
		}
	} else if !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("fires with Redis full: %v; want Redis's OOM error", err)
	}
	if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for _, f := range fires {
		if _, _, ok, err := s.Watermark(ctx, testPrefix, f.Queue, f.Entry); err != nil || ok {
			t.Fatalf("%s: watermark written by a refused fire (%v)", f.Entry, err)
		}
		if n := rc.Exists(ctx, Keys(f.Queue).Task(taskIDFor(f.Entry, tickAt(1)))).Val(); n != 0 {
			t.Fatalf("%s: task written by a refused fire", f.Entry)
		}
	}
	for _, q := range []string{"q1", "q2"} {
		if ids := outboxIDs(t, s, q); len(ids) != 0 {
			t.Fatalf("%s: %d records written by refused fires", q, len(ids))
		}
	}
	res, err = s.FireBatch(ctx, testFences, fires)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Status != StatusFired {
			t.Fatalf("fire %d once Redis has room: %s, %v", i, r.Status, r.Err)
		}
	}
	if n1, n2 := len(outboxIDs(t, s, "q1")), len(outboxIDs(t, s, "q2")); n1 != 40 || n2 != 1 {
		t.Fatalf("outboxes hold %d and %d records, want 40 and 1", n1, n2)
	}
}
