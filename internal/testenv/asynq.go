package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// StartAsynqServer runs a real in-process asynq server on rc until the test
// ends, quiet and with short check and shutdown intervals unless cfg sets
// them. Its own recoverer runs once at start, over cfg.Queues.
func StartAsynqServer(t testing.TB, rc redis.UniversalClient, cfg asynq.Config, h asynq.Handler) {
	t.Helper()
	cfg.LogLevel = asynq.FatalLevel
	if cfg.TaskCheckInterval == 0 {
		cfg.TaskCheckInterval = 20 * time.Millisecond
	}
	if cfg.DelayedTaskCheckInterval == 0 {
		cfg.DelayedTaskCheckInterval = 100 * time.Millisecond
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = time.Second
	}
	srv := asynq.NewServerFromRedisClient(rc, cfg)
	if err := srv.Start(h); err != nil {
		t.Fatalf("start asynq server: %v", err)
	}
	t.Cleanup(srv.Shutdown)
}

// AsynqClient returns an asynq client on rc, closed when the test ends.
func AsynqClient(t testing.TB, rc redis.UniversalClient) *asynq.Client {
	c := asynq.NewClientFromRedisClient(rc)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// RecoverWithAsynq runs asynq's own recoverer over queue: an asynq server
// on rc, whose recoverer runs once at its start, shut down once queue has
// no active task (the test fails if that takes longer than d). Its retry
// delay is an hour, so the tasks it retries stay in the retry set for the
// test to compare.
func RecoverWithAsynq(t testing.TB, rc redis.UniversalClient, queue string, d time.Duration) {
	t.Helper()
	srv := asynq.NewServerFromRedisClient(rc, asynq.Config{
		Queues: map[string]int{queue: 1}, LogLevel: asynq.FatalLevel,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour },
	})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatalf("start asynq server: %v", err)
	}
	defer srv.Shutdown()
	insp := asynq.NewInspectorFromRedisClient(rc)
	Eventually(t, d, func() bool {
		qi, err := insp.GetQueueInfo(queue)
		return err == nil && qi.Active == 0
	}, "asynq's recoverer recovers queue %s", queue)
}

// AggregateWithAsynq starts an asynq server on rc over queue until the test
// ends, whose aggregator makes one task of each group, and returns how many
// tasks the first aggregated task it handles was made of. The test fails if
// none is handled within d.
func AggregateWithAsynq(t testing.TB, rc redis.UniversalClient, queue string, d time.Duration) int {
	t.Helper()
	done := make(chan int, 1)
	StartAsynqServer(t, rc, asynq.Config{
		Queues: map[string]int{queue: 1}, GroupGracePeriod: time.Second,
		GroupAggregator: asynq.GroupAggregatorFunc(func(_ string, tasks []*asynq.Task) *asynq.Task {
			return asynq.NewTask("aggregated", []byte{byte(len(tasks))})
		}),
	}, asynq.HandlerFunc(func(_ context.Context, task *asynq.Task) error {
		if task.Type() == "aggregated" {
			select {
			case done <- int(task.Payload()[0]):
			default:
			}
		}
		return nil
	}))
	select {
	case n := <-done:
		return n
	case <-time.After(d):
		t.Fatalf("asynq's aggregator did not aggregate a group of queue %s within %s", queue, d)
		return 0
	}
}

// UnsortedTaskIDs returns n task ids whose sorted order is not their order:
// asynq's lease set returns tied scores in member order, so ids seeded in
// this order make the case where a task's place in the active list is
// unrelated to its place in the lease set (what makes asynq's LREM slow).
func UnsortedTaskIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%08x", prefix, uint32(i)*2654435761)
	}
	return ids
}

// AsynqChildMode is what a child asynq process started by StartAsynqChild
// holds until it is killed.
type AsynqChildMode string

const (
	// AsynqWorker's handler blocks forever: every task it takes stays
	// active, its lease left to run out.
	AsynqWorker AsynqChildMode = "worker"
	// AsynqAggregator's group aggregator blocks forever: the aggregation
	// set it took stays in aggregation_sets.
	AsynqAggregator AsynqChildMode = "aggregator"
)

