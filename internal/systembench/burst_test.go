package systembench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// BenchmarkBurstVsFloor measures N entries due at the same instant, fired
// by a `cronstream run` process (relay on), beside the floor any
// asynq-compatible writer pays for N tasks: a bare pipelined enqueue (one
// HSET and one LPUSH per task, as asynq's Enqueue writes them, 1,000 tasks
// per round trip, encoding included) into a fresh redis-server in the same
// run. The floor's tasks carry the burst's own task ids; it is measured
// again with the ids asynq's Enqueue gives a task by default (UUIDs), the
// floor asynq itself pays, and reported with ratios to it ("-asynq-ids"),
// and with short ids ("floor-<i>"), which cost Redis less than any id that
// names an entry and a tick.
//
// The entries tick at one second of two consecutive minutes, the first
// lead seconds ahead, so the replica has loaded them (every entry known,
// its first write to Redis done) well before the first instant. The first
// burst is the entries' first tick ever: each writes its watermark key for
// the first time. The second, a minute later, is what the same burst costs
// every time after (a daily report, an hourly sync): the watermarks exist
// and are rewritten. For each it reports the time from the instant until
// all N tasks are in Redis and until all N fired events are in the activity
// stream, the fire lag p50/p99 (from the fired events), and the ratios
// all-in-Redis/floor (goal ≤ 2) and lag p99/floor (goal ≤ 2.5); the
// second's metrics end in "-next".
//
//	CRONSTREAM_BENCH_INSTANT_ENTRIES=100000 go test -run '^$' -bench BenchmarkBurstVsFloor -benchtime 1x -timeout 30m -v ./internal/systembench/
//
// Beside the floor it times the Redis commands the fire script's bulk path
// makes for N fires, sent the same way without Lua and without acting on
// what they read (commandsFloor): what any writer pays that reads and
// moves a watermark, checks the task, and writes an audit record with it.
// It times them once more without the task's EXISTS and the handover
// marker's read: the least a writer pays whose fires are exactly once
// (the watermark read and moved) and audited (the record), whatever
// language it runs them in.
//
// CRONSTREAM_BENCH_INSTANT_ENTRIES is N (default 10,000);
// CRONSTREAM_BENCH_BURST_LEAD is the lead in seconds (default 30 + N/1000);
// CRONSTREAM_BENCH_PERF names a file: the replica's CPU from the first
// instant until all its tasks are in Redis is then recorded there with perf.
func BenchmarkBurstVsFloor(b *testing.B) {
	n := envInt("CRONSTREAM_BENCH_INSTANT_ENTRIES", 10_000)
	lead := time.Duration(envInt("CRONSTREAM_BENCH_BURST_LEAD", 30+n/1000)) * time.Second
	for range b.N {
		bursts := burst(b, n, lead)
		tick := time.Now().UTC().Truncate(time.Second)
		floor, floorRedis := enqueueFloor(b, n, "floor", func(i int) string { return events.TaskID(taskstate.DefaultPrefix, burstEntry(i), tick) })
		short, shortRedis := enqueueFloor(b, n, "floor with short ids", func(i int) string { return "floor-" + strconv.Itoa(i) })
		// The ids asynq's Enqueue gives a task unless told otherwise.
		asynqIDs, asynqIDsRedis := enqueueFloor(b, n, "floor with asynq's ids", func(int) string { return uuid.NewString() })
		cmds, cmdsRedis := commandsFloor(b, n, floorCommands{checks: true, seeded: true})
		least, leastRedis := commandsFloor(b, n, floorCommands{seeded: true})
		leastFirst, leastFirstRedis := commandsFloor(b, n, floorCommands{})
		b.ReportMetric(floor.Seconds(), "s-floor")
		b.ReportMetric(short.Seconds(), "s-floor-short-ids")
		b.ReportMetric(asynqIDs.Seconds(), "s-floor-asynq-ids")
		b.ReportMetric(cmds.Seconds(), "s-commands")
		b.ReportMetric(cmds.Seconds()/floor.Seconds(), "commands/floor")
		b.ReportMetric(least.Seconds()/floor.Seconds(), "least-commands/floor")
		b.ReportMetric(leastRedis.Seconds()/floor.Seconds(), "least-commands-redis-cpu/floor")
		b.ReportMetric(leastFirst.Seconds()/floor.Seconds(), "least-commands-first/floor")
		b.ReportMetric(leastFirstRedis.Seconds()/floor.Seconds(), "least-commands-first-redis-cpu/floor")
		b.Logf("floor: a bare pipelined enqueue of %d asynq tasks with the burst's task ids %s (redis-server CPU %s), with asynq's own ids (UUIDs) %s (redis-server CPU %s), with ids \"floor-<i>\" (before 2026-12-03) %s (redis-server CPU %s)",
			n, floor.Round(time.Millisecond), floorRedis.Round(time.Millisecond), asynqIDs.Round(time.Millisecond), asynqIDsRedis.Round(time.Millisecond),
			short.Round(time.Millisecond), shortRedis.Round(time.Millisecond))
		b.Logf("the fire script's commands alone %s (redis-server CPU %s), %.2f× the floor; without the task and handover checks %s (redis-server CPU %s), %.2f× the floor",
			cmds.Round(time.Millisecond), cmdsRedis.Round(time.Millisecond), cmds.Seconds()/floor.Seconds(),
			least.Round(time.Millisecond), leastRedis.Round(time.Millisecond), least.Seconds()/floor.Seconds())
		b.Logf("the same without the checks, each watermark written for the first time (an entry's first tick ever): %s (redis-server CPU %s), %.2f× the floor",
			leastFirst.Round(time.Millisecond), leastFirstRedis.Round(time.Millisecond), leastFirst.Seconds()/floor.Seconds())
		for i, ours := range bursts {
			name, suffix := "first tick ever", ""
			if i > 0 {
				name, suffix = "the next minute's", "-next"
			}
			b.ReportMetric(ours.inRedis.Seconds(), "s-all-in-redis"+suffix)
			b.ReportMetric(ours.inStream.Seconds(), "s-all-in-stream"+suffix)
			b.ReportMetric(ms(ours.p50), "lag-p50-ms"+suffix)
			b.ReportMetric(ms(ours.p99), "lag-p99-ms"+suffix)
			b.ReportMetric(ours.inRedis.Seconds()/floor.Seconds(), "all-in-redis/floor"+suffix)
			b.ReportMetric(ours.p99.Seconds()/floor.Seconds(), "lag-p99/floor"+suffix)
			b.ReportMetric(ours.inRedis.Seconds()/asynqIDs.Seconds(), "all-in-redis/floor-asynq-ids"+suffix)
			b.ReportMetric(ours.p99.Seconds()/asynqIDs.Seconds(), "lag-p99/floor-asynq-ids"+suffix)
			b.Logf("%d entries at one instant, %s: all tasks in Redis after %s, all fired events in the stream after %s; lag p50 %s p99 %s max %s; CPU until all in Redis: replica %s, redis-server %s, NATS and harness %s; all in Redis %.2f× the floor (goal ≤ 2), lag p99 %.2f× (goal ≤ 2.5)",
				n, name, ours.inRedis.Round(time.Millisecond), ours.inStream.Round(time.Millisecond), ours.p50.Round(time.Millisecond), ours.p99.Round(time.Millisecond), ours.max.Round(time.Millisecond),
				ours.cpu.replicas.Round(time.Millisecond), ours.cpu.redis.Round(time.Millisecond), ours.cpu.self.Round(time.Millisecond),
				ours.inRedis.Seconds()/floor.Seconds(), ours.p99.Seconds()/floor.Seconds())
			b.Logf("Redis server time per fire by command until all were in Redis, %s: %s", name, commandsPer(ours.commands, n, 12))
			b.Logf("page faults until all were in Redis, %s: replica %d, redis-server %d; the replica's collections %d", name, ours.replicaFaults, ours.redisFaults, ours.collections)
		}
	}
}

