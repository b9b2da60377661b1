package taskstate

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/testenv"
)

// BenchmarkRecover measures recovering a mass crash: N lease-expired tasks
// with one tied lease score (a worker pool died in the same second) in an
// active list that also holds N/10 live tasks, in dequeue order. Beside our
// path (ListLeaseExpired + RecoverBatch) it runs asynq v0.26.0's path as a
// baseline on the same Redis in the same run: one listing script over the
// whole lease range, then one Retry script per task whose LREM with count 0
// scans the active list (asynq-compat.md §3.10, §3.15; the Lua below is
// written from that fact sheet). Both decide and re-encode every message.
//
// Metrics: tasks/s (wall clock); redis-cpu-µs/task, the Redis server's CPU
// time per task, which stays meaningful on a busy machine; and the SLOWLOG
// durations of that path's script calls (p50, p99, max, and how many took
// over 10 ms). SLOWLOG measures wall time inside Redis, so on a machine
// shared with other work a descheduled Redis shows up as a slow call. Run
// with:
//
//	go test -run '^$' -bench BenchmarkRecover -benchtime 1x ./taskstate/
func BenchmarkRecover(b *testing.B) {
	r := testenv.StartRedis(b, testenv.WithPrivateServer())
	rc := r.Client(b)
	ctx := context.Background()
	if err := rc.ConfigSet(ctx, "slowlog-log-slower-than", "200").Err(); err != nil {
		b.Fatal(err)
	}
	if err := rc.ConfigSet(ctx, "slowlog-max-len", "100000").Err(); err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("N=%d/cronstream", n), func(b *testing.B) {
			benchRecover(b, rc, n, recoverOurs, recoverScript, listLeaseExpiredScript, trimArchiveScript)
		})
		b.Run(fmt.Sprintf("N=%d/asynq", n), func(b *testing.B) {
			benchRecover(b, rc, n, recoverAsynq, asynqRetryScript, asynqListLeaseExpiredScript)
		})
	}
}

const benchQueue = "bench"

type recoverPath func(ctx context.Context, rc redis.UniversalClient, now time.Time) (int, error)

