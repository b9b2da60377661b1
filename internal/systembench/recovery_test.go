package systembench

import (
	"context"
	"encoding/binary"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/massrecovery"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// BenchmarkRecoveryEndToEnd measures the recovery of a mass crash as a
// deployment runs it: N tasks whose leases all expired at the same moment
// (internal/massrecovery's scene, plus N/10 live tasks that must stay),
// recovered by a `cronstream run` process whose relay publishes every
// outcome to NATS, beside asynq's recovery path (massrecovery.RecoverAsynq)
// over an identical scene on a second redis-server in the same run.
//
// It reports tasks/s on both sides (ours from the process's start until
// every dead task is in the retry set) and their ratio, the time until
// every outcome event is in the activity stream, the longest Redis call of
// each side by SLOWLOG (server time; calls of a millisecond or more are
// recorded during the measured window), and the dequeue latency (enqueue call to handler start)
// of real asynq workers processing 200 tasks/s on another queue of the same
// Redis, before the replica starts and while it recovers. The workers poll
// an empty queue every 10 ms (asynq's default is 1 s, which would hide
// everything else).
//
//	CRONSTREAM_BENCH_TASKS=100000 go test -run '^$' -bench BenchmarkRecoveryEndToEnd -benchtime 1x -timeout 30m -v ./internal/systembench/
//
// CRONSTREAM_BENCH_TASKS is N (default 10,000); CRONSTREAM_BENCH_ONLY_OURS=1
// runs our side alone.
func BenchmarkRecoveryEndToEnd(b *testing.B) {
	n := envInt("CRONSTREAM_BENCH_TASKS", 10_000)
	for range b.N {
		// CRONSTREAM_BENCH_ONLY_OURS skips asynq's path (minutes at
		// 100,000) while tuning; a reported ratio needs both sides.
		onlyOurs := os.Getenv("CRONSTREAM_BENCH_ONLY_OURS") != ""
		var theirs asynqRecovery
		if !onlyOurs {
			theirs = recoverAsynqPath(b, n)
		}
		ours := recoverThroughReplica(b, n)
		oursRate := float64(n) / ours.inRetry.Seconds()
		b.ReportMetric(oursRate, "ours-tasks/s")
		b.ReportMetric(ours.inStream.Seconds(), "s-all-events-in-stream")
		b.ReportMetric(ms(ours.longest.took), "ours-longest-redis-ms")
		b.ReportMetric(ms(ours.workersBefore), "workers-dequeue-p99-ms-before")
		b.ReportMetric(ms(ours.workersDuring), "workers-dequeue-p99-ms-during")
		b.Logf("%d lease-expired tasks (+%d live): ours %s from process start until all in the retry set (%.0f tasks/s), all %d outcome events in the activity stream (%d messages) after %s",
			n, n/10, ours.inRetry.Round(time.Millisecond), oursRate, n, ours.streamMsgs, ours.inStream.Round(time.Millisecond))
		b.Logf("longest Redis call (SLOWLOG): ours %s; redis-server preempted %d times meanwhile", ours.longest, ours.redisPreempted)
		if !onlyOurs {
			theirRate := float64(n) / theirs.took.Seconds()
			b.ReportMetric(theirRate, "asynq-tasks/s")
			b.ReportMetric(oursRate/theirRate, "ours/asynq")
			b.ReportMetric(ms(theirs.longest.took), "asynq-longest-redis-ms")
			b.Logf("asynq's path %s (%.0f tasks/s): ratio %.1f×; its longest Redis call %s",
				theirs.took.Round(time.Millisecond), theirRate, oursRate/theirRate, theirs.longest)
		}
		b.Logf("asynq workers on another queue, dequeue latency: before the replica p50 %s p99 %s (%d tasks); while it recovers p50 %s p99 %s max %s (%d tasks)",
			ours.workersBeforeP50, ours.workersBefore, ours.workersBeforeN, ours.workersDuringP50, ours.workersDuring, ours.workersDuringMax, ours.workersDuringN)
		b.Logf("CPU while recovering: replica %s, redis-server %s, this process (NATS, workers, polling) %s",
			ours.cpu.replicas.Round(time.Millisecond), ours.cpu.redis.Round(time.Millisecond), ours.cpu.self.Round(time.Millisecond))
		b.Logf("Redis server time per recovered task by command (workers' and relay's included): %s", commandsPer(ours.commands, n, 12))
	}
}

type asynqRecovery struct {
	took    time.Duration
	longest slowCall
}

func recoverAsynqPath(b *testing.B, n int) asynqRecovery {
	b.Helper()
	rd := testenv.StartRedis(b, testenv.WithPrivateServer())
	// asynq's listing script takes seconds at 100,000 tasks, longer than
	// go-redis's default read timeout of 3 s.
	opts := rd.Options()
	opts.ReadTimeout = 5 * time.Minute
	rc := redis.NewClient(opts)
	b.Cleanup(func() { _ = rc.Close() })
	now := time.Now()
	live := massrecovery.Seed(b, rc, n, now)
	stop := slowlog(b, rc)
	start := time.Now()
	moved, err := massrecovery.RecoverAsynq(context.Background(), rc, now)
	took := time.Since(start)
	longest := stop()
	if err != nil {
		b.Fatal(err)
	}
	if moved != n {
		b.Fatalf("asynq's path moved %d tasks, want %d", moved, n)
	}
	massrecovery.Check(b, rc, n, live)
	return asynqRecovery{took: took, longest: longest}
}

type replicaRecovery struct {
	inRetry, inStream               time.Duration
	longest                         slowCall
	cpu                             cpuUse
	workersBefore, workersBeforeP50 time.Duration
	workersDuring, workersDuringP50 time.Duration
	workersDuringMax                time.Duration
	workersBeforeN, workersDuringN  int
	redisPreempted                  int
	streamMsgs                      int
	commands                        []commandTime
}

func recoverThroughReplica(b *testing.B, n int) replicaRecovery {
	b.Helper()
	s := newSystem(b)
	ctx := context.Background()
	live := massrecovery.Seed(b, s.rc, n, time.Now())
	w := startWorkers(b, s)
	// The workers alone, for the latency they have without a replica.
	baseFrom := time.Now()
	testenv.Eventually(b, time.Minute, func() bool { return w.count(baseFrom, time.Now()) >= 400 }, "400 worker tasks before the replica starts")
	baseTo := time.Now()

	retry := taskstate.Keys(massrecovery.Queue).Retry()
	outboxKey := taskstate.Own(s.names.Prefix(), massrecovery.Queue).Outbox()
	stopLog := slowlog(b, s.rc)
	resetCommandStats(b, s.rc)
	before, preempted := s.cpu(nil), testenv.Preemptions(s.redisPID)
	start := time.Now()
	p := s.startReplica("recover", "--recover-interval", "1s")
	var out replicaRecovery
	testenv.Eventually(b, 30*time.Minute, func() bool {
		if p.exited() {
			b.Fatalf("replica exited: %v; log:\n%s", p.err, p.logTail())
		}
		if out.inRetry == 0 && s.rc.ZCard(ctx, retry).Val() >= int64(n) {
			out.inRetry = time.Since(start)
		}
		// The relay deletes a record once the stream holds its events
		// (several to a message: a batch).
		if out.inRetry == 0 || s.rc.XLen(ctx, outboxKey).Val() > 0 {
			return false
		}
		out.inStream = time.Since(start)
		return true
	}, "%d tasks in the retry set and their events in the activity stream", n)
	end := time.Now()
	out.commands = commandStats(b, s.rc)
	out.longest = stopLog()
	out.cpu = s.cpu([]*replicaProc{p}).sub(before)
	out.redisPreempted = testenv.Preemptions(s.redisPID) - preempted
	p.stop(b)
	w.stop()
	massrecovery.Check(b, s.rc, n, live)
	if got, msgs := s.recoveryEvents(); got != n {
		b.Fatalf("the activity stream holds %d recovery events (in %d messages), want %d", got, msgs, n)
	} else {
		out.streamMsgs = msgs
	}

	beforeLat := w.latencies(baseFrom, baseTo)
	duringLat := w.latencies(start, end)
	out.workersBefore, out.workersBeforeP50, out.workersBeforeN = percentile(beforeLat, 0.99), percentile(beforeLat, 0.5), len(beforeLat)
	out.workersDuring, out.workersDuringP50, out.workersDuringN = percentile(duringLat, 0.99), percentile(duringLat, 0.5), len(duringLat)
	out.workersDuringMax = percentile(duringLat, 1)
	return out
}

// workers are real asynq workers on queue "work" of the system's Redis,
// fed 200 tasks/s by an asynq client; each task carries its enqueue time.
type workers struct {
	srv    *asynq.Server
	client *asynq.Client
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	mu  sync.Mutex
	obs []workerObs
}

type workerObs struct {
	enqueued time.Time
	latency  time.Duration
}

const workQueue = "work"

func startWorkers(b *testing.B, s *system) *workers {
	b.Helper()
	opt := asynq.RedisClientOpt{Addr: s.redis.Addr, DB: s.redis.DB}
	w := &workers{done: make(chan struct{})}
	w.srv = asynq.NewServer(opt, asynq.Config{
		Concurrency: 4, Queues: map[string]int{workQueue: 1}, TaskCheckInterval: 10 * time.Millisecond,
		LogLevel: asynq.FatalLevel,
	})
	mux := asynq.NewServeMux()
	mux.HandleFunc("bench:work", func(_ context.Context, t *asynq.Task) error {
		at := time.Unix(0, int64(binary.BigEndian.Uint64(t.Payload())))
		w.mu.Lock()
		w.obs = append(w.obs, workerObs{enqueued: at, latency: time.Since(at)})
		w.mu.Unlock()
		return nil
	})
	if err := w.srv.Start(mux); err != nil {
		b.Fatal(err)
	}
	w.client = asynq.NewClient(opt)
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go func() {
		defer close(w.done)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			payload := binary.BigEndian.AppendUint64(nil, uint64(time.Now().UnixNano()))
			_, _ = w.client.EnqueueContext(ctx, asynq.NewTask("bench:work", payload), asynq.Queue(workQueue))
		}
	}()
	b.Cleanup(w.stop)
	return w
}

func (w *workers) stop() {
	w.once.Do(func() {
		w.cancel()
		<-w.done
		w.srv.Shutdown()
		_ = w.client.Close()
	})
}

func (w *workers) count(from, to time.Time) int { return len(w.latencies(from, to)) }

// latencies are the dequeue latencies of the tasks enqueued in [from, to).
func (w *workers) latencies(from, to time.Time) []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []time.Duration
	for _, o := range w.obs {
		if !o.enqueued.Before(from) && o.enqueued.Before(to) {
			out = append(out, o.latency)
		}
	}
	return out
}