type burstResult struct {
	inRedis, inStream time.Duration
	p50, p99, max     time.Duration
	cpu               cpuUse
	// faults: minor page faults of the replica and redis-server, and the
	// replica's collections, until every task was in Redis.
	replicaFaults, redisFaults int64
	collections                int
	// commands: Redis's time by command until every task was in Redis.
	commands []commandTime
}

// burst fires n entries at one instant and again a minute later, and
// returns what each burst took.
func burst(b *testing.B, n int, lead time.Duration) []burstResult {
	s := newSystem(b)
	first := time.Now().UTC().Add(lead).Truncate(time.Second)
	if first.Minute() == 59 {
		first = first.Add(time.Minute) // both instants in one hour: one spec
	}
	instants := []time.Time{first, first.Add(time.Minute)}
	spec := fmt.Sprintf("%d %d,%d %d * * *", first.Second(), first.Minute(), first.Minute()+1, first.Hour())
	s.register(entries("i", spec, n))
	p := s.startReplica("burst")
	waitLoaded(b, []*replicaProc{p}, n, lead)
	// The replica writes asynq's scheduler entries once its entries are
	// loaded: after that, nothing but the bursts are left for it to do.
	visKey := taskstate.SchedulerEntriesKey(taskstate.ReplicaSchedulerID(s.names.Prefix(), "burst"))
	testenv.Eventually(b, time.Until(first), func() bool { return s.rc.Exists(context.Background(), visKey).Val() == 1 }, "replica loaded before the instant")
	if left := time.Until(first); left < 2*time.Second {
		b.Fatalf("the replica loaded %d entries only %s before the instant: raise CRONSTREAM_BENCH_BURST_LEAD", n, left)
	}
	out := make([]burstResult, len(instants))
	for i, instant := range instants {
		want := int64(n * (i + 1))
		waitUntil(instant.Add(-100 * time.Millisecond))
		stopPerf := func() {}
		if i == 0 {
			stopPerf = perfRecord(b, p, os.Getenv("CRONSTREAM_BENCH_PERF"), 999)
		}
		resetCommandStats(b, s.rc)
		gcs, _ := p.metric("go_gc_duration_seconds_count")
		before := s.cpu([]*replicaProc{p})
		replicaFaults, redisFaults := testenv.ProcFaults(p.pid()), testenv.ProcFaults(s.redisPID)
		r := &out[i]
		testenv.Eventually(b, instants[len(instants)-1].Add(10*time.Minute).Sub(instant), func() bool {
			if r.inRedis == 0 && s.pending("default") >= want {
				r.inRedis = time.Since(instant)
				r.cpu = s.cpu([]*replicaProc{p}).sub(before)
				r.replicaFaults, r.redisFaults = testenv.ProcFaults(p.pid())-replicaFaults, testenv.ProcFaults(s.redisPID)-redisFaults
				after, _ := p.metric("go_gc_duration_seconds_count")
				r.collections = int(after - gcs)
				r.commands = commandStats(b, s.rc)
				stopPerf()
			}
			if r.inRedis == 0 || s.activityMsgs() < uint64(want) {
				return false
			}
			r.inStream = time.Since(instant)
			return true
		}, "%d tasks in Redis and their events in the stream", want)
		if i+1 < len(instants) && time.Until(instants[i+1]) < 2*time.Second {
			b.Fatalf("the %s burst took until %s before the next: the bursts overlap", instant.Format(time.TimeOnly), time.Until(instants[i+1]))
		}
	}
	p.stop(b)
	lags := make([][]time.Duration, len(instants))
	for _, f := range s.readFires().fires {
		for i, instant := range instants {
			if f.scheduled.Equal(instant) {
				lags[i] = append(lags[i], f.enqueued.Sub(f.scheduled))
			}
		}
	}
	for i := range out {
		if len(lags[i]) != n {
			b.Errorf("%d fired events of %s in the stream, want %d", len(lags[i]), instants[i].Format(time.TimeOnly), n)
		}
		out[i].p50, out[i].p99, out[i].max = percentile(lags[i], 0.5), percentile(lags[i], 0.99), percentile(lags[i], 1)
	}
	return out
}

