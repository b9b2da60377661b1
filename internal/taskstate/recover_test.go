package taskstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/outbox"

	"github.com/cronstream/cronstream/internal/testenv"
)

// recPrefix is the tenant prefix of the recovery tests' outboxes.
const recPrefix = "rec"

// seedActive puts tasks into queue exactly as asynq's Dequeue leaves them
// (state active, no pending_since, id pushed at the head of the active list,
// lease entry) in the order given, so ids[0] ends at the list's tail.
func seedActive(t testing.TB, rc redis.UniversalClient, queue string, ids []string, lease time.Time, mutate func(*TaskMessage)) map[string][]byte {
	t.Helper()
	ctx := context.Background()
	k := Keys(queue)
	msgs := make(map[string][]byte, len(ids))
	if err := rc.SAdd(ctx, AllQueuesKey, queue).Err(); err != nil {
		t.Fatal(err)
	}
	for start := 0; start < len(ids); start += 1000 {
		pipe := rc.Pipeline()
		for _, id := range ids[start:min(start+1000, len(ids))] {
			m := &TaskMessage{Type: "work", Payload: []byte("payload-" + id), ID: id, Queue: queue, Retry: 25, Timeout: 1800,
				Headers: map[string]string{"h": "v"}}
			if mutate != nil {
				mutate(m)
			}
			b, err := EncodeTaskMessage(m)
			if err != nil {
				t.Fatal(err)
			}
			msgs[id] = b
			pipe.HSet(ctx, k.Task(id), "msg", b, "state", StateActive)
			pipe.LPush(ctx, k.Active(), id)
			pipe.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(lease.Unix()), Member: id})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("seed active tasks: %v", err)
		}
	}
	return msgs
}

// retryAll turns lease-expired tasks into asynq's recoverer decisions
// (archive at max retry, else retry at retryAt), each with one record.
func retryAll(t testing.TB, tasks []LeaseExpired, retryAt, now time.Time) []Decision {
	t.Helper()
	ds := make([]Decision, 0, len(tasks))
	for _, le := range tasks {
		var (
			d   Decision
			err error
		)
		if le.Msg.Retried >= le.Msg.Retry {
			d, err = le.Archive(ErrLeaseExpiredText, now)
		} else {
			d, err = le.Retry(retryAt, ErrLeaseExpiredText, true, now)
		}
		if err != nil {
			t.Fatal(err)
		}
		d.Record = Record{ID: "recovered:" + le.Msg.ID, Data: []byte(`{"id":"recovered:` + le.Msg.ID + `","task_id":"` + le.Msg.ID + `"}`)}
		ds = append(ds, d)
	}
	return ds
}

// outboxEventIDs are the ids of the events in queue's outbox, in order: a
// batch record's events (checked to be under events.BatchID) one by one.
func outboxEventIDs(t testing.TB, rc redis.UniversalClient, queue string) []string {
	t.Helper()
	msgs, err := rc.XRange(context.Background(), Own(recPrefix, queue).Outbox(), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range msgs {
		id, _ := m.Values["id"].(string)
		data, _ := m.Values["data"].(string)
		batch, ok := outbox.BatchEvents([]byte(data))
		if !ok {
			ids = append(ids, id)
			continue
		}
		var evs []struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(batch, &evs); err != nil || len(evs) < 2 {
			t.Fatalf("outbox batch record %s: %d events, %v", m.ID, len(evs), err)
		}
		if want := contract.BatchID(len(evs), evs[0].ID); id != want {
			t.Fatalf("outbox batch record %s: id %q, want %q", m.ID, id, want)
		}
		for _, ev := range evs {
			ids = append(ids, ev.ID)
		}
	}
	return ids
}

// TestRecoverKilledWorker: a real asynq worker takes tasks and is killed
// with SIGKILL. We recover one queue; asynq's own recoverer recovers an
// identical twin queue. Both must end in the same state with the same
// counters, and a second real asynq server then completes our task.
func TestRecoverKilledWorker(t *testing.T) {
	// Not parallel: it checks that the asynq server leaves no goroutine
	// behind, which other tests' goroutines would cloud.
	ctx := context.Background()
	r := testenv.StartRedis(t, testenv.WithPrivateServer())
	rc := r.Client(t)
	s := New(rc)
	client := testenv.AsynqClient(t, rc)
	insp := asynq.NewInspectorFromRedisClient(rc)

	const mine, twin = "mine", "twin"
	for _, q := range []string{mine, twin} {
		for _, opt := range []asynq.Option{asynq.MaxRetry(3), asynq.MaxRetry(0)} {
			if _, err := client.Enqueue(asynq.NewTaskWithHeaders("crash", []byte("p"), map[string]string{"k": "v"}),
				asynq.Queue(q), opt); err != nil {
				t.Fatal(err)
			}
		}
	}
	kill := testenv.StartAsynqChild(t, testenv.AsynqWorker, r.Addr, mine, twin)
	testenv.Eventually(t, 20*time.Second, func() bool {
		a, _ := rc.LLen(ctx, Keys(mine).Active()).Result()
		b, _ := rc.LLen(ctx, Keys(twin).Active()).Result()
		return a == 2 && b == 2
	}, "child worker takes all four tasks")
	kill()

	// asynq's lease is a fixed 30 s; put it in the past instead of waiting.
	past := time.Now().Add(-time.Minute)
	for _, q := range []string{mine, twin} {
		ids, _ := rc.ZRange(ctx, Keys(q).Lease(), 0, -1).Result()
		for _, id := range ids {
			rc.ZAddXX(ctx, Keys(q).Lease(), redis.Z{Score: float64(past.Unix()), Member: id})
		}
	}

	now := time.Now()
	tasks, bad, err := s.ListLeaseExpired(ctx, mine, now.Add(-20*time.Second), 100)
	if err != nil || len(bad) != 0 || len(tasks) != 2 {
		t.Fatalf("list: %d tasks, bad %v, err %v", len(tasks), bad, err)
	}
	outcomes, err := s.RecoverBatch(ctx, recPrefix, mine, now.Add(-20*time.Second), retryAll(t, tasks, now.Add(time.Hour), now))
	if err != nil {
		t.Fatal(err)
	}
	statuses := map[RecoverStatus]int{}
	for _, o := range outcomes {
		statuses[o.Status]++
	}
	if statuses[RecoverRetried] != 1 || statuses[RecoverArchived] != 1 {
		t.Fatalf("outcomes %+v", outcomes)
	}
	if got := outboxEventIDs(t, rc, mine); len(got) != 2 {
		t.Fatalf("outbox records %v, want 2", got)
	}

	// asynq's own recoverer runs once at server start.
	testenv.RecoverWithAsynq(t, rc, twin, 10*time.Second)

	compare := func(q string) (map[string]string, *asynq.QueueInfo) {
		qi, err := insp.GetQueueInfo(q)
		if err != nil {
			t.Fatal(err)
		}
		states := map[string]string{}
		retry, err := insp.ListRetryTasks(q)
		if err != nil {
			t.Fatal(err)
		}
		archived, err := insp.ListArchivedTasks(q)
		if err != nil {
			t.Fatal(err)
		}
		for _, list := range [][]*asynq.TaskInfo{retry, archived} {
			for _, ti := range list {
				if time.Since(ti.LastFailedAt) > time.Minute {
					t.Errorf("queue %s task %s: last_failed_at %v", q, ti.ID, ti.LastFailedAt)
				}
				states[fmt.Sprintf("max=%d", ti.MaxRetry)] = fmt.Sprintf("%s retried=%d err=%q headers=%v",
					ti.State, ti.Retried, ti.LastErr, ti.Headers)
			}
		}
		return states, qi
	}
	ourStates, ourQI := compare(mine)
	theirStates, theirQI := compare(twin)
	if fmt.Sprint(ourStates) != fmt.Sprint(theirStates) {
		t.Fatalf("task states differ\nours  %v\nasynq %v", ourStates, theirStates)
	}
	if want := "retry retried=1 err=\"asynq: task lease expired\" headers=map[k:v]"; ourStates["max=3"] != want {
		t.Fatalf("retried task: %s, want %s", ourStates["max=3"], want)
	}
	for _, c := range []struct {
		name        string
		ours, asynq int
	}{
		{"Processed", ourQI.Processed, theirQI.Processed}, {"Failed", ourQI.Failed, theirQI.Failed},
		{"ProcessedTotal", ourQI.ProcessedTotal, theirQI.ProcessedTotal}, {"FailedTotal", ourQI.FailedTotal, theirQI.FailedTotal},
		{"Retry", ourQI.Retry, theirQI.Retry}, {"Archived", ourQI.Archived, theirQI.Archived}, {"Active", ourQI.Active, theirQI.Active},
	} {
		if c.ours != c.asynq {
			t.Errorf("%s: ours %d, asynq %d", c.name, c.ours, c.asynq)
		}
	}
	if ourQI.ProcessedTotal != 2 || ourQI.FailedTotal != 2 {
		t.Fatalf("counters %+v", ourQI)
	}
	for _, q := range []string{mine, twin} {
		ttl, _ := rc.TTL(ctx, Keys(q).Processed(now)).Result()
		if ttl < 89*24*time.Hour {
			t.Errorf("queue %s: daily processed key TTL %v", q, ttl)
		}
	}

	// A second real asynq server completes the retried task.
	if _, err := rc.ZAdd(ctx, Keys(mine).Retry(), redis.Z{Score: float64(now.Unix() - 1), Member: retriedID(t, insp, mine)}).Result(); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	startAsynqServer(t, rc, asynq.Config{Queues: map[string]int{mine: 1}}, asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		if task.Headers()["k"] != "v" {
			return fmt.Errorf("headers %v", task.Headers())
		}
		id, _ := asynq.GetTaskID(ctx)
		done <- id
		return nil
	}))
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("second asynq server did not process the recovered task")
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		qi, err := insp.GetQueueInfo(mine)
		return err == nil && qi.ProcessedTotal == 3 && qi.FailedTotal == 2 && qi.Retry == 0
	}, "task completed and counted")
}

