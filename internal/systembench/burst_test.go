package systembench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// BenchmarkBurstVsFloor measures N entries due at the same instant, fired
// by a `cronstream run` process (relay on), beside the floor any
// asynq-compatible writer pays for N tasks: a bare pipelined enqueue (one
// HSET and one LPUSH per task, as asynq's Enqueue writes them, 1,000 tasks
// per round trip, encoding included) into a fresh redis-server in the same
// run.
//
// The entries tick daily at one second of the day chosen lead seconds
// ahead, so the replica has loaded them (every entry known, its first
// write to Redis done) well before the instant. It reports the time from
// the instant until all N tasks are in Redis and until all N fired events
// are in the activity stream, the fire lag p50/p99 (from the fired
// events), the floor's time, and the ratios all-in-Redis/floor (goal ≤ 2)
// and lag p99/floor (goal ≤ 2.5).
//
//	CRONSTREAM_BENCH_INSTANT_ENTRIES=100000 go test -run '^$' -bench BenchmarkBurstVsFloor -benchtime 1x -timeout 30m -v ./internal/systembench/
//
// CRONSTREAM_BENCH_INSTANT_ENTRIES is N (default 10,000);
// CRONSTREAM_BENCH_BURST_LEAD is the lead in seconds (default 30 + N/1000);
// CRONSTREAM_BENCH_PERF names a file: the replica's CPU from the instant
// until all tasks are in Redis is then recorded there with perf.
func BenchmarkBurstVsFloor(b *testing.B) {
	n := envInt("CRONSTREAM_BENCH_INSTANT_ENTRIES", 10_000)
	lead := time.Duration(envInt("CRONSTREAM_BENCH_BURST_LEAD", 30+n/1000)) * time.Second
	for range b.N {
		ours := burst(b, n, lead)
		floor, floorRedis := enqueueFloor(b, n)
		b.ReportMetric(ours.inRedis.Seconds(), "s-all-in-redis")
		b.ReportMetric(ours.inStream.Seconds(), "s-all-in-stream")
		b.ReportMetric(ms(ours.p50), "lag-p50-ms")
		b.ReportMetric(ms(ours.p99), "lag-p99-ms")
		b.ReportMetric(floor.Seconds(), "s-floor")
		b.ReportMetric(ours.inRedis.Seconds()/floor.Seconds(), "all-in-redis/floor")
		b.ReportMetric(ours.p99.Seconds()/floor.Seconds(), "lag-p99/floor")
		b.Logf("%d entries at one instant: all tasks in Redis after %s, all fired events in the stream after %s; lag p50 %s p99 %s max %s; CPU until all in Redis: replica %s, redis-server %s, NATS and harness %s",
			n, ours.inRedis.Round(time.Millisecond), ours.inStream.Round(time.Millisecond), ours.p50.Round(time.Millisecond), ours.p99.Round(time.Millisecond), ours.max.Round(time.Millisecond),
			ours.cpu.replicas.Round(time.Millisecond), ours.cpu.redis.Round(time.Millisecond), ours.cpu.self.Round(time.Millisecond))
		b.Logf("floor: a bare pipelined enqueue of %d asynq tasks %s (redis-server CPU %s); all in Redis %.2f× the floor (goal ≤ 2), lag p99 %.2f× (goal ≤ 2.5)",
			n, floor.Round(time.Millisecond), floorRedis.Round(time.Millisecond), ours.inRedis.Seconds()/floor.Seconds(), ours.p99.Seconds()/floor.Seconds())
		b.Logf("Redis server time per fire by command until all were in Redis: %s", commandsPer(ours.commands, n, 12))
	}
}

type burstResult struct {
	inRedis, inStream time.Duration
	p50, p99, max     time.Duration
	cpu               cpuUse
	// commands: Redis's time by command until every task was in Redis.
	commands []commandTime
}

