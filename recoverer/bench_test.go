package recoverer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/recoverer"
	"github.com/cronstream/cronstream/taskstate"
)

// BenchmarkPass measures a full recoverer pass (Recoverer.Pass: orphan
// walk, bounded listing, asynq's decision, one CloudEvent outbox record per
// task written with the move, aggregation-set check) over a mass crash: N
// lease-expired tasks with one tied lease score — a whole worker pool died
// in the same second — in an active list that also holds N/10 live tasks,
// in dequeue order (the oldest tasks at the list's tail, as asynq's LPUSH
// and RPOPLPUSH leave them; the lease set returns tied members in id order,
// which is unrelated to list order).
//
// Each iteration seeds the queue, runs our pass, seeds an identical queue
// (same seed, same ids) and runs asynq v0.26.0's recovery path on it in the
// same Redis: one listing script over the whole expired range, then one
// Retry script per task whose LREM with count 0 scans the active list
// (asynq-compat.md §3.10, §3.15, §4.2). The baseline Lua and its driver
// are copied from taskstate's recover_bench_test.go (test files cannot be
// imported); both paths decode, decide and re-encode every message.
//
// Metrics: tasks/s (ours), asynq-tasks/s, x-asynq (the ratio), and
// max-script-ms, the slowest single script call of our pass (SLOWLOG).
//
//	go test -run '^$' -bench BenchmarkPass -benchtime 1x -count 3 ./recoverer/
func BenchmarkPass(b *testing.B) {
	r := testenv.StartRedis(b, testenv.WithPrivateServer())
	rc := r.Client(b)
	ctx := context.Background()
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "1000"}, {"slowlog-max-len", "100000"}} {
		if err := rc.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			b.Fatal(err)
		}
	}
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			var ours, theirs time.Duration
			var slowest time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				now := time.Now()
				live := seedMassCrash(b, rc, n, now)
				if err := rc.SlowLogReset(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				rec := recoverer.New(recoverer.Config{
					Store: taskstate.New(rc), Names: names, ReplicaID: "bench", Queues: []string{benchQueue},
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				})
				b.StartTimer()
				start := time.Now()
				res := rec.Pass(ctx)
				ours += time.Since(start)
				b.StopTimer()
				if res.Err != nil || res.Moved != n {
					b.Fatalf("our pass moved %d of %d: %v", res.Moved, n, res.Err)
				}
				checkRecovered(b, rc, n, live)
				if got := outboxLen(b, rc, benchQueue); got != int64(n) {
					b.Fatalf("outbox has %d records, want %d", got, n)
				}
				slowest = max(slowest, slowestScript(b, rc))

				live = seedMassCrash(b, rc, n, now)
				start = time.Now()
				moved, err := recoverAsynq(ctx, rc, now)
				theirs += time.Since(start)
				if err != nil || moved != n {
					b.Fatalf("asynq's path moved %d of %d: %v", moved, n, err)
				}
				checkRecovered(b, rc, n, live)
			}
			oursRate := float64(n) * float64(b.N) / ours.Seconds()
			theirRate := float64(n) * float64(b.N) / theirs.Seconds()
			b.ReportMetric(oursRate, "tasks/s")
			b.ReportMetric(theirRate, "asynq-tasks/s")
			b.ReportMetric(oursRate/theirRate, "x-asynq")
			b.ReportMetric(float64(slowest.Microseconds())/1000, "max-script-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

const benchQueue = "bench"

// seedMassCrash empties Redis and writes n dead tasks and n/10 live ones as
// asynq's Dequeue leaves them, the same for the same n. It returns the
// number of live tasks.
func seedMassCrash(b testing.TB, rc redis.UniversalClient, n int, now time.Time) int {
	ctx := context.Background()
	if err := rc.FlushDB(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	k := taskstate.Keys(benchQueue)
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	dead := float64(now.Add(-time.Minute).Unix())
	alive := float64(now.Add(30 * time.Second).Unix())
	live := 0
	pipe := rc.Pipeline()
	pipe.SAdd(ctx, taskstate.AllQueuesKey, benchQueue)
	for i := 0; i < n+n/10; i++ {
		isLive := rng.IntN(11) == 0 && live < n/10
		if !isLive && i-live >= n {
			isLive = true
		}
		id := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", rng.Uint32(), rng.Uint32()&0xffff, rng.Uint32()&0xfff,
			rng.Uint32()&0xfff, rng.Uint64()&0xffffffffffff)
		msg, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "email:send", Payload: []byte(`{"user_id":42,"template":"welcome"}`),
			ID: id, Queue: benchQueue, Retry: 25, Timeout: 1800, Headers: map[string]string{"trace": "abc"}})
		if err != nil {
			b.Fatal(err)
		}
		score := dead
		if isLive {
			score = alive
			live++
		}
		pipe.HSet(ctx, k.Task(id), "msg", msg, "state", taskstate.StateActive)
		pipe.LPush(ctx, k.Active(), id)
		pipe.ZAdd(ctx, k.Lease(), redis.Z{Score: score, Member: id})
		if pipe.Len() >= 3000 {
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	return live
}

// checkRecovered checks the state after a path: only live tasks active,
// every dead one in the retry set and counted once.
func checkRecovered(b testing.TB, rc redis.UniversalClient, n, live int) {
	ctx := context.Background()
	k := taskstate.Keys(benchQueue)
	if l, _ := rc.LLen(ctx, k.Active()).Result(); l != int64(live) {
		b.Fatalf("active list has %d, want the %d live tasks", l, live)
	}
	if c, _ := rc.ZCard(ctx, k.Retry()).Result(); c != int64(n) {
		b.Fatalf("retry set has %d, want %d", c, n)
	}
	if c, _ := rc.Get(ctx, k.FailedTotal()).Int(); c != n {
		b.Fatalf("failed counter %d, want %d", c, n)
	}
}

// slowestScript returns the longest SLOWLOG entry of a script call.
func slowestScript(b testing.TB, rc redis.UniversalClient) time.Duration {
	logs, err := rc.SlowLogGet(context.Background(), -1).Result()
	if err != nil {
		b.Fatal(err)
	}
	var slowest time.Duration
	for _, l := range logs {
		if len(l.Args) > 0 && (strings.EqualFold(l.Args[0], "evalsha") || strings.EqualFold(l.Args[0], "eval")) {
			slowest = max(slowest, l.Duration)
		}
	}
	return slowest
}

// --- asynq v0.26.0's recovery path (copied from taskstate's benchmark) -------

// benchRetryDelay is asynq's DefaultRetryDelayFunc (asynq-compat.md §5).
func benchRetryDelay(n int32) time.Duration {
	s := int(math.Pow(float64(n), 4)) + 15 + rand.IntN(30)*(int(n)+1)
	return time.Duration(s) * time.Second
}

// asynqListLeaseExpiredScript is asynq's listing (§3.15): every msg whose
// lease score is at or before the cutoff, in one call.
var asynqListLeaseExpiredScript = redis.NewScript(`
local res = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])) do
  local msg = redis.call('HGET', ARGV[2] .. id, 'msg')
  if msg then res[#res+1] = msg end
end
return res
`)

// asynqRetryScript is asynq's Retry (§3.10), written from the fact sheet.
// KEYS: task, active, lease, retry, processed:<day>, failed:<day>,
// processed, failed. ARGV: id, msg, process-at, stats expiry, is-failure,
// MaxInt64.
var asynqRetryScript = redis.NewScript(`
if redis.call('LREM', KEYS[2], 0, ARGV[1]) == 0 then
  return redis.error_reply('NOT FOUND')
end
if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then
  return redis.error_reply('NOT FOUND')
end
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[1], 'msg', ARGV[2], 'state', 'retry')
if tonumber(ARGV[5]) == 1 then
  if tonumber(redis.call('INCR', KEYS[5])) == 1 then
    redis.call('EXPIREAT', KEYS[5], ARGV[4])
  end
  if tonumber(redis.call('INCR', KEYS[6])) == 1 then
    redis.call('EXPIREAT', KEYS[6], ARGV[4])
  end
  local total = redis.call('GET', KEYS[7])
  if tonumber(total) == tonumber(ARGV[6]) then
    redis.call('SET', KEYS[7], 1)
    redis.call('SET', KEYS[8], 1)
  else
    redis.call('INCR', KEYS[7])
    redis.call('INCR', KEYS[8])
  end
end
return redis.status_reply('OK')
`)

// recoverAsynq is asynq's recoverer pass: list everything, then retry task
// by task, one round trip each.
func recoverAsynq(ctx context.Context, rc redis.UniversalClient, now time.Time) (int, error) {
	k := taskstate.Keys(benchQueue)
	cutoff := now.Add(-30 * time.Second)
	raw, err := asynqListLeaseExpiredScript.Run(ctx, rc, []string{k.Lease()}, cutoff.Unix(), k.TaskPrefix()).StringSlice()
	if err != nil {
		return 0, err
	}
	moved := 0
	for _, b := range raw {
		msg, err := taskstate.DecodeTaskMessage([]byte(b))
		if err != nil {
			return moved, err
		}
		retryAt := now.Add(benchRetryDelay(msg.Retried))
		msg.Retried++
		msg.ErrorMsg = taskstate.ErrLeaseExpiredText
		msg.LastFailedAt = now.Unix()
		enc, err := taskstate.EncodeTaskMessage(msg)
		if err != nil {
			return moved, err
		}
		err = asynqRetryScript.Run(ctx, rc,
			[]string{k.Task(msg.ID), k.Active(), k.Lease(), k.Retry(), k.Processed(now), k.Failed(now), k.ProcessedTotal(), k.FailedTotal()},
			msg.ID, enc, retryAt.Unix(), now.Add(90*24*time.Hour).Unix(), 1, int64(math.MaxInt64)).Err()
		if err != nil {
			return moved, fmt.Errorf("retry %s: %w", msg.ID, err)
		}
		moved++
	}
	return moved, nil
}
