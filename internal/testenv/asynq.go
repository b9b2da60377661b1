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
