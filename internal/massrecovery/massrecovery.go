// Package massrecovery is the benchmark scene shared by taskstate's and
// recoverer's recovery benchmarks: a mass crash seeded as asynq's Dequeue
// leaves it, and asynq v0.26.0's own recovery path over it (listing script,
// then one Retry script per task, as docs/asynq-compat.md describes them;
// the Lua written from that description) as the baseline. Only tests import
// it.
package massrecovery

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/redisscript"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// Queue is the queue the scene lives in.
const Queue = "bench"

// asynqStatsTTL is how long asynq keeps its daily counters (90 days).
const asynqStatsTTL = 90 * 24 * time.Hour

// StartRedis starts a private redis-server for the scene whose SLOWLOG
// keeps every call that takes longer than slowerThan (up to 100,000 of
// them), for ScriptDurations.
func StartRedis(tb testing.TB, slowerThan time.Duration) *redis.Client {
	rc := testenv.StartRedis(tb, testenv.WithPrivateServer()).Client(tb)
	ctx := context.Background()
	for _, kv := range [][2]string{
		{"slowlog-log-slower-than", strconv.FormatInt(slowerThan.Microseconds(), 10)},
		{"slowlog-max-len", "100000"},
	} {
		if err := rc.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			tb.Fatal(err)
		}
	}
	return rc
}

// Seed empties Redis and writes n dead tasks (lease expired a minute ago)
// and n/10 live ones in one active list, in dequeue order, the same for the
// same n; then it empties the SLOWLOG, so ScriptDurations after a path
// reports that path's calls. It returns the number of live tasks.
func Seed(tb testing.TB, rc redis.UniversalClient, n int, now time.Time) int {
	ctx := context.Background()
	if err := rc.FlushDB(ctx).Err(); err != nil {
		tb.Fatal(err)
	}
	k := taskstate.Keys(Queue)
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	dead := float64(now.Add(-time.Minute).Unix())
	alive := float64(now.Add(30 * time.Second).Unix())
	live := 0
	pipe := rc.Pipeline()
	pipe.SAdd(ctx, taskstate.AllQueuesKey, Queue)
	for i := 0; i < n+n/10; i++ {
		isLive := rng.IntN(11) == 0 && live < n/10
		if !isLive && i-live >= n {
			isLive = true
		}
		id := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", rng.Uint32(), rng.Uint32()&0xffff, rng.Uint32()&0xfff,
			rng.Uint32()&0xfff, rng.Uint64()&0xffffffffffff)
		msg, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "email:send", Payload: []byte(`{"user_id":42,"template":"welcome"}`),
			ID: id, Queue: Queue, Retry: 25, Timeout: 1800, Headers: map[string]string{"trace": "abc"}})
		if err != nil {
			tb.Fatal(err)
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
				tb.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		tb.Fatal(err)
	}
	if err := rc.SlowLogReset(ctx).Err(); err != nil {
		tb.Fatal(err)
	}
	return live
}

// Check fails tb unless only the live tasks are active and every dead one
// is in the retry set and counted once.
func Check(tb testing.TB, rc redis.UniversalClient, n, live int) {
	ctx := context.Background()
	k := taskstate.Keys(Queue)
	if l, _ := rc.LLen(ctx, k.Active()).Result(); l != int64(live) {
		tb.Fatalf("active list has %d, want the %d live tasks", l, live)
	}
	if c, _ := rc.ZCard(ctx, k.Retry()).Result(); c != int64(n) {
		tb.Fatalf("retry set has %d, want %d", c, n)
	}
	if c, _ := rc.Get(ctx, k.FailedTotal()).Int(); c != n {
		tb.Fatalf("failed counter %d, want %d", c, n)
	}
}

// ScriptDurations returns the SLOWLOG durations of script calls (EVAL,
// EVALSHA) since the last SLOWLOG RESET: Seed runs none and ends with a
// reset, so after a path they are that path's.
func ScriptDurations(tb testing.TB, rc redis.UniversalClient) []time.Duration {
	logs, err := rc.SlowLogGet(context.Background(), -1).Result()
	if err != nil {
		tb.Fatal(err)
	}
	var out []time.Duration
	for _, l := range logs {
		if len(l.Args) > 0 && (strings.EqualFold(l.Args[0], "evalsha") || strings.EqualFold(l.Args[0], "eval")) {
			out = append(out, l.Duration)
		}
	}
	return out
}

// RetryDelay is asynq's DefaultRetryDelayFunc (docs/asynq-compat.md "Retry delay").
func RetryDelay(n int32) time.Duration {
	s := int(math.Pow(float64(n), 4)) + 15 + rand.IntN(30)*(int(n)+1)
	return time.Duration(s) * time.Second
}

// asynqListLeaseExpiredScript is asynq's ListLeaseExpired: every msg whose
// lease score is at or before the cutoff, in one call.
var asynqListLeaseExpiredScript = redisscript.New(`
local res = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])) do
  local msg = redis.call('HGET', ARGV[2] .. id, 'msg')
  if msg then res[#res+1] = msg end
end
return res
`)

// asynqRetryScript is asynq's Retry (docs/asynq-compat.md "Retry and archive").
// KEYS: task, active, lease, retry, processed:<day>, failed:<day>,
// processed, failed. ARGV: id, msg, process-at, stats expiry, is-failure,
// MaxInt64.
var asynqRetryScript = redisscript.New(`
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

// RecoverAsynq is asynq's recoverer pass over the scene: list everything,
// then retry task by task, one round trip each.
func RecoverAsynq(ctx context.Context, rc redis.UniversalClient, now time.Time) (int, error) {
	k := taskstate.Keys(Queue)
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
		retryAt := now.Add(RetryDelay(msg.Retried))
		msg.Retried++
		msg.ErrorMsg = taskstate.ErrLeaseExpiredText
		msg.LastFailedAt = now.Unix()
		enc, err := taskstate.EncodeTaskMessage(msg)
		if err != nil {
			return moved, err
		}
		err = asynqRetryScript.Run(ctx, rc,
			[]string{k.Task(msg.ID), k.Active(), k.Lease(), k.Retry(), k.Processed(now), k.Failed(now), k.ProcessedTotal(), k.FailedTotal()},
			msg.ID, enc, retryAt.Unix(), now.Add(asynqStatsTTL).Unix(), 1, int64(math.MaxInt64)).Err()
		if err != nil {
			return moved, fmt.Errorf("retry %s: %w", msg.ID, err)
		}
		moved++
	}
	return moved, nil
}
