package taskstate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/testenv"
)

// BenchmarkFireOnce compares, on one Redis in one run, the ways of firing a
// tick's worth of due entries (benchFiresPerOp distinct entries of one queue,
// each op the next tick of all of them):
//
//   - once: one FireOnce call (one round trip) per fire;
//   - pipeline: FireBatch shape with one script call per fire, all in one
//     pipeline;
//   - batch-N: FireBatch with N fires per script call (fireCallSizes is
//     what FireBatch uses), each with the task message of an entry without
//     tick_headers (plain: the entry's own headers, one map every fire
//     shares, as the scheduler shares it) and of one with (tick-headers: a
//     map per fire holding the entry's own headers, the entry and the
//     tick, built by events.TaskHeaders as the scheduler builds it).
//
// Run: go test -run '^$' -bench BenchmarkFireOnce -benchtime 3x ./internal/taskstate/
func BenchmarkFireOnce(b *testing.B) {
	const benchFiresPerOp = 256
	rc := testenv.StartRedis(b).Client(b)
	s := New(rc)
	ctx := context.Background()
	own := map[string]string{"source": "cron"}
	plain := func(entry string, tick, prev time.Time) Fire {
		f := tickFire(entry, "bench", tick, prev)
		f.Msg.Headers = own
		return f
	}
	withTickHeaders := func(entry string, tick, prev time.Time) Fire {
		f := tickFire(entry, "bench", tick, prev)
		e := contract.Entry{ID: entry, Task: contract.Task{Headers: own}, TickHeaders: true}
		f.Msg.Headers = contract.TaskHeaders(e, contract.FormatTaskTick(tick), "", false)
		return f
	}

	run := func(b *testing.B, build func(entry string, tick, prev time.Time) Fire, fire func(fires []Fire) ([]FireResult, error)) {
		if err := rc.FlushDB(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		entries := make([]string, benchFiresPerOp)
		for i := range entries {
			entries[i] = fmt.Sprintf("bench-%04d", i)
		}
		fires := make([]Fire, benchFiresPerOp)
		tick := 0
		if err := rc.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			tick++
			var prev time.Time
			if tick > 1 {
				prev = tickAt(tick - 1)
			}
			for i, e := range entries {
				fires[i] = build(e, tickAt(tick), prev)
			}
			res, err := fire(fires)
			if err != nil {
				b.Fatal(err)
			}
			for i := range res {
				if res[i].Status != StatusFired {
					b.Fatalf("fire %d: %s", i, res[i].Status)
				}
			}
		}
		b.StopTimer()
		fired := float64(tick * benchFiresPerOp)
		b.ReportMetric(fired/b.Elapsed().Seconds(), "fires/s")
		b.ReportMetric(scriptMicros(b, rc)/fired, "redis-µs/fire")
		b.ReportMetric(taskBytes(b, rc, "bench", entries[0], tickAt(tick)), "msg-bytes")
	}

	b.Run("once", func(b *testing.B) {
		run(b, plain, func(fires []Fire) ([]FireResult, error) {
			out := make([]FireResult, len(fires))
			for i := range fires {
				r, err := s.FireOnce(ctx, testFences, fires[i])
				if err != nil {
					return nil, err
				}
				out[i] = r
			}
			return out, nil
		})
	})
	b.Run("pipeline", func(b *testing.B) {
		run(b, plain, func(fires []Fire) ([]FireResult, error) {
			return s.fireBatch(ctx, testFences, fires, nil, callSizes{1, 1})
		})
	})
	for _, n := range []int{16, 64, 256} {
		b.Run(fmt.Sprintf("batch-%d", n), func(b *testing.B) {
			for _, m := range []struct {
				name  string
				build func(entry string, tick, prev time.Time) Fire
			}{{"plain", plain}, {"tick-headers", withTickHeaders}} {
				b.Run(m.name, func(b *testing.B) {
					run(b, m.build, func(fires []Fire) ([]FireResult, error) {
						return s.fireBatch(ctx, testFences, fires, nil, callSizes{n, n})
					})
				})
			}
		})
	}
}

// taskBytes is the length of the stored message of entry's task of tick.
func taskBytes(b *testing.B, rc *redis.Client, queue, entry string, tick time.Time) float64 {
	msg, err := rc.HGet(context.Background(), Keys(queue).Task(taskIDFor(entry, tick)), "msg").Result()
	if err != nil {
		b.Fatal(err)
	}
	return float64(len(msg))
}

// scriptMicros is the Redis CPU time spent in scripts since the last
// CONFIG RESETSTAT, in microseconds (INFO commandstats).
func scriptMicros(b *testing.B, rc *redis.Client) float64 {
	stats := testenv.RedisCommandStats(b, rc)
	return float64(stats["eval"].Usec + stats["evalsha"].Usec)
}