// enqueueFloor writes n asynq tasks into a fresh redis-server as asynq's
// Enqueue does (HSET msg, state, pending_since; LPUSH onto the pending
// list), pipelined 1,000 tasks per round trip, and returns the time it took
// and redis-server's CPU meanwhile. The tasks carry the ids and payloads
// the burst's fires write (id(i) names task i), so the floor differs from
// the burst only in what makes a fire exactly once and audited.
func enqueueFloor(b *testing.B, n int, name string, id func(i int) string) (took, redisCPU time.Duration) {
	keys := taskstate.Keys("default")
	return timedWrites(b, name, n, nil, func(ctx context.Context, pipe redis.Pipeliner, flush func()) {
		for i := range n {
			id := id(i)
			msg, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "bench:i", Payload: []byte(`{"id":"` + burstEntry(i) + `"}`),
				ID: id, Queue: "default", Retry: 25, Timeout: 1800})
			if err != nil {
				b.Fatal(err)
			}
			pipe.HSet(ctx, keys.Task(id), "msg", msg, "state", "pending", "pending_since", time.Now().UnixNano())
			pipe.LPush(ctx, keys.Pending(), id)
			if pipe.Len() >= 2000 {
				flush()
			}
		}
	})
}

// burstEntry is the id of the burst's i-th entry (entries("i", ...)).
func burstEntry(i int) string { return fmt.Sprintf("i%06d", i) }

// floorCommands chooses what commandsFloor sends.
type floorCommands struct {
	// checks: the handover markers are read with the watermarks, and each
	// task's EXISTS is sent.
	checks bool
	// seeded: the watermarks exist beforehand (as at every burst after an
	// entry's first), written before the clock starts; else each is
	// written for the first time, as at an entry's first tick ever.
	seeded bool
}