// The child learns its part from its environment.
const (
	asynqChildModeEnv   = "CRONSTREAM_TESTENV_ASYNQ_CHILD"
	asynqChildAddrEnv   = "CRONSTREAM_TESTENV_ASYNQ_REDIS_ADDR"
	asynqChildQueuesEnv = "CRONSTREAM_TESTENV_ASYNQ_QUEUES"
)

// RunAsynqChild is the first call of the TestMain of a package that uses
// StartAsynqChild: in the child process StartAsynqChild started, it serves
// the queues with a real asynq server and never returns (the parent kills
// it); anywhere else it returns at once.
func RunAsynqChild() {
	mode := AsynqChildMode(os.Getenv(asynqChildModeEnv))
	if mode == "" {
		return
	}
	queues := map[string]int{}
	for _, q := range strings.Split(os.Getenv(asynqChildQueuesEnv), ",") {
		queues[q] = 1
	}
	block := make(chan struct{})
	cfg := asynq.Config{
		Queues: queues, Concurrency: 64, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 20 * time.Millisecond,
	}
	if mode == AsynqAggregator {
		cfg.GroupGracePeriod = time.Second
		cfg.GroupAggregator = asynq.GroupAggregatorFunc(func(string, []*asynq.Task) *asynq.Task {
			<-block // the aggregator "crashes" mid-run: the parent kills us here
			return nil
		})
	}
	srv := asynq.NewServer(asynq.RedisClientOpt{Addr: os.Getenv(asynqChildAddrEnv)}, cfg)
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		<-block // until SIGKILL
		return nil
	})); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: child asynq server:", err)
		os.Exit(3)
	}
	<-block
}

// StartAsynqChild runs the test binary again as a real asynq process in
// the given mode on the queues of the Redis at addr (its TestMain must call
// RunAsynqChild first), and returns a function that kills it with SIGKILL
// and waits for it, also run at cleanup. A process of its own, so that
// killing it leaves its tasks and leases exactly as a crashed worker does.
func StartAsynqChild(t testing.TB, mode AsynqChildMode, addr string, queues ...string) (kill func()) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), asynqChildModeEnv+"="+string(mode), asynqChildAddrEnv+"="+addr,
		asynqChildQueuesEnv+"="+strings.Join(queues, ","))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill = func() {
		once.Do(func() {
			_ = cmd.Process.Kill() // SIGKILL
			_ = cmd.Wait()
		})
	}
	t.Cleanup(kill)
	return kill
}

// ReclaimedSet names where a reclaimed aggregation set's tasks belong: the
// group's sorted set (GroupKey) listed under Group in the queue's groups
// (GroupsKey), and the set (SetKey) gone from the queue's aggregation sets
// (SetsKey). The keys come from the caller: taskstate owns their names.
type ReclaimedSet struct {
	GroupKey, GroupsKey, Group string
	SetKey, SetsKey            string
	// Tasks is how many tasks the group holds once the set is back.
	Tasks int64
}

// CheckReclaimed fails t unless the aggregation set s names was given back
// to its group, as asynq's aggregator needs to find it again.
func CheckReclaimed(t testing.TB, rc redis.UniversalClient, s ReclaimedSet) {
	t.Helper()
	ctx := Context(t, 10*time.Second)
	if n, err := rc.ZCard(ctx, s.GroupKey).Result(); err != nil || n != s.Tasks {
		t.Fatalf("group %s has %d tasks after the reclaim, want %d (err %v)", s.Group, n, s.Tasks, err)
	}
	if ok, err := rc.SIsMember(ctx, s.GroupsKey, s.Group).Result(); err != nil || !ok {
		t.Fatalf("group %s not listed again (err %v)", s.Group, err)
	}
	if n, err := rc.Exists(ctx, s.SetKey).Result(); err != nil || n != 0 {
		t.Fatalf("aggregation set %s still exists (err %v)", s.SetKey, err)
	}
	if n, err := rc.ZCard(ctx, s.SetsKey).Result(); err != nil || n != 0 {
		t.Fatalf("%d aggregation sets still listed (err %v)", n, err)
	}
}
