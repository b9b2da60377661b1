// Command worker is an ordinary asynq worker for the example schedules: it
// knows nothing of cronstream. Tasks fired by cronstream are plain asynq
// tasks, so any asynq server processes them unchanged.
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
)

func main() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	srv := asynq.NewServer(asynq.RedisClientOpt{Addr: addr}, asynq.Config{
		Concurrency: 10,
		Queues:      map[string]int{"critical": 6, "default": 3, "reports": 1},
	})
	mux := asynq.NewServeMux()
	mux.HandleFunc("demo:hello", func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		log.Info("hello", "task", id, "payload", string(t.Payload()), "headers", t.Headers())
		return nil
	})
	mux.HandleFunc("report:daily", func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		log.Info("building report", "task", id, "payload", string(t.Payload()))
		select {
		case <-time.After(2 * time.Second):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	mux.HandleFunc("cache:warm", func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		log.Info("warming cache", "task", id)
		return nil
	})
	if err := srv.Start(mux); err != nil {
		log.Error("start", "err", err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	srv.Shutdown()
}
