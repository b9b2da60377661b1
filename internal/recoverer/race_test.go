package recoverer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/recoverer"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestThreeRecoverersTenThousandTasks: three replicas' recoverers (and
// relays) run on the same queues at the same time over 10,000 expired tasks
// of a mass crash. Every task moves exactly once (one outcome, counted
// once, retried once) and has exactly one event in the activity stream;
// live tasks stay.
func TestThreeRecoverersTenThousandTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	store := taskstate.New(rc)
	js := startActivity(t)

	// Two queues; tasks whose id ends in 0 (one in sixteen) are at max retry
	// (archived); live tasks
	// (lease in the future) sit between the dead ones.
	queues := map[string]int{"alpha": 6000, "beta": 4000}
	const total = 10_000
	now := time.Now()
	dead := map[string]string{} // task id → queue
	atMax := map[string]bool{}
	live := map[string][]string{}
	for q, n := range queues {
		ids := testenv.UnsortedTaskIDs(q, n)
		seedActive(t, rc, q, ids, now.Add(-time.Minute), func(m *taskstate.TaskMessage) {
			if strings.HasSuffix(m.ID, "0") {
				m.Retry, m.Retried = 3, 3
			}
		})
		for _, id := range ids {
			dead[id] = q
			atMax[id] = strings.HasSuffix(id, "0")
		}
		live[q] = testenv.UnsortedTaskIDs(q+"-live", n/10)
		seedActive(t, rc, q, live[q], now.Add(10*time.Minute), nil)
	}
	if len(dead) != total {
		t.Fatalf("seeded %d distinct tasks", len(dead))
	}

	var (
		recs   []*recoverer.Recoverer
		relays []*relay.Relay
	)
	for i := range 3 {
		rl := startRelay(t, store, js, fmt.Sprintf("relay%d", i+1))
		relays = append(relays, rl)
		// Small batches so that the replicas interleave many times.
		recs = append(recs, newRecoverer(t, recoverer.Config{
			Redis: rc, ReplicaID: fmt.Sprintf("rep%d", i+1), Batch: 300 + 100*i,
			Interval: 50 * time.Millisecond, OnRecord: rl.Notify,
		}, nil))
	}
	for _, r := range recs {
		_ = r.Start(context.Background())
		t.Cleanup(func() { _ = r.Stop(context.Background()) })
	}
	testenv.Eventually(t, 60*time.Second, func() bool {
		for q := range queues {
			if n, _ := rc.ZCard(ctx, taskstate.Keys(q).Lease()).Result(); n != int64(len(live[q])) {
				return false
			}
		}
		return true
	}, "every expired task recovered")
	for _, r := range recs {
		_ = r.Stop(context.Background())
	}

	// Redis: each task moved once.
	var moved, archived uint64
	for i, r := range recs {
		var m uint64
		for q, s := range r.Stats() {
			if s.Errors != 0 || s.Bad != 0 {
				t.Errorf("recoverer %d queue %s: %+v", i+1, q, s)
			}
			m += s.Retried + s.Archived
			archived += s.Archived
		}
		t.Logf("recoverer %d moved %d tasks", i+1, m)
		moved += m
	}
	var wantArchived uint64
	for _, a := range atMax {
		if a {
			wantArchived++
		}
	}
	if moved != total || archived != wantArchived {
		t.Fatalf("recoverers report %d moves (%d archived), want %d (%d)", moved, archived, total, wantArchived)
	}
	for q, n := range queues {
		k := taskstate.Keys(q)
		for _, key := range []string{k.ProcessedTotal(), k.FailedTotal(), k.Processed(time.Now()), k.Failed(time.Now())} {
			if got, _ := rc.Get(ctx, key).Int(); got != n {
				t.Errorf("%s = %d, want %d", key, got, n)
			}
		}
		active, _ := rc.LRange(ctx, k.Active(), 0, -1).Result()
		if len(active) != len(live[q]) {
			t.Errorf("queue %s: active list has %d, want the %d live tasks", q, len(active), len(live[q]))
		}
		for _, id := range active {
			if _, isDead := dead[id]; isDead {
				t.Errorf("queue %s: dead task %s still active", q, id)
			}
		}
		retry, _ := rc.ZCard(ctx, k.Retry()).Result()
		arch, _ := rc.ZCard(ctx, k.Archived()).Result()
		if retry+arch != int64(n) {
			t.Errorf("queue %s: %d retry + %d archived, want %d", q, retry, arch, n)
		}
	}
	// Every message shows one failure (a second move would show two, or
	// none if skipped).
	pipe := rc.Pipeline()
	cmds := map[string]*redis.SliceCmd{}
	for id, q := range dead {
		cmds[id] = pipe.HMGet(ctx, taskstate.Keys(q).Task(id), "msg", "state")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for id, c := range cmds {
		v := c.Val()
		raw, _ := v[0].(string)
		m, err := taskstate.DecodeTaskMessage([]byte(raw))
		if err != nil {
			t.Fatalf("task %s: %v", id, err)
		}
		wantState, wantRetried := taskstate.StateRetry, int32(1)
		if atMax[id] {
			wantState, wantRetried = taskstate.StateArchived, 3
		}
		if v[1] != wantState || m.Retried != wantRetried || m.ErrorMsg != taskstate.ErrLeaseExpiredText {
			t.Fatalf("task %s: state %v retried %d error %q", id, v[1], m.Retried, m.ErrorMsg)
		}
	}

	// The stream: exactly one event per task.
	testenv.Eventually(t, 60*time.Second, func() bool { return activityEventCount(t, js) >= total },
		"the relays publish every outcome")
	for _, rl := range relays {
		if err := rl.Stop(ctxT(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	eventIDs := map[string]bool{}
	for _, se := range activityEvents(t, js) {
		d := recovered(t, se.Event)
		seen[d.TaskID]++
		eventIDs[se.Event.ID] = true
		q := dead[d.TaskID]
		wantType := events.TypeTaskRetried
		if atMax[d.TaskID] {
			wantType = events.TypeTaskArchived
		}
		if se.Event.Type != wantType || se.Subject != names.RecoverySubject(q) || d.Queue != q {
			t.Fatalf("event %s: %s on %s for %s/%s", se.Event.ID, se.Event.Type, se.Subject, d.Queue, d.TaskID)
		}
	}
	if len(eventIDs) != total {
		t.Errorf("%d distinct event ids, want %d", len(eventIDs), total)
	}
	for id := range dead {
		if seen[id] != 1 {
			t.Fatalf("task %s has %d events", id, seen[id])
		}
	}
	if len(seen) != total {
		t.Fatalf("events for %d tasks, want %d", len(seen), total)
	}
	if n := activityEventCount(t, js); n != total {
		t.Fatalf("activity stream has %d events, want %d", n, total)
	}
}
