package ownership

import (
	"fmt"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

func TestDutyShard(t *testing.T) {
	queues := []string{"b", "d"}
	for _, c := range []struct {
		queue string
		want  events.Shard
	}{
		{"b", events.Shard{Queue: "b"}},
		{"d", events.Shard{Queue: "d"}},
		// A queue without entries goes with a shard of the first queue.
		{"asynq-only", events.Shard{Queue: "b", Index: events.ShardOf("asynq-only")}},
	} {
		if got, ok := events.DutyShard(queues, c.queue); !ok || got != c.want {
			t.Errorf("DutyShard(%q) = %v %v, want %v", c.queue, got, ok, c.want)
		}
	}
	if g, ok := events.GlobalShard(queues); !ok || g != (events.Shard{Queue: "b"}) {
		t.Errorf("GlobalShard = %v %v", g, ok)
	}
	if _, ok := events.DutyShard(nil, "q"); ok {
		t.Error("a duty shard without a shard set")
	}
}

// TestDutiesFollowShardZero: three replicas own two queues' shards; each
// queue's duties (and the duties of a queue without entries, and the
// global duty) are held by exactly one of them, the owner of the duty
// shard; a kill hands them over within the takeover bound; a replica
// holds no duty before its first poll, and every duty where the
// projection names no queue.
func TestDutiesFollowShardZero(t *testing.T) {
	t.Parallel()
	f := newFleet(t, "q1", "q2")
	v := &view{}
	v.set("r1", "r2", "r3")
	rs := []*replica{f.start("r1", v, nil), f.start("r2", v, nil), f.start("r3", v, nil)}
	testenv.Eventually(t, 10*time.Second, func() bool { return f.settled(v.Candidates(), rs...) }, "shards owned")
	queues := []string{"q1", "q2", "asynq-only"}
	holders := func(rs []*replica) (map[string][]string, []string) {
		byQueue := map[string][]string{}
		var global []string
		for _, r := range rs {
			for _, q := range queues {
				if r.m.HoldsQueue(q) {
					byQueue[q] = append(byQueue[q], r.id)
				}
			}
			if r.m.HoldsGlobal() {
				global = append(global, r.id)
			}
		}
		return byQueue, global
	}
	byQueue, global := holders(rs)
	h := f.holders()
	for _, q := range queues {
		s, _ := events.DutyShard(f.queues, q)
		if len(byQueue[q]) != 1 || byQueue[q][0] != h[s] {
			t.Errorf("queue %s: duties held by %v, its duty shard %s by %s", q, byQueue[q], s, h[s])
		}
	}
	if g, _ := events.GlobalShard(f.queues); len(global) != 1 || global[0] != h[g] {
		t.Errorf("global duty held by %v, its shard by %s", global, h[g])
	}

	// The holder of q1's duties is killed: they move within a lease term,
	// a poll and a step or two (the views still count it).
	victim := byQueue["q1"][0]
	var left []*replica
	for _, r := range rs {
		if r.id == victim {
			r.shutdown(false)
		} else {
			left = append(left, r)
		}
	}
	killed := time.Now()
	testenv.Eventually(t, 10*time.Second, func() bool {
		byQueue, global = holders(left)
		for _, q := range queues {
			if len(byQueue[q]) != 1 {
				return false
			}
		}
		return len(global) == 1
	}, "the killed replica's duties to move: %v", lazyDuties(func() any { return byQueue }))
	took := time.Since(killed)
	t.Logf("duties moved %s after the kill", took.Round(10*time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("duties moved %s after the kill, want within 5 s", took)
	}

	// Before its first poll a replica holds nothing; with no shard set,
	// every replica holds every duty.
	m, err := New(Config{Store: f.store, Members: v, ReplicaID: "x", Queues: func() []string { return nil }, Logger: testLogger(t, "x")})
	if err != nil {
		t.Fatal(err)
	}
	if m.HoldsQueue("q1") || m.HoldsGlobal() {
		t.Error("duties held before the first poll")
	}
	m.poll(t.Context())
	if !m.HoldsQueue("q1") || !m.HoldsGlobal() {
		t.Error("with no shard set, duties not held")
	}
}

// lazyDuties prints what it returns when a failure message is made.
type lazyDuties func() any

func (l lazyDuties) String() string { return fmt.Sprint(l()) }