func retriedID(t *testing.T, insp *asynq.Inspector, q string) string {
	t.Helper()
	list, err := insp.ListRetryTasks(q)
	if err != nil || len(list) != 1 {
		t.Fatalf("retry tasks %v %v", list, err)
	}
	return list[0].ID
}

// TestRecoverPreservesListAndOrder recovers a realistic active list: many
// expired tasks with tied lease scores interleaved with live ones. Only the
// expired ones leave the active list; every live one stays, once.
func TestRecoverPreservesListAndOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc, WithRecoverChunk(100))
	const q = "big"
	now := time.Now()
	expired := testenv.UnsortedTaskIDs("dead", 3000)
	live := testenv.UnsortedTaskIDs("live", 1000)
	// Dequeue order: live tasks scattered between the dead ones.
	var order []string
	for i, id := range expired {
		order = append(order, id)
		if i%3 == 0 {
			order = append(order, live[i/3])
		}
	}
	seedActive(t, rc, q, order, now.Add(-time.Minute), nil)
	for _, id := range live {
		rc.ZAdd(ctx, Keys(q).Lease(), redis.Z{Score: float64(now.Add(30 * time.Second).Unix()), Member: id})
	}
	before, _ := rc.LRange(ctx, Keys(q).Active(), 0, -1).Result()

	cutoff := now.Add(-20 * time.Second)
	var all []LeaseExpired
	for {
		tasks, bad, err := s.ListLeaseExpired(ctx, q, cutoff, 1200)
		if err != nil || len(bad) > 0 {
			t.Fatalf("list: %v %v", err, bad)
		}
		if len(tasks) == 0 {
			break
		}
		all = append(all, tasks...)
		if len(all) == len(tasks) {
			// The first batch finds the script cache empty (a restarted
			// server): its pipelined chunks are refused and run again.
			if err := rc.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		out, err := s.RecoverBatch(ctx, recPrefix, q, cutoff, retryAll(t, tasks, now.Add(time.Hour), now))
		if err != nil {
			t.Fatal(err)
		}
		requireRetried(t, out)
		for _, o := range out {
			if o.Searched {
				t.Fatalf("task %s searched for with the list unchanged since its position was read", o.TaskID)
			}
		}
	}
	if len(all) != len(expired) {
		t.Fatalf("recovered %d, want %d", len(all), len(expired))
	}
	after, _ := rc.LRange(ctx, Keys(q).Active(), 0, -1).Result()
	var wantAfter []string
	for _, id := range before {
		if strings.HasPrefix(id, "live") {
			wantAfter = append(wantAfter, id)
		}
	}
	// Live tasks that sat between the dead ones are put back at the head
	// (recover.lua): the order is not kept, the tasks are, once each.
	slices.Sort(after)
	slices.Sort(wantAfter)
	if !slices.Equal(after, wantAfter) {
		t.Fatalf("active list after recovery: %d ids, want the %d live ones, once each", len(after), len(wantAfter))
	}
	if n, _ := rc.ZCard(ctx, Keys(q).Retry()).Result(); n != int64(len(expired)) {
		t.Fatalf("retry set has %d", n)
	}
	if n, _ := rc.ZCard(ctx, Keys(q).Lease()).Result(); n != int64(len(live)) {
		t.Fatalf("lease set has %d", n)
	}
	if n := len(outboxEventIDs(t, rc, q)); n != len(expired) {
		t.Fatalf("outbox has %d records", n)
	}
	if got, _ := rc.Get(ctx, Keys(q).ProcessedTotal()).Int(); got != len(expired) {
		t.Fatalf("processed total %d", got)
	}
}

