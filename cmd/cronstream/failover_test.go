package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/audit"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// The bounds of docs/design.md's time budget the failover tests check.
const (
	// catchupGrace is scheduler.DefaultGrace: a tick fired later than
	// this after it was due would have been skipped as missed.
	catchupGrace = 5 * time.Second
	// eventWithin: every fired event is in the activity stream within
	// this long of its fire, across a kill (the outbox lease, a poll, a
	// pass).
	eventWithin = 5 * time.Second
	// recoverWithin: a queue whose owner died is recovered by its new
	// owner within this long (so before asynq's own recoverer).
	recoverWithin = 5 * time.Second
)

// fleet is several `cronstream run` replicas firing entries every second
// over several queues.
type fleet struct {
	t       *testing.T
	e       *cliEnv
	procs   map[string]*proc
	queues  []string
	entries []string
	rc      *redis.Client
}

func newFleet(t *testing.T, replicas, entries int, queues ...string) *fleet {
	t.Helper()
	e := newEnv(t, true)
	opts, err := redis.ParseURL(e.redis.URL)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, e: e, procs: map[string]*proc{}, queues: queues, rc: redis.NewClient(opts)}
	t.Cleanup(func() { _ = f.rc.Close() })
	for i := range replicas {
		id := fmt.Sprintf("f%d", i+1)
		f.procs[id], _ = startMetricsReplica(t, e, id)
	}
	for i := range entries {
		id := fmt.Sprintf("every%02d", i)
		e.ok("entry", "put", id, "--cron", "@every 1s", "--type", "t", "--queue", queues[i%len(queues)])
		f.entries = append(f.entries, id)
	}
	// Every shard owned, every entry firing.
	testenv.Eventually(t, 30*time.Second, func() bool { _, free := f.holders(); return free == 0 }, "every shard owned")
	testenv.Eventually(t, 30*time.Second, func() bool {
		n := map[string]int{}
		for _, fe := range f.fired() {
			n[fe.fired.Entry]++
		}
		for _, id := range f.entries {
			if n[id] < 2 {
				return false
			}
		}
		return true
	}, "every entry firing")
	return f
}

// holders reads who holds each shard of the fleet's queues, and how many
// have no holder.
func (f *fleet) holders() (map[events.Shard]string, int) {
	v, err := taskstate.New(f.rc).ShardLeases(context.Background(), events.DefaultPrefix, f.queues, false)
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[events.Shard]string{}
	for _, l := range v.Leases {
		out[l.Shard] = l.Holder
	}
	return out, len(f.queues)*events.ShardsPerQueue - len(out)
}

// firedEvent is a fired event with the time the stream stored it.
type firedEvent struct {
	fired  events.Fired
	stored time.Time
}

// fired reads every fired event of the activity stream.
func (f *fleet) fired() []firedEvent {
	var out []firedEvent
	f.activity(events.TypeEntryFired, func(rec audit.Record) {
		var fe events.Fired
		if err := json.Unmarshal(rec.Event.Data, &fe); err != nil {
			f.t.Fatalf("fired event %s: %v", rec.Data, err)
		}
		out = append(out, firedEvent{fired: fe, stored: rec.Time})
	})
	return out
}

// activity calls each with every event of the activity stream of type
// typ.
func (f *fleet) activity(typ string, each func(audit.Record)) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := audit.Open(ctx, f.e.nats.JetStream(f.t), audit.Params{Types: []string{typ}})
	if err != nil {
		f.t.Fatal(err)
	}
	defer r.Close()
	for {
		rec, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			f.t.Fatal(err)
		}
		if !rec.Config && rec.Event != nil {
			each(rec)
		}
	}
}

// stop stops the replicas still running cleanly (their outboxes flushed).
func (f *fleet) stop(except ...string) {
	f.t.Helper()
	for id, p := range f.procs {
		if slices.Contains(except, id) {
			continue
		}
		if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
			f.t.Errorf("replica %s exited %d:\n%s", id, code, p.Stderr())
		}
	}
}