func burst(b *testing.B, n int, lead time.Duration) burstResult {
	s := newSystem(b)
	instant := time.Now().UTC().Add(lead).Truncate(time.Second)
	spec := fmt.Sprintf("%d %d %d * * *", instant.Second(), instant.Minute(), instant.Hour())
	s.register(entries("i", spec, n))
	p := s.startReplica("burst")
	waitLoaded(b, []*replicaProc{p}, n, lead)
	// The replica writes asynq's scheduler entries once its entries are
	// loaded: after that, nothing but the burst is left for it to do.
	visKey := taskstate.SchedulerEntriesKey(taskstate.SchedulerID(s.names.Prefix()))
	testenv.Eventually(b, time.Until(instant), func() bool { return s.rc.Exists(context.Background(), visKey).Val() == 1 }, "replica loaded before the instant")
	if left := time.Until(instant); left < 2*time.Second {
		b.Fatalf("the replica loaded %d entries only %s before the instant: raise CRONSTREAM_BENCH_BURST_LEAD", n, left)
	}
	waitUntil(instant.Add(-100 * time.Millisecond))
	stopPerf := perfRecord(b, p, os.Getenv("CRONSTREAM_BENCH_PERF"), 999)
	resetCommandStats(b, s.rc)
	before := s.cpu([]*replicaProc{p})
	var out burstResult
	testenv.Eventually(b, 10*time.Minute, func() bool {
		if out.inRedis == 0 && s.pending("default") >= int64(n) {
			out.inRedis = time.Since(instant)
			out.cpu = s.cpu([]*replicaProc{p}).sub(before)
			out.commands = commandStats(b, s.rc)
			stopPerf()
		}
		if out.inRedis == 0 || s.activityMsgs() < uint64(n) {
			return false
		}
		out.inStream = time.Since(instant)
		return true
	}, "%d tasks in Redis and their events in the stream", n)
	p.stop(b)
	var lags []time.Duration
	for _, f := range s.readFires().fires {
		lags = append(lags, f.enqueued.Sub(f.scheduled))
	}
	if len(lags) != n {
		b.Errorf("%d fired events in the stream, want %d", len(lags), n)
	}
	out.p50, out.p99, out.max = percentile(lags, 0.5), percentile(lags, 0.99), percentile(lags, 1)
	return out
}

// enqueueFloor writes n asynq tasks into a fresh redis-server as asynq's
// Enqueue does (HSET msg, state, pending_since; LPUSH onto the pending
// list), pipelined 1,000 tasks per round trip, and returns the time it took
// and redis-server's CPU meanwhile.
func enqueueFloor(b *testing.B, n int) (took, redisCPU time.Duration) {
	b.Helper()
	rd := testenv.StartRedis(b, testenv.WithPrivateServer())
	rc := rd.Client(b)
	ctx := context.Background()
	pid := redisPID(b, rc)
	keys := taskstate.Keys("default")
	if err := rc.SAdd(ctx, taskstate.AllQueuesKey, "default").Err(); err != nil {
		b.Fatal(err)
	}
	cpu0 := procCPU(pid)
	start := time.Now()
	pipe := rc.Pipeline()
	for i := range n {
		id := "floor-" + strconv.Itoa(i)
		msg, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "bench:i", Payload: []byte(`{"id":"i` + strconv.Itoa(i) + `"}`),
			ID: id, Queue: "default", Retry: 25, Timeout: 1800})
		if err != nil {
			b.Fatal(err)
		}
		pipe.HSet(ctx, keys.Task(id), "msg", msg, "state", "pending", "pending_since", time.Now().UnixNano())
		pipe.LPush(ctx, keys.Pending(), id)
		if pipe.Len() >= 2000 {
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	took = time.Since(start)
	redisCPU = procCPU(pid) - cpu0
	if l := rc.LLen(ctx, keys.Pending()).Val(); l != int64(n) {
		b.Fatalf("floor: %d tasks pending, want %d", l, n)
	}
	return took, redisCPU
}