// TestRecoverWithWrongPositions feeds the chunk runner positions that are
// all wrong (stale, out of range, pointing at other tasks): every task must
// still be found (LPOS fallback) and exactly the right ids removed.
func TestRecoverWithWrongPositions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc, WithRecoverChunk(7))
	const q = "stale"
	now := time.Now()
	ids := testenv.UnsortedTaskIDs("t", 60)
	seedActive(t, rc, q, ids, now.Add(-time.Minute), nil)
	// Keep every third task alive.
	for i, id := range ids {
		if i%3 == 0 {
			rc.ZAdd(ctx, Keys(q).Lease(), redis.Z{Score: float64(now.Add(time.Minute).Unix()), Member: id})
		}
	}
	tasks, _, err := s.ListLeaseExpired(ctx, q, now, 100)
	if err != nil || len(tasks) != 40 {
		t.Fatalf("list: %d %v", len(tasks), err)
	}
	ds := retryAll(t, tasks, now, now)
	depth := map[string]int{}
	for i, d := range ds {
		depth[d.TaskID] = []int{1, 2, 59, 60, 61, 1000}[i%6]
	}
	outcomes := make([]Outcome, len(ds))
	if err := s.recoverInListOrder(ctx, recPrefix, q, now, ds, depth, outcomes); err != nil {
		t.Fatal(err)
	}
	requireRetried(t, outcomes)
	searched := 0
	for _, o := range outcomes {
		if o.Searched {
			searched++
		}
	}
	// A wrong position may by chance name the task's own place.
	if searched < len(outcomes)/2 {
		t.Errorf("%d of %d tasks with wrong positions marked as searched for", searched, len(outcomes))
	}
	active, _ := rc.LRange(ctx, Keys(q).Active(), 0, -1).Result()
	var want []string
	for i := len(ids) - 1; i >= 0; i-- {
		if i%3 == 0 {
			want = append(want, ids[i])
		}
	}
	if !slices.Equal(active, want) {
		t.Fatalf("active list %v\nwant %v", active, want)
	}
}

// TestRecoverRechecks: between scan and move, one task's lease is extended,
// one's message changes (asynq retried and re-ran it), one finishes, and one
// is recovered by somebody else; those are left alone, the rest move.
func TestRecoverRechecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc)
	const q = "recheck"
	k := Keys(q)
	now := time.Now()
	ids := []string{"extended", "changed", "finished", "stolen", "state", "plain"}
	msgs := seedActive(t, rc, q, ids, now.Add(-time.Minute), nil)
	cutoff := now.Add(-20 * time.Second)
	tasks, _, err := s.ListLeaseExpired(ctx, q, cutoff, 10)
	if err != nil || len(tasks) != len(ids) {
		t.Fatalf("list %d %v", len(tasks), err)
	}

	// A worker's heartbeat extends the lease (asynq's ExtendLease: ZADD XX).
	rc.ZAddXX(ctx, k.Lease(), redis.Z{Score: float64(now.Add(30 * time.Second).Unix()), Member: "extended"})
	// asynq retried the task, re-ran it, and the new worker died too.
	changed, _ := DecodeTaskMessage(msgs["changed"])
	changed.Retried, changed.ErrorMsg = 1, "boom"
	b, _ := EncodeTaskMessage(changed)
	rc.HSet(ctx, k.Task("changed"), "msg", b)
	// The worker finished it (asynq's Done).
	rc.LRem(ctx, k.Active(), 0, "finished")
	rc.ZRem(ctx, k.Lease(), "finished")
	rc.Del(ctx, k.Task("finished"))
	// Another recoverer moved it.
	rc.LRem(ctx, k.Active(), 0, "stolen")
	rc.ZRem(ctx, k.Lease(), "stolen")
	rc.ZAdd(ctx, k.Retry(), redis.Z{Score: 1, Member: "stolen"})
	rc.HSet(ctx, k.Task("stolen"), "state", StateRetry)
	// Inconsistent: in lease but state not active.
	rc.HSet(ctx, k.Task("state"), "state", StatePending)

	out, err := s.RecoverBatch(ctx, recPrefix, q, cutoff, retryAll(t, tasks, now.Add(time.Hour), now))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]RecoverStatus{
		"extended": RecoverSkippedLeaseExtended, "changed": RecoverSkippedMessageChanged,
		"finished": RecoverSkippedGone, "stolen": RecoverSkippedGone, "state": RecoverSkippedNotActive,
		"plain": RecoverRetried,
	}
	for _, o := range out {
		if o.Status != want[o.TaskID] {
			t.Errorf("%s: %s, want %s", o.TaskID, o.Status, want[o.TaskID])
		}
	}
	if got := outboxEventIDs(t, rc, q); !slices.Equal(got, []string{"recovered:plain"}) {
		t.Fatalf("outbox %v", got)
	}
	for _, id := range []string{"extended", "changed"} {
		if st, _ := rc.HGet(ctx, k.Task(id), "state").Result(); st != StateActive {
			t.Errorf("%s: state %s", id, st)
		}
		if pos, err := rc.LPos(ctx, k.Active(), id, redis.LPosArgs{}).Result(); err != nil {
			t.Errorf("%s: not in active list (%d, %v)", id, pos, err)
		}
	}
	if got, _ := rc.HGet(ctx, k.Task("changed"), "msg").Result(); got != string(b) {
		t.Error("changed task's message overwritten")
	}
	if sc, _ := rc.ZScore(ctx, k.Lease(), "extended").Result(); int64(sc) != now.Add(30*time.Second).Unix() {
		t.Errorf("extended lease now %v", sc)
	}
}

// TestRecoverBadMessages: undecodable, missing and mismatched messages in the
// lease set are reported and skipped; the others in the same batch recover.
func TestRecoverBadMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc)
	const q = "bad"
	k := Keys(q)
	now := time.Now()
	seedActive(t, rc, q, []string{"good1", "garbage", "utf8", "nomsg", "otherq", "good2"}, now.Add(-time.Minute), nil)
	rc.HSet(ctx, k.Task("garbage"), "msg", []byte{0x0a, 0x05, 'x'})
	rc.HSet(ctx, k.Task("utf8"), "msg", []byte{0x0a, 0x02, 0xff, 0xfe})
	rc.HDel(ctx, k.Task("nomsg"), "msg")
	wrong, _ := EncodeTaskMessage(&TaskMessage{Type: "x", ID: "otherq", Queue: "elsewhere"})
	rc.HSet(ctx, k.Task("otherq"), "msg", wrong)

	tasks, bad, err := s.ListLeaseExpired(ctx, q, now, 100)
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]error{}
	for _, b := range bad {
		reasons[b.ID] = b.Err
	}
	for id, want := range map[string]error{"garbage": ErrMalformed, "utf8": ErrMalformed, "nomsg": ErrNoMessage, "otherq": ErrMismatch} {
		if !errors.Is(reasons[id], want) {
			t.Errorf("%s: %v, want %v", id, reasons[id], want)
		}
	}
	if len(tasks) != 2 {
		t.Fatalf("tasks %d", len(tasks))
	}
	out, err := s.RecoverBatch(ctx, recPrefix, q, now, retryAll(t, tasks, now, now))
	if err != nil || out[0].Status != RecoverRetried || out[1].Status != RecoverRetried {
		t.Fatalf("%+v %v", out, err)
	}
	// Paging past the bad ones: with offset the caller sees nothing more.
	tasks, bad, err = s.ListLeaseExpiredFrom(ctx, q, now, len(bad), 100)
	if err != nil || len(tasks)+len(bad) != 0 {
		t.Fatalf("after offset: %d %d %v", len(tasks), len(bad), err)
	}
}