// checkFires checks every tick of every entry from from to to: one task
// in Redis and one fired event, fired within the catch-up grace of its
// tick, stored in the stream within eventWithin of its fire; and no skip.
// It returns the longest fire and event delays.
func (f *fleet) checkFires(from, to time.Time) (fireDelay, eventDelay time.Duration) {
	t := f.t
	t.Helper()
	tasks := map[string]int{}
	for _, q := range f.queues {
		for _, ti := range pendingTasks(t, inspector(t, f.e.redis.URL), q) {
			tasks[ti.ID]++
		}
	}
	type key struct {
		entry string
		tick  int64
	}
	seen := map[key]int{}
	var slow []string
	for _, fe := range f.fired() {
		fd := fe.fired
		tick := fd.ScheduledAt
		if tick.Before(from) || tick.After(to) {
			continue
		}
		seen[key{fd.Entry, tick.Unix()}]++
		if tasks[fd.TaskID] != 1 {
			t.Errorf("fired event of %s tick %s: %d tasks %s in Redis", fd.Entry, tick.Format(time.TimeOnly), tasks[fd.TaskID], fd.TaskID)
		}
		late, stored := fd.EnqueuedAt.Sub(tick), fe.stored.Sub(fd.EnqueuedAt)
		fireDelay, eventDelay = max(fireDelay, late), max(eventDelay, stored)
		if late > catchupGrace {
			t.Errorf("%s tick %s fired %s late, beyond the catch-up grace", fd.Entry, tick.Format(time.TimeOnly), late)
		}
		if stored > eventWithin {
			slow = append(slow, fmt.Sprintf("%s tick %s by %s: stored %s after its fire", fd.Entry, tick.Format(time.TimeOnly), fd.Replica, stored.Round(time.Millisecond)))
		}
	}
	if len(slow) > 0 {
		t.Errorf("%d fired events reached the stream later than %s after their fire, e.g. %s", len(slow), eventWithin, strings.Join(slow[:min(len(slow), 5)], "; "))
	}
	for _, id := range f.entries {
		for s := from.Unix(); s <= to.Unix(); s++ {
			if n := seen[key{id, s}]; n != 1 {
				t.Errorf("%s tick %s: %d fired events, want 1", id, time.Unix(s, 0).UTC().Format(time.TimeOnly), n)
			}
		}
	}
	f.activity(events.TypeEntrySkipped, func(rec audit.Record) {
		t.Errorf("skipped event (a missed tick): %s", rec.Data)
	})
	return fireDelay, eventDelay
}

// seedExpiredTask puts an active task into queue as asynq's dequeue
// leaves it, its lease expired at leaseExpiry (no worker holds it).
func seedExpiredTask(t *testing.T, rc redis.Cmdable, queue, id string, leaseExpiry time.Time) {
	t.Helper()
	ctx := context.Background()
	k := taskstate.Keys(queue)
	b, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "work", ID: id, Queue: queue, Retry: 25, Timeout: 1800})
	if err != nil {
		t.Fatal(err)
	}
	pipe := rc.TxPipeline()
	pipe.SAdd(ctx, taskstate.AllQueuesKey, queue)
	pipe.HSet(ctx, k.Task(id), "msg", b, "state", taskstate.StateActive)
	pipe.LPush(ctx, k.Active(), id)
	pipe.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(leaseExpiry.Unix()), Member: id})
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestOwnerKilledThroughRun: three `cronstream run` replicas fire 24
// entries every second over three queues; the replica that holds the
// first queue's duties (its shard 0: the relay of its outbox, its
// recoverer) and a third of the shards is killed with SIGKILL, with a
// task of that queue whose lease expires a second later. Every tick of
// every entry fires once, within the catch-up grace, none missed; every
// fired event is in the activity stream within 5 s of its fire
// (enqueued_at to the time the stream stored it), the killed replica's
// last fires included; the task is recovered, with its event, by the
// queue's new owner within 5 s of the kill (so before asynq's recoverer,
// which acts 30 s after the lease expired at the earliest).
func TestOwnerKilledThroughRun(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: three replicas firing for 25 s (runs without -short, as in CI)")
	}
	f := newFleet(t, 3, 24, "fa", "fb", "fc")
	from := time.Now().Truncate(time.Second).Add(time.Second)
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Now().After(from.Add(3 * time.Second)) }, "")
	held, _ := f.holders()
	victim := held[events.Shard{Queue: "fa"}]
	if f.procs[victim] == nil {
		t.Fatalf("fa's shard 0 held by %q", victim)
	}
	// The recoverer's grace is 20 s: this task is due for recovery a
	// second after the kill, which the killed replica never sees.
	seedExpiredTask(t, f.rc, "fa", "lost-1", time.Now().Add(-19*time.Second))
	f.procs[victim].stop(syscall.SIGKILL, 10*time.Second)
	killed := time.Now()
	testenv.Eventually(t, 30*time.Second, func() bool { return time.Since(killed) > 12*time.Second }, "")
	to := time.Now().Truncate(time.Second).Add(-2 * time.Second)
	f.stop(victim)

	fireDelay, eventDelay := f.checkFires(from, to)
	t.Logf("%s killed: longest fire delay %s (grace %s), longest fire-to-stream delay %s (bound %s)",
		victim, fireDelay.Round(time.Millisecond), catchupGrace, eventDelay.Round(time.Millisecond), eventWithin)
	var recovered []time.Time
	f.activity("cronstream.task.*", func(rec audit.Record) {
		var r events.TaskRecovered
		if json.Unmarshal(rec.Event.Data, &r) == nil && r.TaskID == "lost-1" {
			recovered = append(recovered, rec.Event.Time)
			if r.Replica == victim {
				t.Errorf("recovered by the killed replica: %s", rec.Data)
			}
		}
	})
	if len(recovered) != 1 {
		t.Fatalf("%d recovery events of the task whose lease expired after the kill, want 1", len(recovered))
	}
	took := recovered[0].Sub(killed)
	t.Logf("the task of the killed owner's queue recovered %s after the kill (bound %s)", took.Round(time.Millisecond), recoverWithin)
	if took > recoverWithin {
		t.Errorf("recovered %s after the kill, want within %s", took, recoverWithin)
	}
	var takeovers int
	for id, p := range f.procs {
		if id != victim && strings.Contains(p.Stderr(), "shards taken over") {
			takeovers++
		}
	}
	if takeovers == 0 {
		t.Error("no survivor logged taking shards over")
	}
}

