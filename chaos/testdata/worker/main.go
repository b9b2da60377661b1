// Command worker is the chaos suite's asynq worker: a real asynq v0.26.0
// server whose handler takes a random 0–2 s and appends one line to a log
// file when it starts a task and one when the handler returns, so the suite
// can count executions and tell which tasks a worker held when it was
// killed with SIGKILL.
//
// Log lines (one write each, O_APPEND, so a kill -9 never leaves half a
// line that was reported written):
//
//	S <task-id> <retried> <pid>
//	E <task-id> <retried> <pid>
//
// It is a test fixture: it never enqueues anything and never touches keys
// other than asynq's own.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
)

func main() {
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address host:port")
	queues := flag.String("queues", "default", "comma-separated queues to process")
	logPath := flag.String("log", "", "file to append start and end lines to (required)")
	concurrency := flag.Int("concurrency", 150, "asynq handler goroutines")
	maxWork := flag.Duration("max-work", 2*time.Second, "a handler takes a random time in [0, max-work)")
	seed := flag.Uint64("seed", 1, "seed of the handler durations (mixed with the pid)")
	flag.Parse()
	if *logPath == "" {
		log.Fatal("worker: --log is required")
	}
	f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		log.Fatalf("worker: open log: %v", err)
	}
	defer f.Close()

	qs := map[string]int{}
	for _, q := range strings.Split(*queues, ",") {
		if q = strings.TrimSpace(q); q != "" {
			qs[q] = 1
		}
	}
	h := &handler{log: f, pid: os.Getpid(), maxWork: *maxWork,
		rnd: rand.New(rand.NewPCG(*seed, uint64(os.Getpid())))}
	srv := asynq.NewServer(asynq.RedisClientOpt{Addr: *redisAddr}, asynq.Config{
		Concurrency:     *concurrency,
		Queues:          qs,
		ShutdownTimeout: 3 * time.Second,
		LogLevel:        asynq.WarnLevel,
	})
	// Run returns after SIGTERM or SIGINT; the suite mostly uses SIGKILL.
	if err := srv.Run(h); err != nil {
		log.Fatalf("worker: %v", err)
	}
}

type handler struct {
	log     *os.File
	pid     int
	maxWork time.Duration

	mu  sync.Mutex
	rnd *rand.Rand
}

func (h *handler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	id, _ := asynq.GetTaskID(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	if err := h.line("S", id, retried); err != nil {
		return err
	}
	h.mu.Lock()
	d := time.Duration(h.rnd.Int64N(int64(h.maxWork) + 1))
	h.mu.Unlock()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return ctx.Err()
	}
	return h.line("E", id, retried)
}

// line writes one log line with a single write call, so concurrent
// handlers never interleave and a killed process leaves whole lines.
func (h *handler) line(kind, id string, retried int) error {
	if _, err := fmt.Fprintf(h.log, "%s %s %d %d\n", kind, id, retried, h.pid); err != nil {
		return fmt.Errorf("worker log: %w", err)
	}
	return nil
}