// TestRecoverConcurrent: recoverers race on the same tasks; each task moves
// once and has exactly one outbox record.
func TestRecoverConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	const q, n, racers = "race", 3000, 3
	now := time.Now()
	seedActive(t, rc, q, testenv.UnsortedTaskIDs("r", n), now.Add(-time.Minute), nil)
	cutoff := now.Add(-20 * time.Second)

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		moved = map[string]int{}
		errs  = make(chan error, racers)
	)
	for r := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := New(rc, WithRecoverChunk(50+r*37))
			for {
				tasks, _, err := s.ListLeaseExpired(ctx, q, cutoff, 700)
				if err != nil {
					errs <- err
					return
				}
				if len(tasks) == 0 {
					return
				}
				out, err := s.RecoverBatch(ctx, recPrefix, q, cutoff, retryAll(t, tasks, now, now))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, o := range out {
					if o.Status.Moved() {
						moved[o.TaskID]++
					} else if o.Status != RecoverSkippedGone {
						errs <- fmt.Errorf("unexpected outcome %+v", o)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(moved) != n {
		t.Fatalf("%d tasks moved, want %d", len(moved), n)
	}
	for id, c := range moved {
		if c != 1 {
			t.Fatalf("task %s moved %d times", id, c)
		}
	}
	events := outboxEventIDs(t, rc, q)
	if len(events) != n {
		t.Fatalf("%d outbox records, want %d", len(events), n)
	}
	if got, _ := rc.Get(ctx, Keys(q).FailedTotal()).Int(); got != n {
		t.Fatalf("failed total %d", got)
	}
	if l, _ := rc.LLen(ctx, Keys(q).Active()).Result(); l != 0 {
		t.Fatalf("active list still has %d", l)
	}
}

// TestRecoverArchiveTrim: archiving trims the archive as asynq does (90
// days, 9,999 newest) and deletes the trimmed hashes, in bounded calls.
func TestRecoverArchiveTrim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	now := time.Now()
	s := New(rc, WithClock(func() time.Time { return now }))
	s.trimBudget = 200 // force several trim calls
	const q = "arch"
	k := Keys(q)
	// 10,600 archived tasks: 300 older than 90 days, the rest recent.
	const total = 10600
	for start := 0; start < total; start += 1000 {
		pipe := rc.Pipeline()
		for i := start; i < min(start+1000, total); i++ {
			id := fmt.Sprintf("old-%05d", i)
			score := now.Add(-time.Hour).Unix() - int64(total-i)
			if i < 300 {
				score = now.AddDate(0, 0, -91).Unix() - int64(i)
			}
			pipe.ZAdd(ctx, k.Archived(), redis.Z{Score: float64(score), Member: id})
			pipe.HSet(ctx, k.Task(id), "msg", "x", "state", StateArchived)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	seedActive(t, rc, q, []string{"final"}, now.Add(-time.Minute), func(m *TaskMessage) { m.Retry, m.Retried = 2, 2 })
	tasks, _, err := s.ListLeaseExpired(ctx, q, now, 10)
	if err != nil || len(tasks) != 1 {
		t.Fatal(err)
	}
	out, err := s.RecoverBatch(ctx, recPrefix, q, now, retryAll(t, tasks, now, now))
	if err != nil || out[0].Status != RecoverArchived {
		t.Fatalf("%+v %v", out, err)
	}
	if n, _ := rc.ZCard(ctx, k.Archived()).Result(); n != archiveMaxSize-1 {
		t.Fatalf("archive size %d, want %d", n, archiveMaxSize-1)
	}
	if sc, err := rc.ZScore(ctx, k.Archived(), "final").Result(); err != nil || int64(sc) != now.Unix() {
		t.Fatalf("final task score %v %v", sc, err)
	}
	// 300 aged out, then the 10,301-9,999 = 302 oldest recent ones
	// (old-00300 … old-00601) trimmed by size; their hashes are gone.
	for _, id := range []string{"old-00000", "old-00299", "old-00300", "old-00601"} {
		if n, _ := rc.Exists(ctx, k.Task(id)).Result(); n != 0 {
			t.Errorf("trimmed task %s still has a hash", id)
		}
	}
	if n, _ := rc.Exists(ctx, k.Task("old-00602")).Result(); n != 1 {
		t.Error("kept task lost its hash")
	}
	if n, _ := rc.ZCard(ctx, k.Archived()).Result(); n != archiveMaxSize-1 {
		t.Fatalf("archive size %d", n)
	}
	if keys, _ := rc.Keys(ctx, k.TaskPrefix()+"old-*").Result(); len(keys) != archiveMaxSize-2 {
		t.Fatalf("%d archived hashes left, want %d", len(keys), archiveMaxSize-2)
	}
	m, _ := DecodeTaskMessage([]byte(rc.HGet(ctx, k.Task("final"), "msg").Val()))
	if m.Retried != 2 || m.ErrorMsg != ErrLeaseExpiredText || m.LastFailedAt != now.Unix() {
		t.Fatalf("archived msg %+v", m)
	}
}

// TestRecoverCountersNearMaxInt: totals wrap to 1 at MaxInt64 as asynq's
// do, instead of failing the script.
func TestRecoverCountersNearMaxInt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc)
	const q = "max"
	k := Keys(q)
	now := time.Now()
	rc.Set(ctx, k.ProcessedTotal(), strconv.FormatInt(math.MaxInt64, 10), 0)
	rc.Set(ctx, k.FailedTotal(), "7", 0)
	seedActive(t, rc, q, []string{"a", "b"}, now.Add(-time.Minute), nil)
	tasks, _, _ := s.ListLeaseExpired(ctx, q, now, 10)
	if _, err := s.RecoverBatch(ctx, recPrefix, q, now, retryAll(t, tasks, now, now)); err != nil {
		t.Fatal(err)
	}
	p, _ := rc.Get(ctx, k.ProcessedTotal()).Int64()
	f, _ := rc.Get(ctx, k.FailedTotal()).Int64()
	if p != 2 || f != 2 {
		t.Fatalf("totals processed %d failed %d, want 2 2", p, f)
	}
}

// TestRecoverNotFailure: a retry with isFailure false moves no counter and
// does not increment retried, as asynq.
func TestRecoverNotFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc)
	const q = "nofail"
	now := time.Now()
	seedActive(t, rc, q, []string{"a"}, now.Add(-time.Minute), nil)
	tasks, _, _ := s.ListLeaseExpired(ctx, q, now, 10)
	d, err := tasks[0].Retry(now.Add(time.Minute), ErrLeaseExpiredText, false, now)
	if err != nil {
		t.Fatal(err)
	}
	d.Record = Record{ID: "e", Data: []byte("d")}
	if out, err := s.RecoverBatch(ctx, recPrefix, q, now, []Decision{d}); err != nil || out[0].Status != RecoverRetried {
		t.Fatalf("%+v %v", out, err)
	}
	if n, _ := rc.Exists(ctx, Keys(q).ProcessedTotal(), Keys(q).Processed(now)).Result(); n != 0 {
		t.Fatal("counters moved")
	}
	m, _ := DecodeTaskMessage([]byte(rc.HGet(ctx, Keys(q).Task("a"), "msg").Val()))
	if m.Retried != 0 || m.LastFailedAt != now.Unix() {
		t.Fatalf("msg %+v", m)
	}
	if _, err := s.RecoverBatch(ctx, recPrefix, q, now, []Decision{{TaskID: "a"}}); !errors.Is(err, ErrInvalidDecision) {
		t.Fatalf("invalid decision: %v", err)
	}
}