// TestOwnerFrozenThroughRun: three `cronstream run` replicas fire 24
// entries every second over three queues; the replica that holds the
// first queue's duties and a third of the shards is frozen with SIGSTOP
// for 8 s (its heartbeats stop; the others' views drop it), then thawed
// with SIGCONT. Its shards move to the others while it is frozen; thawed,
// it finds its leases lost and gives way (what it had in flight is
// refused by the compare-and-set), then takes its share back by handover;
// every tick of every entry fires once, within the catch-up grace, none
// missed, and every fired event is in the stream within 5 s of its fire.
func TestOwnerFrozenThroughRun(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: three replicas firing for 35 s (runs without -short, as in CI)")
	}
	f := newFleet(t, 3, 24, "ga", "gb", "gc")
	from := time.Now().Truncate(time.Second).Add(time.Second)
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Now().After(from.Add(3 * time.Second)) }, "")
	held, _ := f.holders()
	victim := held[events.Shard{Queue: "ga"}]
	p := f.procs[victim]
	if p == nil {
		t.Fatalf("ga's shard 0 held by %q", victim)
	}
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	})
	// Its shards move to the replicas that run.
	var moved time.Duration
	testenv.Eventually(t, 15*time.Second, func() bool {
		h, free := f.holders()
		for _, r := range h {
			if r == victim {
				return false
			}
		}
		moved = time.Since(frozen)
		return free == 0
	}, "the frozen owner's shards to move")
	t.Logf("the frozen owner's shards held by the others %s after SIGSTOP", moved.Round(time.Millisecond))
	testenv.Eventually(t, 30*time.Second, func() bool { return time.Since(frozen) > 8*time.Second }, "")
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed = true
	// Thawed, it gives way: its leases are lost, and it takes its share
	// back only by handover, once the views count it again.
	testenv.Eventually(t, 15*time.Second, func() bool { return strings.Contains(p.Stderr(), "shard leases lost") }, "the thawed replica to find its leases lost:\n%v", lazyStderr{p})
	testenv.Eventually(t, 30*time.Second, func() bool {
		h, free := f.holders()
		n := 0
		for _, r := range h {
			if r == victim {
				n++
			}
		}
		return free == 0 && n > 0 && strings.Contains(p.Stderr(), "shards handed over to this replica")
	}, "the thawed replica to take its share back by handover:\n%v", lazyStderr{p})
	testenv.Eventually(t, 30*time.Second, func() bool { return time.Now().After(from.Add(30 * time.Second)) }, "")
	to := time.Now().Truncate(time.Second).Add(-2 * time.Second)
	f.stop()

	fireDelay, eventDelay := f.checkFires(from, to)
	t.Logf("%s frozen for 8 s: longest fire delay %s (grace %s), longest fire-to-stream delay %s (bound %s)",
		victim, fireDelay.Round(time.Millisecond), catchupGrace, eventDelay.Round(time.Millisecond), eventWithin)
}
