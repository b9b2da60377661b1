package recoverer_test

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
	"go.uber.org/goleak"
)

// The test binary doubles as a real asynq worker process: started with
// childModeEnv set, TestMain runs an asynq server instead of the tests and
// blocks until the parent kills it with SIGKILL. (The same approach as
// taskstate's recover tests, written again here because test helpers
// cannot be imported.)
const (
	childModeEnv   = "RECOVERER_CHILD_MODE" // "worker" or "aggregator"
	childAddrEnv   = "RECOVERER_CHILD_REDIS_ADDR"
	childQueuesEnv = "RECOVERER_CHILD_QUEUES"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childModeEnv); mode != "" {
		runChild(mode)
		return
	}
	goleak.VerifyTestMain(m)
}

// runChild serves the queues with a real asynq server. In "worker" mode the
// handler blocks forever, so every task it takes stays active; in
// "aggregator" mode the group aggregator blocks forever, so the aggregation
// set it took stays in aggregation_sets. Either way the process holds its
// work until it is killed.
func runChild(mode string) {
	queues := map[string]int{}
	for _, q := range strings.Split(os.Getenv(childQueuesEnv), ",") {
		queues[q] = 1
	}
	block := make(chan struct{})
	cfg := asynq.Config{
		Queues: queues, Concurrency: 64, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 20 * time.Millisecond,
	}
	if mode == "aggregator" {
		cfg.GroupGracePeriod = time.Second
		cfg.GroupAggregator = asynq.GroupAggregatorFunc(func(string, []*asynq.Task) *asynq.Task {
			<-block // the aggregator "crashes" mid-run: the parent kills us here
			return nil
		})
	}
	srv := asynq.NewServer(asynq.RedisClientOpt{Addr: os.Getenv(childAddrEnv)}, cfg)
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		<-block // until SIGKILL
		return nil
	})); err != nil {
		fmt.Fprintln(os.Stderr, "child asynq server:", err)
		os.Exit(3)
	}
	<-block
}

// startChild runs this test binary as a child asynq process (mode "worker"
// or "aggregator") on the given queues of the Redis at addr, and returns a
// function that kills it with SIGKILL and waits for it (also run at
// cleanup).
func startChild(t *testing.T, mode, addr string, queues ...string) (kill func()) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childModeEnv+"="+mode, childAddrEnv+"="+addr,
		childQueuesEnv+"="+strings.Join(queues, ","))
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