// TestRecoverOrphans: an active task without a lease gets one at now+30 s;
// strays are dropped from the active list; leased tasks are untouched.
func TestRecoverOrphans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc)
	const q = "orph"
	k := Keys(q)
	now := time.Now()
	seedActive(t, rc, q, []string{"ok1", "orphan", "nohash", "pending", "stub", "ok2"}, now.Add(time.Minute), nil)
	rc.ZRem(ctx, k.Lease(), "orphan", "nohash", "pending", "stub")
	rc.Del(ctx, k.Task("nohash"))
	rc.HSet(ctx, k.Task("pending"), "state", StatePending)
	rc.HDel(ctx, k.Task("stub"), "msg")
	// Many leased tasks so that the walk takes several pages.
	filler := testenv.UnsortedTaskIDs("f", 250)
	seedActive(t, rc, q, filler, now.Add(time.Minute), nil)

	rep, err := s.RecoverOrphans(ctx, q, now, 0, 64)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(rep.Removed)
	if rep.Examined != 256 || !slices.Equal(rep.Leased, []string{"orphan"}) || !slices.Equal(rep.Removed, []string{"nohash", "pending", "stub"}) {
		t.Fatalf("report %+v", rep)
	}
	if sc, _ := rc.ZScore(ctx, k.Lease(), "orphan").Result(); int64(sc) < now.Add(30*time.Second).Unix() {
		t.Fatalf("orphan lease %v is before now+30s", sc)
	}
	active, _ := rc.LRange(ctx, k.Active(), 0, -1).Result()
	if len(active) != 253 || active[len(active)-1] != "ok1" || active[len(active)-3] != "ok2" {
		t.Fatalf("active list has %d, tail %v", len(active), active[len(active)-3:])
	}
	// A second walk finds nothing.
	rep, err = s.RecoverOrphans(ctx, q, now, 0, 64)
	if err != nil || len(rep.Leased)+len(rep.Removed) != 0 {
		t.Fatalf("second walk %+v %v", rep, err)
	}
}

// seedAggregationSet makes a stale aggregation set the way asynq's
// AggregationCheck does: tasks added to a group with asynq's client, moved
// into a set, the group dropped from groups (it emptied), deadline passed.
func seedAggregationSet(t *testing.T, rc redis.UniversalClient, q, group string, n int) string {
	t.Helper()
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(rc)
	defer client.Close()
	for i := range n {
		if _, err := client.Enqueue(asynq.NewTask("agg", []byte{byte(i)}), asynq.Queue(q), asynq.Group(group)); err != nil {
			t.Fatal(err)
		}
	}
	k := Keys(q)
	set := k.AggregationSet(group, "8d5f3b8e-0000-4000-8000-000000000001")
	members, _ := rc.ZRangeWithScores(ctx, k.Group(group), 0, -1).Result()
	rc.ZAdd(ctx, set, members...)
	rc.Del(ctx, k.Group(group))
	rc.SRem(ctx, k.Groups(), group)
	rc.ZAdd(ctx, k.AggregationSets(), redis.Z{Score: float64(time.Now().Add(-time.Second).Unix()), Member: set})
	return set
}

// TestReclaimStaleAggregationSets: the set goes back to its group, the group
// is listed again, one record is written even with racing reclaimers, and a
// real asynq aggregator then aggregates the group.
func TestReclaimStaleAggregationSets(t *testing.T) {
	// Not parallel: it checks that the asynq server leaves no goroutine
	// behind, which other tests' goroutines would cloud.
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	const q, group = "aggq", "grp:with:colons"
	k := Keys(q)
	set := seedAggregationSet(t, rc, q, group, 3)
	now := time.Now()

	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		got []Reclaimed
	)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := New(rc).ReclaimStaleAggregationSets(ctx, recPrefix, q, now, func(s StaleAggregationSet) (Record, error) {
				return Record{ID: "reclaimed:" + s.SetID, Data: []byte(fmt.Sprintf(`{"group":%q,"tasks":%d}`, s.Group, len(s.TaskIDs)))}, nil
			})
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			got = append(got, r...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(got) != 1 || got[0].Group != group || got[0].Tasks != 3 || got[0].Key != set || len(got[0].TaskIDs) != 3 {
		t.Fatalf("reclaimed %+v", got)
	}
	if ev := outboxEventIDs(t, rc, q); !slices.Equal(ev, []string{"reclaimed:8d5f3b8e-0000-4000-8000-000000000001"}) {
		t.Fatalf("outbox %v", ev)
	}
	testenv.CheckReclaimed(t, rc, testenv.ReclaimedSet{GroupKey: k.Group(group), GroupsKey: k.Groups(), Group: group,
		SetKey: set, SetsKey: k.AggregationSets(), Tasks: 3})

	// A real asynq aggregator finds the group again and aggregates it.
	verifyNoLeaks(t)
	if n := testenv.AggregateWithAsynq(t, rc, q, 20*time.Second); n != 3 {
		t.Fatalf("aggregated %d tasks", n)
	}
}

