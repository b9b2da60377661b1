package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/testenv"
)

// quietLogger keeps the asynq worker's logs out of the test output.
type quietLogger struct{}

func (quietLogger) Debug(...any) {}
func (quietLogger) Info(...any)  {}
func (quietLogger) Warn(...any)  {}
func (quietLogger) Error(...any) {}
func (quietLogger) Fatal(...any) {}

// devEnv is the environment of `dev` with PATH set to dir only: the
// binary needs nothing else, and redis-server is there only when the test
// puts it there.
func devEnv(dir string) []string {
	var out []string
	for _, kv := range baseEnv() {
		if !strings.HasPrefix(kv, "PATH=") {
			out = append(out, kv)
		}
	}
	return append(out, "PATH="+dir)
}

// startDev starts `cronstream dev` on a data dir of its own and returns it
// with the NATS and Redis URLs it prints.
func startDev(t *testing.T, pathDir string) (p *proc, natsURL, redisURL string) {
	t.Helper()
	return startDevIn(t, pathDir, t.TempDir())
}

// startDevIn is startDev on dataDir.
func startDevIn(t *testing.T, pathDir, dataDir string) (p *proc, natsURL, redisURL string) {
	t.Helper()
	p = start(t, devEnv(pathDir), "dev", "--data-dir", dataDir, "--nats-port", "-1", "--http", "127.0.0.1:0")
	natsURL = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(p.line("NATS:", 60*time.Second)), "NATS:"))
	redisURL = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(p.line("Redis:", 10*time.Second)), "Redis:"))
	if !strings.HasPrefix(natsURL, "nats://127.0.0.1:") || !strings.HasPrefix(redisURL, "redis://127.0.0.1:") {
		t.Fatalf("dev printed NATS %q Redis %q\n%s", natsURL, redisURL, p.Stdout())
	}
	return p, natsURL, redisURL
}

// checkDevFires registers an entry through the printed NATS URL and waits
// for an asynq Inspector on the printed Redis URL to see its task.
func checkDevFires(t *testing.T, natsURL, redisURL string) {
	t.Helper()
	e := &cliEnv{t: t, vars: append(baseEnv(), "CRONSTREAM_NATS="+natsURL, "CRONSTREAM_REDIS="+redisURL)}
	e.ok("entry", "put", "hello", "--cron", "@every 1s", "--type", "demo:hello", "--payload", "hi")
	ins := inspector(t, redisURL)
	testenv.Eventually(t, 30*time.Second, func() bool {
		for _, task := range pendingTasks(t, ins, "default") {
			if task.Type == "demo:hello" && string(task.Payload) == "hi" {
				return true
			}
		}
		return false
	}, "no demo:hello task in Redis at %s", redisURL)
	// A real asynq worker on the printed URL processes them.
	opt, err := asynq.ParseRedisURI(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan string, 100)
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: 2, Logger: quietLogger{}, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc("demo:hello", func(_ context.Context, task *asynq.Task) error {
		select {
		case handled <- string(task.Payload()):
		default:
		}
		return nil
	})
	if err := srv.Start(mux); err != nil {
		t.Fatalf("asynq server on %s: %v", redisURL, err)
	}
	defer srv.Shutdown()
	select {
	case p := <-handled:
		if p != "hi" {
			t.Errorf("worker got payload %q", p)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the asynq worker processed no task from %s", redisURL)
	}
	// The fire reached the audit log through the relay.
	testenv.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(e.ok("audit", "--type", "entry.fired"), "hello")
	}, "no fired event in the audit log")
}

func TestDevInProcessRedis(t *testing.T) {
	t.Parallel()
	empty := t.TempDir() // PATH without redis-server (or anything else)
	p, natsURL, redisURL := startDev(t, empty)
	if !strings.Contains(p.Stderr(), "in-process Redis-compatible server") || !strings.Contains(p.Stderr(), "development only") {
		t.Errorf("no in-process warning on stderr:\n%s", p.Stderr())
	}
	checkDevFires(t, natsURL, redisURL)
	if code := p.stop(syscall.SIGINT, 20*time.Second); code != 0 {
		t.Errorf("dev exited %d on SIGINT\n%s", code, p.Stderr())
	}
	if strings.Contains(p.Stderr(), "level=ERROR") {
		t.Errorf("errors logged against the in-process server:\n%s", p.Stderr())
	}
}

func TestDevRedisServer(t *testing.T) {
	t.Parallel()
	real, err := lookRedisServer()
	if err != nil {
		t.Fatalf("redis-server: %v", err)
	}
	dir := t.TempDir()
	if err := os.Symlink(real, filepath.Join(dir, "redis-server")); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	p, natsURL, redisURL := startDevIn(t, dir, data)
	if !strings.Contains(p.Stderr(), "kind=redis-server") || strings.Contains(p.Stderr(), "in-process") {
		t.Errorf("dev did not use redis-server from PATH:\n%s", p.Stderr())
	}
	checkDevFires(t, natsURL, redisURL)
	// A key of ours beside asynq's: it must be there after the restart.
	markRedis(t, redisURL, "set")
	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Errorf("dev exited %d on SIGTERM\n%s", code, p.Stderr())
	}

	// A restart on the same data dir keeps the Redis URL that shells and
	// workers were given, and the tasks in it.
	p, _, again := startDevIn(t, dir, data)
	if again != redisURL {
		t.Errorf("restarted dev moved Redis from %s to %s", redisURL, again)
	}
	markRedis(t, again, "check")
	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Errorf("dev exited %d on SIGTERM\n%s", code, p.Stderr())
	}

	// Another process on the recorded port: dev says why it cannot keep
	// the address instead of moving.
	held, err := net.Listen("tcp", strings.TrimPrefix(redisURL, "redis://"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	p = start(t, devEnv(dir), "dev", "--data-dir", data, "--nats-port", "-1", "--http", "127.0.0.1:0")
	if code := p.wait(30 * time.Second); code == 0 {
		t.Error("dev started with its Redis port held by another process")
	}
	if !strings.Contains(p.Stderr(), "is in use by another process") {
		t.Errorf("dev does not say its Redis port is taken:\n%s", p.Stderr())
	}
}

// lookRedisServer finds redis-server on the test's own PATH.
func lookRedisServer() (string, error) { return exec.LookPath("redis-server") }

// markRedis sets (how "set") or checks ("check") a marker key in the Redis
// at url.
func markRedis(t *testing.T, url, how string) {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx := context.Background()
	if how == "set" {
		if err := c.Set(ctx, "dev-test-marker", "kept", 0).Err(); err != nil {
			t.Fatal(err)
		}
		return
	}
	if v, err := c.Get(ctx, "dev-test-marker").Result(); err != nil || v != "kept" {
		t.Errorf("the restarted dev's Redis lost its data: marker %q, %v", v, err)
	}
}
