package taskstate_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/massrecovery"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// BenchmarkRecover measures recovering a mass crash: N lease-expired tasks
// with one tied lease score (a worker pool died in the same second) in an
// active list that also holds N/10 live tasks, in dequeue order. Beside our
// path (ListLeaseExpired + RecoverBatch) it runs asynq v0.26.0's path as a
// baseline on the same Redis in the same run: one listing script over the
// whole lease range, then one Retry script per task whose LREM with count 0
// scans the active list (internal/massrecovery, written from docs/asynq-compat.md
// "Listing lease-expired tasks", "Retry and archive"). Both decide and re-encode every message.
//
// Metrics: tasks/s (wall clock); redis-cpu-µs/task, the Redis server's CPU
// time per task, which stays meaningful on a busy machine; and the SLOWLOG
// durations of that path's script calls (p50, p99, max, and how many took
// over 10 ms). SLOWLOG measures wall time inside Redis, so on a machine
// shared with other work a descheduled Redis shows up as a slow call. Run
// with:
//
//	go test -run '^$' -bench BenchmarkRecover -benchtime 1x ./internal/taskstate/
func BenchmarkRecover(b *testing.B) {
	rc := massrecovery.StartRedis(b, 200*time.Microsecond)
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("N=%d/cronstream", n), func(b *testing.B) {
			benchRecover(b, rc, n, recoverOurs)
		})
		b.Run(fmt.Sprintf("N=%d/asynq", n), func(b *testing.B) {
			benchRecover(b, rc, n, massrecovery.RecoverAsynq)
		})
	}
}

type recoverPath func(ctx context.Context, rc redis.UniversalClient, now time.Time) (int, error)

func benchRecover(b *testing.B, rc redis.UniversalClient, n int, path recoverPath) {
	ctx := context.Background()
	var (
		calls    []time.Duration
		redisCPU time.Duration
	)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		now := time.Now()
		live := massrecovery.Seed(b, rc, n, now)
		cpu0 := testenv.RedisCPU(b, rc)
		b.StartTimer()
		moved, err := path(ctx, rc, now)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		redisCPU += testenv.RedisCPU(b, rc) - cpu0
		if moved != n {
			b.Fatalf("moved %d tasks, want %d", moved, n)
		}
		massrecovery.Check(b, rc, n, live)
		calls = append(calls, massrecovery.ScriptDurations(b, rc)...)
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

// recoverOurs is a recoverer pass on our path: the expired ids listed and
// ordered by their place in the active list, then per batch of 10,000 the
// messages read, asynq's decision, one outbox record per task, RecoverBatch.
func recoverOurs(ctx context.Context, rc redis.UniversalClient, now time.Time) (int, error) {
	s := taskstate.New(rc)
	cutoff := now.Add(-20 * time.Second)
	refs, err := s.ListTailFirst(ctx, massrecovery.Queue, cutoff, 0, math.MaxInt)
	if err != nil {
		return 0, err
	}
	moved := 0
	for len(refs) > 0 {
		batch := refs[:min(10_000, len(refs))]
		refs = refs[len(batch):]
		tasks, _, err := s.LoadLeaseExpired(ctx, massrecovery.Queue, batch)
		if err != nil {
			return moved, err
		}
		ds := make([]taskstate.Decision, 0, len(tasks))
		for _, le := range tasks {
			d, err := le.Retry(now.Add(massrecovery.RetryDelay(le.Msg.Retried)), taskstate.ErrLeaseExpiredText, true, now)
			if err != nil {
				return moved, err
			}
			d.Record = taskstate.Record{ID: "retried:" + le.Msg.ID, Data: []byte(`{"type":"cronstream.task.retried","task_id":"` + le.Msg.ID + `"}`)}
			ds = append(ds, d)
		}
		out, err := s.RecoverBatch(ctx, "bench", massrecovery.Queue, cutoff, ds)
		if err != nil {
			return moved, err
		}
		for _, o := range out {
			if o.Status.Moved() {
				moved++
			}
		}
	}
	return moved, nil
}