// TestReclaimDanglingAndForeign: a listed set whose key is gone is just
// unlisted; a set key of another shape is reported and left alone.
func TestReclaimDanglingAndForeign(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc)
	const q = "dangle"
	k := Keys(q)
	past := float64(time.Now().Add(-time.Minute).Unix())
	rc.ZAdd(ctx, k.AggregationSets(), redis.Z{Score: past, Member: k.AggregationSet("g", "gone")},
		redis.Z{Score: past, Member: "foreign-key"})
	r, err := s.ReclaimStaleAggregationSets(ctx, recPrefix, q, time.Now(), func(StaleAggregationSet) (Record, error) {
		t.Error("no record for a dangling set")
		return Record{}, nil
	})
	if len(r) != 0 || err == nil || !strings.Contains(err.Error(), "foreign-key") {
		t.Fatalf("%+v %v", r, err)
	}
	if m, _ := rc.ZRange(ctx, k.AggregationSets(), 0, -1).Result(); !slices.Equal(m, []string{"foreign-key"}) {
		t.Fatalf("aggregation sets %v", m)
	}
}

// TestRecoverCluster runs every recovery script on a three-master Redis
// Cluster with queue names that need the hash tag.
func TestRecoverCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedisCluster(t).Client(t)
	s := New(rc)
	now := time.Now()
	for _, q := range []string{"critical", "a:b", "x{y", "x}y", "{q}"} {
		t.Run(q, func(t *testing.T) {
			ids := testenv.UnsortedTaskIDs("c", 3000)
			seedActive(t, rc, q, ids, now.Add(-time.Minute), func(m *TaskMessage) {
				if m.ID == ids[0] {
					m.Retried = m.Retry
				}
			})
			tasks, bad, err := s.ListLeaseExpired(ctx, q, now, 5000)
			if err != nil || len(bad) != 0 || len(tasks) != len(ids) {
				t.Fatalf("list %d %v %v", len(tasks), bad, err)
			}
			out, err := s.RecoverBatch(ctx, recPrefix, q, now, retryAll(t, tasks, now, now))
			if err != nil {
				t.Fatal(err)
			}
			archived := 0
			for _, o := range out {
				if !o.Status.Moved() {
					t.Fatalf("outcome %+v", o)
				}
				if o.Status == RecoverArchived {
					archived++
				}
			}
			if archived != 1 {
				t.Fatalf("%d archived", archived)
			}
			seedActive(t, rc, q, []string{"orphan"}, now, nil)
			rc.ZRem(ctx, Keys(q).Lease(), "orphan")
			if rep, err := s.RecoverOrphans(ctx, q, now, 0, 0); err != nil || len(rep.Leased) != 1 {
				t.Fatalf("orphans %+v %v", rep, err)
			}
			set := Keys(q).AggregationSet("g", "s1")
			rc.ZAdd(ctx, set, redis.Z{Score: 1, Member: "m"})
			rc.ZAdd(ctx, Keys(q).AggregationSets(), redis.Z{Score: 1, Member: set})
			r, err := s.ReclaimStaleAggregationSets(ctx, recPrefix, q, now, func(StaleAggregationSet) (Record, error) {
				return Record{ID: "x", Data: []byte("y")}, nil
			})
			if err != nil || len(r) != 1 {
				t.Fatalf("reclaim %+v %v", r, err)
			}
			if n := len(outboxEventIDs(t, rc, q)); n != len(ids)+1 {
				t.Fatalf("outbox %d", n)
			}
		})
	}
	if err := New(rc).CheckQueue("}bad"); !errors.Is(err, ErrInvalidQueue) {
		t.Fatalf("queue starting with '}' on a cluster: %v", err)
	}
}

// TestRecoverWhileWorkersRun recovers a large batch (positions read from the
// list) while live workers keep dequeuing at the head and finishing tasks
// anywhere in the list, which makes some positions stale. Every expired task
// must move exactly once and every live task must stay.
func TestRecoverWhileWorkersRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc, WithRecoverChunk(40))
	const q = "busy"
	k := Keys(q)
	now := time.Now()
	expired := testenv.UnsortedTaskIDs("dead", 3000)
	oldLive := testenv.UnsortedTaskIDs("old", 600)
	var order []string
	for i, id := range expired {
		order = append(order, id)
		if i%5 == 0 {
			order = append(order, oldLive[i/5])
		}
	}
	seedActive(t, rc, q, order, now.Add(-time.Minute), nil)
	for _, id := range oldLive {
		rc.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(now.Add(time.Minute).Unix()), Member: id})
	}
	cutoff := now.Add(-20 * time.Second)
	tasks, _, err := s.ListLeaseExpired(ctx, q, cutoff, 5000)
	if err != nil || len(tasks) != len(expired) {
		t.Fatalf("list %d %v", len(tasks), err)
	}
	ds := retryAll(t, tasks, now, now)

	stop := make(chan struct{})
	workerDone := make(chan error, 1)
	newLive := testenv.UnsortedTaskIDs("new", 2000)
	go func() {
		// A worker pool: dequeue new tasks at the head and finish (Done)
		// old live tasks, which sit between the expired ones.
		var err error
		defer func() { workerDone <- err }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i < len(newLive) {
				// asynq's Dequeue: the id goes to the head, with a lease.
				id := newLive[i]
				pipe := rc.TxPipeline()
				pipe.HSet(ctx, k.Task(id), "msg", "m", "state", StateActive)
				pipe.LPush(ctx, k.Active(), id)
				pipe.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(now.Add(time.Minute).Unix()), Member: id})
				if _, err = pipe.Exec(ctx); err != nil {
					return
				}
			}
			if i < len(oldLive)/2 {
				id := oldLive[i*2]
				if err = rc.LRem(ctx, k.Active(), 0, id).Err(); err != nil {
					return
				}
				rc.ZRem(ctx, k.Lease(), id)
				rc.Del(ctx, k.Task(id))
			}
			if i >= len(newLive) {
				return
			}
		}
	}()
	out, err := s.RecoverBatch(ctx, recPrefix, q, cutoff, ds)
	close(stop)
	if werr := <-workerDone; werr != nil {
		t.Fatal(werr)
	}
	if err != nil {
		t.Fatal(err)
	}
	requireRetried(t, out)
	active, _ := rc.LRange(ctx, k.Active(), 0, -1).Result()
	seen := map[string]int{}
	for _, id := range active {
		seen[id]++
		if strings.HasPrefix(id, "dead") || strings.HasPrefix(id, "cronstream:tombstone") {
			t.Fatalf("%s left in the active list", id)
		}
	}
	lease, _ := rc.ZRange(ctx, k.Lease(), 0, -1).Result()
	if len(active) != len(lease) || len(seen) != len(active) {
		t.Fatalf("active list %d (distinct %d), lease set %d", len(active), len(seen), len(lease))
	}
	for _, id := range lease {
		if seen[id] != 1 {
			t.Fatalf("live task %s lost from the active list", id)
		}
	}
	if n, _ := rc.ZCard(ctx, k.Retry()).Result(); n != int64(len(expired)) {
		t.Fatalf("retry set %d", n)
	}
}