// commandsFloor writes n tasks into a fresh redis-server with the commands
// the fire script's bulk path runs for them, pipelined as enqueueFloor's
// are (1,024 tasks per round trip) but without Lua and without looking at
// the replies: per 64 tasks one MGET of their watermarks (and handover
// markers with checks), an HSET per task (and an EXISTS with checks), one
// LPUSH of their ids, one XADD of their fired records as one multi-record,
// one MSET of their watermarks. It returns the time it took and
// redis-server's CPU meanwhile.
func commandsFloor(b *testing.B, n int, sent floorCommands) (took, redisCPU time.Duration) {
	const chunk, perTrip = 64, 1024
	keys, own := taskstate.Keys("default"), taskstate.Own("", "default")
	prev := time.Now().UTC().Truncate(time.Second)
	tick := prev.Add(time.Minute)
	entry := burstEntry
	var seed func(ctx context.Context, pipe redis.Pipeliner, flush func())
	if sent.seeded {
		seed = func(ctx context.Context, pipe redis.Pipeliner, flush func()) {
			for i := range n {
				pipe.Set(ctx, own.Watermark(entry(i)), strconv.FormatInt(prev.UnixMilli(), 10)+" "+events.TaskID(taskstate.DefaultPrefix, entry(i), prev), 0)
				if pipe.Len() >= perTrip {
					flush()
				}
			}
		}
	}
	tickMS := strconv.FormatInt(tick.UnixMilli(), 10)
	name := "the least commands"
	switch {
	case sent.checks:
		name = "the fire script's commands"
	case !sent.seeded:
		name = "the least commands, first tick ever"
	}
	return timedWrites(b, name, n, seed, func(ctx context.Context, pipe redis.Pipeliner, flush func()) {
		for first := 0; first < n; first += chunk {
			m := min(chunk, n-first)
			reads := make([]string, 0, 2*m)
			marks := make([]any, 0, 2*m)
			ids := make([]any, 0, m)
			recs := []byte(outbox.MultiRecordTag)
			for i := first; i < first+m; i++ {
				e := entry(i)
				id := events.TaskID(taskstate.DefaultPrefix, e, tick)
				reads = append(reads, own.Watermark(e))
				marks = append(marks, own.Watermark(e), tickMS+" "+id)
				ids = append(ids, id)
				f := events.Fired{Entry: e, ScheduledAt: tick, EnqueuedAt: time.Now(), TaskID: id, Queue: "default", Revision: 1, Replica: "floor"}
				recs = outbox.AppendFrame(recs, events.FiredEventID(e, tick), outbox.AppendFiredRecord(nil, &f))
			}
			if sent.checks {
				for i := first; i < first+m; i++ {
					reads = append(reads, own.Handover(entry(i)))
				}
			}
			pipe.MGet(ctx, reads...)
			for i := first; i < first+m; i++ {
				id := ids[i-first].(string)
				msg, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "bench:i", Payload: []byte(`{"id":"` + entry(i) + `"}`),
					ID: id, Queue: "default", Retry: 25, Timeout: 1800})
				if err != nil {
					b.Fatal(err)
				}
				if sent.checks {
					pipe.Exists(ctx, keys.Task(id))
				}
				pipe.HSet(ctx, keys.Task(id), "msg", msg, "state", "pending", "pending_since", time.Now().UnixNano())
			}
			pipe.LPush(ctx, keys.Pending(), ids...)
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: own.Outbox(), Values: []any{"id", outbox.MultiRecordID(events.FiredEventID(entry(first), tick)), "data", recs}})
			pipe.MSet(ctx, marks...)
			if (first+m)%perTrip == 0 {
				flush()
			}
		}
	})
}

// timedWrites starts a fresh redis-server, lets prepare write what must
// exist beforehand, then times write and checks that n tasks are pending
// in "default" after it. Both send their commands through pipe, flush
// sending what it holds (and failing the benchmark on an error). It returns
// write's time and redis-server's CPU meanwhile.
func timedWrites(b *testing.B, name string, n int, prepare, write func(ctx context.Context, pipe redis.Pipeliner, flush func())) (took, redisCPU time.Duration) {
	b.Helper()
	rc := testenv.StartRedis(b, testenv.WithPrivateServer()).Client(b)
	ctx := context.Background()
	pid := testenv.RedisPID(b, rc)
	if err := rc.SAdd(ctx, taskstate.AllQueuesKey, "default").Err(); err != nil {
		b.Fatal(err)
	}
	pipe := rc.Pipeline()
	flush := func() {
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
	}
	if prepare != nil {
		prepare(ctx, pipe, flush)
		flush()
	}
	cpu0, faults := testenv.ProcCPU(pid), testenv.ProcFaults(pid)
	start := time.Now()
	write(ctx, pipe, flush)
	flush()
	took = time.Since(start)
	redisCPU = testenv.ProcCPU(pid) - cpu0
	b.Logf("%s: redis-server page faults %d", name, testenv.ProcFaults(pid)-faults)
	if l := rc.LLen(ctx, taskstate.Keys("default").Pending()).Val(); l != int64(n) {
		b.Fatalf("%s: %d tasks pending, want %d", name, l, n)
	}
	return took, redisCPU
}