func benchRecover(b *testing.B, rc redis.UniversalClient, n int, path recoverPath, scripts ...*redis.Script) {
	ctx := context.Background()
	var (
		calls    []time.Duration
		redisCPU time.Duration
	)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		now := time.Now()
		live := seedMassCrash(b, rc, n, now)
		if err := rc.SlowLogReset(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		cpu0 := redisCPUTime(b, rc)
		b.StartTimer()
		moved, err := path(ctx, rc, now)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		redisCPU += redisCPUTime(b, rc) - cpu0
		if moved != n {
			b.Fatalf("moved %d tasks, want %d", moved, n)
		}
		k := Keys(benchQueue)
		if l, _ := rc.LLen(ctx, k.Active()).Result(); l != int64(live) {
			b.Fatalf("active list has %d, want the %d live tasks", l, live)
		}
		if c, _ := rc.ZCard(ctx, k.Retry()).Result(); c != int64(n) {
			b.Fatalf("retry set has %d, want %d", c, n)
		}
		if c, _ := rc.Get(ctx, k.FailedTotal()).Int(); c != n {
			b.Fatalf("failed counter %d, want %d", c, n)
		}
		calls = append(calls, scriptDurations(b, rc, scripts)...)
		b.StartTimer()
	}
	tasks := float64(n) * float64(b.N)
	b.ReportMetric(tasks/b.Elapsed().Seconds(), "tasks/s")
	b.ReportMetric(float64(redisCPU.Microseconds())/tasks, "redis-cpu-µs/task")
	slices.Sort(calls)
	over := 0
	for _, d := range calls {
		if d > 10*time.Millisecond {
			over++
		}
	}
	if len(calls) > 0 {
		b.ReportMetric(ms(calls[len(calls)/2]), "p50-script-ms")
		b.ReportMetric(ms(calls[len(calls)*99/100]), "p99-script-ms")
		b.ReportMetric(ms(calls[len(calls)-1]), "max-script-ms")
	}
	b.ReportMetric(float64(over), "scripts>10ms")
	b.ReportMetric(0, "ns/op")
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// redisCPUTime is the Redis server's user+system CPU time so far: unlike
// wall time it does not grow when other processes share the machine.
func redisCPUTime(b *testing.B, rc redis.UniversalClient) time.Duration {
	info, err := rc.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var secs float64
	for _, line := range strings.Split(info, "\r\n") {
		name, v, ok := strings.Cut(line, ":")
		if ok && (name == "used_cpu_user" || name == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			secs += f
		}
	}
	return time.Duration(secs * float64(time.Second))
}

// seedMassCrash empties Redis and writes n dead tasks and n/10 live ones as
// asynq's Dequeue leaves them. It returns the number of live tasks.
func seedMassCrash(b testing.TB, rc redis.UniversalClient, n int, now time.Time) int {
	ctx := context.Background()
	if err := rc.FlushDB(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	k := Keys(benchQueue)
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	dead := float64(now.Add(-time.Minute).Unix())
	alive := float64(now.Add(30 * time.Second).Unix())
	live := 0
	pipe := rc.Pipeline()
	for i := 0; i < n+n/10; i++ {
		isLive := rng.IntN(11) == 0 && live < n/10
		if !isLive && i-live >= n {
			isLive = true
		}
		id := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", rng.Uint32(), rng.Uint32()&0xffff, rng.Uint32()&0xfff,
			rng.Uint32()&0xfff, rng.Uint64()&0xffffffffffff)
		msg, err := EncodeTaskMessage(&TaskMessage{Type: "email:send", Payload: []byte(`{"user_id":42,"template":"welcome"}`),
			ID: id, Queue: benchQueue, Retry: 25, Timeout: 1800, Headers: map[string]string{"trace": "abc"}})
		if err != nil {
			b.Fatal(err)
		}
		score := dead
		if isLive {
			score = alive
			live++
		}
		pipe.HSet(ctx, k.Task(id), "msg", msg, "state", StateActive)
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

// scriptDurations returns the SLOWLOG durations of the calls of scripts
// (every call above the 200 µs threshold set by BenchmarkRecover).
func scriptDurations(b *testing.B, rc redis.UniversalClient, scripts []*redis.Script) []time.Duration {
	logs, err := rc.SlowLogGet(context.Background(), -1).Result()
	if err != nil {
		b.Fatal(err)
	}
	var out []time.Duration
	for _, l := range logs {
		if len(l.Args) < 2 || !strings.EqualFold(l.Args[0], "evalsha") {
			continue
		}
		for _, s := range scripts {
			if l.Args[1] == s.Hash() {
				out = append(out, l.Duration)
			}
		}
	}
	return out
}

// benchRetryDelay is asynq's DefaultRetryDelayFunc (asynq-compat.md §5).
func benchRetryDelay(n int32) time.Duration {
	s := int(math.Pow(float64(n), 4)) + 15 + rand.IntN(30)*(int(n)+1)
	return time.Duration(s) * time.Second
}

// recoverOurs is a recoverer pass on our path: bounded listing, asynq's
// decision, one outbox record per task, RecoverBatch per page.
func recoverOurs(ctx context.Context, rc redis.UniversalClient, now time.Time) (int, error) {
	s := New(rc)
	cutoff := now.Add(-20 * time.Second)
	moved, offset := 0, 0
	for {
		tasks, bad, err := s.ListLeaseExpiredFrom(ctx, benchQueue, cutoff, offset, 10_000)
		if err != nil {
			return moved, err
		}
		if len(tasks)+len(bad) == 0 {
			return moved, nil
		}
		offset += len(bad)
		ds := make([]Decision, 0, len(tasks))
		for _, le := range tasks {
			d, err := le.Retry(now.Add(benchRetryDelay(le.Msg.Retried)), ErrLeaseExpiredText, true, now)
			if err != nil {
				return moved, err
			}
			d.Record = Record{ID: "retried:" + le.Msg.ID, Data: []byte(`{"type":"cronstream.task.retried","task_id":"` + le.Msg.ID + `"}`)}
			ds = append(ds, d)
		}
		out, err := s.RecoverBatch(ctx, "bench", benchQueue, cutoff, ds)
		if err != nil {
			return moved, err
		}
		for _, o := range out {
			if o.Status.Moved() {
				moved++
			} else if o.Status != RecoverSkippedGone {
				offset++
			}
		}
	}
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
	k := Keys(benchQueue)
	cutoff := now.Add(-30 * time.Second)
	raw, err := asynqListLeaseExpiredScript.Run(ctx, rc, []string{k.Lease()}, cutoff.Unix(), k.TaskPrefix()).StringSlice()
	if err != nil {
		return 0, err
	}
	moved := 0
	for _, b := range raw {
		msg, err := DecodeTaskMessage([]byte(b))
		if err != nil {
			return moved, err
		}
		retryAt := now.Add(benchRetryDelay(msg.Retried))
		msg.Retried++
		msg.ErrorMsg = ErrLeaseExpiredText
		msg.LastFailedAt = now.Unix()
		enc, err := EncodeTaskMessage(msg)
		if err != nil {
			return moved, err
		}
		err = asynqRetryScript.Run(ctx, rc,
			[]string{k.Task(msg.ID), k.Active(), k.Lease(), k.Retry(), k.Processed(now), k.Failed(now), k.ProcessedTotal(), k.FailedTotal()},
			msg.ID, enc, retryAt.Unix(), now.Add(statsTTL).Unix(), 1, int64(math.MaxInt64)).Err()
		if err != nil {
			return moved, fmt.Errorf("retry %s: %w", msg.ID, err)
		}
		moved++
	}
	return moved, nil
}