// TestRecoverTailWindows: a mass crash recovered the way the recoverer
// does it (ids listed, ordered tail first, moved in batches) while the
// list's tail changes under it: a worker finishes a live task near the
// tail and pushes new ones at the head between the ordering and the moves,
// and one dead id sits in the list twice. Every dead task moves once,
// every other element stays once, and the tasks leave through tail
// windows (a handful of per-task LSETs for the stale hints, not one each).
func TestRecoverTailWindows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t, testenv.WithPrivateServer()).Client(t)
	s := New(rc, WithRecoverChunk(50))
	const q = "windows"
	k := Keys(q)
	now := time.Now()
	ids := testenv.UnsortedTaskIDs("w", 3000)
	seedActive(t, rc, q, ids, now.Add(-time.Minute), nil)
	var live, dead []string
	for i, id := range ids {
		if i%4 == 0 {
			live = append(live, id)
			rc.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(now.Add(time.Minute).Unix()), Member: id})
			continue
		}
		dead = append(dead, id)
	}
	// Younger tasks, all live, keep the list long enough for RecoverBatch
	// to read positions (a short one is searched with LPOS).
	young := testenv.UnsortedTaskIDs("young", positionMinList)
	seedActive(t, rc, q, young, now.Add(time.Minute), nil)
	live = append(live, young...)
	// The oldest dead task's id also sits in the middle of the list.
	twice := ids[1]
	if err := rc.LInsert(ctx, k.Active(), "BEFORE", ids[1500], twice).Err(); err != nil {
		t.Fatal(err)
	}

	cutoff := now.Add(-20 * time.Second)
	refs, err := s.ListLeaseRefs(ctx, q, cutoff, 0, 10_000)
	if err != nil || len(refs) != len(dead) {
		t.Fatalf("listed %d, want %d: %v", len(refs), len(dead), err)
	}
	if err := s.SortTailFirst(ctx, q, refs); err != nil {
		t.Fatal(err)
	}
	for i, r := range refs[:len(refs)-1] {
		// seedActive pushes at the head: the first id is at the tail.
		if a, b := slices.Index(ids, r.ID), slices.Index(ids, refs[i+1].ID); a > b {
			t.Fatalf("refs %d and %d out of tail order: %s before %s", i, i+1, r.ID, refs[i+1].ID)
		}
	}
	// The world moves on after the ordering.
	if err := rc.LRem(ctx, k.Active(), 1, live[3]).Err(); err != nil {
		t.Fatal(err)
	}
	rc.ZRem(ctx, k.Lease(), live[3])
	fresh := testenv.UnsortedTaskIDs("fresh", 5)
	for _, id := range fresh {
		rc.LPush(ctx, k.Active(), id)
	}
	if err := rc.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	for len(refs) > 0 {
		batch := refs[:min(700, len(refs))]
		refs = refs[len(batch):]
		tasks, bad, err := s.LoadLeaseExpired(ctx, q, batch)
		if err != nil || len(bad) > 0 || len(tasks) != len(batch) {
			t.Fatalf("load: %d tasks %v %v", len(tasks), bad, err)
		}
		out, err := s.RecoverBatch(ctx, recPrefix, q, cutoff, retryAll(t, tasks, now.Add(time.Hour), now))
		if err != nil {
			t.Fatal(err)
		}
		requireRetried(t, out)
	}

	after, _ := rc.LRange(ctx, k.Active(), 0, -1).Result()
	want := append(slices.Concat(fresh, slices.Delete(slices.Clone(live), 3, 4)), twice)
	slices.Sort(after)
	slices.Sort(want)
	if !slices.Equal(after, want) {
		t.Fatalf("active list holds %d ids, want %d: the live, the fresh and one copy of %s", len(after), len(want), twice)
	}
	if n, _ := rc.ZCard(ctx, k.Retry()).Result(); n != int64(len(dead)) {
		t.Fatalf("retry set has %d, want %d", n, len(dead))
	}
	if n := len(outboxEventIDs(t, rc, q)); n != len(dead) {
		t.Fatalf("outbox has %d records, want %d", n, len(dead))
	}
	if lset := testenv.RedisCommandStats(t, rc)["lset"].Calls; lset > 10 {
		t.Fatalf("%d LSETs for %d tasks: the windows were not used", lset, len(dead))
	}
}

// requireRetried fails t unless every outcome is RecoverRetried.
func requireRetried(t *testing.T, out []Outcome) {
	t.Helper()
	for _, o := range out {
		if o.Status != RecoverRetried {
			t.Fatalf("outcome %+v", o)
		}
	}
}

// TestLoadLeaseExpiredGoneAndBad: between listing and loading, one task
// finished (its hash and lease are gone) and one lost its message while
// still leased. The first is in neither result, the second is bad.
func TestLoadLeaseExpiredGoneAndBad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc)
	const q = "load"
	k := Keys(q)
	now := time.Now()
	seedActive(t, rc, q, []string{"a", "done", "nomsg", "z"}, now.Add(-time.Minute), nil)
	refs, err := s.ListLeaseRefs(ctx, q, now, 0, 100)
	if err != nil || len(refs) != 4 {
		t.Fatalf("listed %d: %v", len(refs), err)
	}
	if refs[0].LeaseExpiry.Unix() != now.Add(-time.Minute).Unix() {
		t.Fatalf("lease expiry %v", refs[0].LeaseExpiry)
	}
	rc.Del(ctx, k.Task("done"))
	rc.ZRem(ctx, k.Lease(), "done")
	rc.HDel(ctx, k.Task("nomsg"), "msg")
	tasks, bad, err := s.LoadLeaseExpired(ctx, q, refs)
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 2 || tasks[0].Msg.ID != "a" || tasks[1].Msg.ID != "z" {
		t.Fatalf("tasks %+v", tasks)
	}
	if len(bad) != 1 || bad[0].ID != "nomsg" || !errors.Is(bad[0].Err, ErrNoMessage) {
		t.Fatalf("bad %+v", bad)
	}
}

// TestListLeaseRefsPages: a listing longer than one pipeline of pages
// stops at the cutoff and honours offset and limit.
func TestListLeaseRefsPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc)
	const q = "refs"
	now := time.Now()
	n := leaseRefPage*leaseRefPipeline + 1234
	seedActive(t, rc, q, testenv.UnsortedTaskIDs("old", n), now.Add(-time.Minute), nil)
	seedActive(t, rc, q, testenv.UnsortedTaskIDs("new", 10), now.Add(time.Minute), nil)
	all, err := s.ListLeaseRefs(ctx, q, now, 0, 1<<30)
	if err != nil || len(all) != n {
		t.Fatalf("listed %d, want %d: %v", len(all), n, err)
	}
	seen := map[string]bool{}
	for _, r := range all {
		if !strings.HasPrefix(r.ID, "old") || seen[r.ID] {
			t.Fatalf("listed %s", r.ID)
		}
		seen[r.ID] = true
	}
	part, err := s.ListLeaseRefs(ctx, q, now, 100, 3000)
	if err != nil || !slices.Equal(part, all[100:3100]) {
		t.Fatalf("offset 100, limit 3000: %d refs: %v", len(part), err)
	}
	if tail, _ := s.ListLeaseRefs(ctx, q, now, n-5, 100); len(tail) != 5 {
		t.Fatalf("from %d: %d refs, want 5", n-5, len(tail))
	}
}

