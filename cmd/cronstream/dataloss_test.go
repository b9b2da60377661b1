package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// scheduledTicks returns the ticks of entry's scheduled tasks among ids.
func scheduledTicks(t *testing.T, entry string, ids []string) []time.Time {
	t.Helper()
	var out []time.Time
	for _, id := range ids {
		rest, ok := strings.CutPrefix(id, events.DefaultPrefix+":"+entry+":")
		if !ok || strings.HasPrefix(rest, "trigger:") {
			continue
		}
		tick, err := time.Parse(time.RFC3339, rest)
		if err != nil {
			t.Fatalf("task id %s: %v", id, err)
		}
		out = append(out, tick)
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

// flushAll lists queue's pending task ids and empties Redis in one atomic
// step, and returns the ids: what Redis held when it lost everything.
func flushAll(t *testing.T, rc *redis.Client, queue string) []string {
	t.Helper()
	c := context.Background()
	var ids *redis.StringSliceCmd
	if _, err := rc.TxPipelined(c, func(p redis.Pipeliner) error {
		ids = p.LRange(c, taskstate.Keys(queue).Pending(), 0, -1)
		p.FlushAll(c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ids.Val()
}

// TestRedisFlushedUnderRun: an entry with catch-up "all" and an update
// fires; Redis loses everything while its replica is stopped, and again
// while it runs. No tick that fired before the loss is enqueued again.
func TestRedisFlushedUnderRun(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	r := testenv.StartRedis(t, testenv.WithPrivateServer())
	e := &cliEnv{t: t, nats: n, redis: r, vars: append(baseEnv(), "CRONSTREAM_NATS="+n.URL(), "CRONSTREAM_REDIS="+r.URL)}
	rc := r.Client(t)
	ins := inspector(t, r.URL)
	ticks := func() []time.Time {
		var ids []string
		for _, task := range pendingTasks(t, ins, "default") {
			ids = append(ids, task.ID)
		}
		return scheduledTicks(t, "w", ids)
	}
	check := func(when string, last time.Time) {
		t.Helper()
		got := ticks()
		if len(got) == 0 || !got[0].After(last) {
			t.Errorf("%s: ticks in Redis %v, the last one before the loss was %s: fired again", when, got, last.Format(time.TimeOnly))
		}
	}

	e.ok("entry", "put", "w", "--cron", "@every 2s", "--type", "x", "--catchup", "all")
	e.ok("entry", "put", "w", "--payload", "2")
	p := start(t, e.vars, "run", "--http", "127.0.0.1:0", "--replica-id", "loss-1")
	testenv.Eventually(t, 30*time.Second, func() bool { return len(ticks()) >= 5 }, "no fires:\n%s", p.Stderr())
	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d", code)
	}
	lost := scheduledTicks(t, "w", flushAll(t, rc, "default"))
	last := lost[len(lost)-1]

	// Flushed while down.
	p = start(t, e.vars, "run", "--http", "127.0.0.1:0", "--replica-id", "loss-2", "--log-level", "debug")
	testenv.Eventually(t, 30*time.Second, func() bool { return len(ticks()) >= 2 }, "no fires after the loss:\n%s", lazy(p.Stderr))
	check("flushed while down", last)
	// A record still in the outbox is lost with Redis's data, tasks alike
	// (docs/operations.md "Redis"): the second flush comes once the first loss's
	// record is in the stream, so that each flush is known to leave one.
	lostInStream := func() int { return len(parseAudit(t, e.ok("audit", "--type", "lost", "--json"))) }
	testenv.Eventually(t, 15*time.Second, func() bool { return lostInStream() >= 1 },
		"the first loss's record did not reach the stream (%s):\n%s", lazy(func() string { return outboxState(rc, "cronstream", "default") }), lazy(p.Stderr))

	// Flushed while running.
	lost = scheduledTicks(t, "w", flushAll(t, rc, "default"))
	if len(lost) == 0 {
		t.Fatal("nothing in Redis before the second loss")
	}
	last = lost[len(lost)-1]
	testenv.Eventually(t, 30*time.Second, func() bool { return len(ticks()) >= 2 }, "no fires after the loss:\n%s", lazy(p.Stderr))
	check("flushed while running", last)
	if !strings.Contains(p.Stderr(), "did Redis lose data?") {
		t.Errorf("the restore was not logged:\n%s", p.Stderr())
	}
	// The second loss's record reaches the stream while the replica runs:
	// its relay publishes the queue's outbox once it holds the queue's
	// duties again (the flush took their leases too). Stopped before
	// that, the record would wait in Redis for the next replica.
	testenv.Eventually(t, 15*time.Second, func() bool { return lostInStream() >= 2 }, "the second loss's record did not reach the stream (%s):\n%s", lazy(func() string { return outboxState(rc, "cronstream", "default") }), lazy(p.Stderr))
	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d", code)
	}

	// Each flush left no watermark: each restore recorded its loss as
	// unknown, naming no tick, and audit and describe say so.
	lines := parseAudit(t, e.ok("audit", "--type", "lost", "--json"))
	if len(lines) != 2 {
		t.Fatalf("%d lost events, want one per flush: %v", len(lines), labels(lines))
	}
	for _, l := range lines {
		var d events.TasksLost
		if err := json.Unmarshal(l.Data, &d); err != nil || !d.Unknown || d.ScheduledAt != nil || d.Count != 0 || d.Entry != "w" {
			t.Errorf("lost event %s: %+v, %v; want unknown, naming no tick", l.ID, d, err)
		}
	}
	if out := e.ok("audit", "--type", "lost"); strings.Count(out, "Redis lost the entry's watermark in queue default: which fires up to") != 2 {
		t.Errorf("audit --type lost:\n%s", out)
	}
	if out := e.ok("entry", "describe", "w"); !strings.Contains(out, "fires Redis lost") || !strings.Contains(out, "lost their tasks is unknown") {
		t.Errorf("entry describe does not show the losses:\n%s", out)
	}
}

// outboxState describes queue's outbox in Redis, for a failure message: its
// records, its lease, and whether the relays can find it.
func outboxState(rc *redis.Client, prefix, queue string) string {
	ctx := context.Background()
	own := taskstate.Own(prefix, queue)
	var b strings.Builder
	recs, err := rc.XRange(ctx, own.Outbox(), "-", "+").Result()
	fmt.Fprintf(&b, "outbox: %d records (err %v):", len(recs), err)
	for _, r := range recs {
		fmt.Fprintf(&b, " %s %v", r.ID, r.Values["id"])
	}
	lease, err := rc.Get(ctx, own.OutboxOwner()).Result()
	ttl, _ := rc.PTTL(ctx, own.OutboxOwner()).Result()
	fmt.Fprintf(&b, "; lease %q (ttl %s, err %v)", lease, ttl, err)
	listed, err := rc.SIsMember(ctx, taskstate.OutboxesKey(prefix), queue).Result()
	fmt.Fprintf(&b, "; listed for the relays %v (err %v)", listed, err)
	return b.String()
}