// TestListTailFirst: in a mass crash (the list read while listing) and
// otherwise (the list read after), ListTailFirst gives the order of
// ListLeaseRefs then SortTailFirst.
func TestListTailFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc)
	now := time.Now()
	for _, c := range []struct {
		queue       string
		dead, young int
	}{
		{"mass", 3000, 500},
		{"some", 1000, 3000},
	} {
		t.Run(c.queue, func(t *testing.T) {
			ids := testenv.UnsortedTaskIDs(c.queue, c.dead)
			seedActive(t, rc, c.queue, ids, now.Add(-time.Minute), nil)
			seedActive(t, rc, c.queue, testenv.UnsortedTaskIDs("young-"+c.queue, c.young), now.Add(time.Minute), nil)
			// One id twice: its depth is the one nearest the tail.
			rc.LPush(ctx, Keys(c.queue).Active(), ids[0])
			want, err := s.ListLeaseRefs(ctx, c.queue, now, 7, 2000)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SortTailFirst(ctx, c.queue, want); err != nil {
				t.Fatal(err)
			}
			got, err := s.ListTailFirst(ctx, c.queue, now, 7, 2000)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != min(c.dead-7, 2000) || !slices.Equal(got, want) {
				t.Fatalf("ListTailFirst gave %d refs, not the %d of ListLeaseRefs and SortTailFirst in their order", len(got), len(want))
			}
		})
	}
}

// TestRecoverBatchesEvents: the events of one script call's moves go to
// the outbox as batch records (the batch tag, a JSON array, the id
// events.BatchID of its size and first event) of at most
// RecoveredBatchBytes; an event alone in its batch, or one that is not a
// JSON object, is a record of its own. Every moved task's outcome names
// the record that holds its event.
func TestRecoverBatchesEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	s := New(rc)
	now := time.Now()
	cutoff := now.Add(-20 * time.Second)
	recover := func(q string, n int, data func(id string) []byte) ([]Outcome, []redis.XMessage) {
		t.Helper()
		seedActive(t, rc, q, testenv.UnsortedTaskIDs(q, n), now.Add(-time.Minute), nil)
		tasks, _, err := s.ListLeaseExpired(ctx, q, cutoff, n)
		if err != nil || len(tasks) != n {
			t.Fatalf("list %d %v", len(tasks), err)
		}
		ds := retryAll(t, tasks, now.Add(time.Hour), now)
		for i := range ds {
			ds[i].Record.Data = data(ds[i].TaskID)
		}
		out, err := s.RecoverBatch(ctx, recPrefix, q, cutoff, ds)
		if err != nil {
			t.Fatal(err)
		}
		requireRetried(t, out)
		recs, err := rc.XRange(ctx, Own(recPrefix, q).Outbox(), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		return out, recs
	}
	// byRecord checks that each task's event is in the record its outcome
	// names, once, and returns how many events each record holds.
	byRecord := func(out []Outcome, recs []redis.XMessage) []int {
		t.Helper()
		holds := map[string]string{} // event id -> stream id
		var sizes []int
		for _, m := range recs {
			data, _ := m.Values["data"].(string)
			evs, err := contract.SplitEvents([]byte(strings.TrimPrefix(data, outbox.BatchRecordTag)))
			if err != nil {
				t.Fatalf("record %s: %v", m.ID, err)
			}
			for _, ev := range evs {
				var head struct {
					ID string `json:"id"`
				}
				if err := json.Unmarshal(ev, &head); err != nil {
					t.Fatalf("record %s: %v", m.ID, err)
				}
				if _, dup := holds[head.ID]; dup {
					t.Fatalf("event %s twice in the outbox", head.ID)
				}
				holds[head.ID] = m.ID
			}
			sizes = append(sizes, len(evs))
		}
		for _, o := range out {
			if got := holds["recovered:"+o.TaskID]; got == "" || got != o.StreamID {
				t.Fatalf("task %s: outcome names record %q, its event is in %q", o.TaskID, o.StreamID, got)
			}
		}
		if len(holds) != len(out) {
			t.Fatalf("%d events in the outbox for %d tasks", len(holds), len(out))
		}
		return sizes
	}
	small := func(id string) []byte { return []byte(`{"id":"recovered:` + id + `","task_id":"` + id + `"}`) }

	// Three script calls (chunks of 128): a batch each, under its id.
	out, recs := recover("small", 300, small)
	if got := byRecord(out, recs); !slices.Equal(got, []int{128, 128, 44}) {
		t.Fatalf("events per record %v, want a batch per script call", got)
	}
	if got := outboxEventIDs(t, rc, "small"); len(got) != 300 {
		t.Fatalf("%d events in the outbox", len(got))
	}

	// Events of 20 KiB: three to a batch of at most RecoveredBatchBytes;
	// the last one alone is a plain record under its own id.
	pad := strings.Repeat("x", 20<<10)
	out, recs = recover("large", 10, func(id string) []byte {
		return []byte(`{"id":"recovered:` + id + `","pad":"` + pad + `"}`)
	})
	if got := byRecord(out, recs); !slices.Equal(got, []int{3, 3, 3, 1}) {
		t.Fatalf("events per record %v, want 3, 3, 3, 1", got)
	}
	for _, m := range recs {
		data, _ := m.Values["data"].(string)
		if len(data) > RecoveredBatchBytes+len(outbox.BatchRecordTag)+2 {
			t.Fatalf("record %s holds %d bytes, over %d", m.ID, len(data), RecoveredBatchBytes)
		}
	}
	last := recs[len(recs)-1].Values
	if id, _ := last["id"].(string); !strings.HasPrefix(id, "recovered:") || outbox.FormOf([]byte(last["data"].(string))) != outbox.RecordJSON {
		t.Fatalf("a lone event's record: %v", last)
	}

	// Events that are not JSON objects are never batched.
	out, recs = recover("opaque", 5, func(id string) []byte { return []byte("opaque " + id) })
	if len(recs) != 5 {
		t.Fatalf("%d records for 5 opaque events", len(recs))
	}
	for i, m := range recs {
		if data, _ := m.Values["data"].(string); !strings.HasPrefix(data, "opaque ") || m.ID != out[slices.IndexFunc(out, func(o Outcome) bool { return o.StreamID == m.ID })].StreamID {
			t.Fatalf("record %d: %v", i, m.Values)
		}
	}
}
