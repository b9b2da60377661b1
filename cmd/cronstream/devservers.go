package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/redis/go-redis/v9"
)

// startEmbeddedNATS runs a single JetStream-enabled nats-server inside the
// process, storing streams under dir so `dev` keeps its history across
// restarts.
func startEmbeddedNATS(host string, port int, dir string) (*server.Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("nats data dir: %w", err)
	}
	opts := &server.Options{
		ServerName: "cronstream-dev",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoSigs:     true,
		NoLog:      true,
		// Room for a full 1 MiB payload, which is about 1.4 MB once base64
		// encoded in an event (the server default is 1 MB).
		MaxPayload: 4 << 20,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded NATS did not start listening on %s:%d (port in use? try --nats-port)", host, port)
	}
	return s, nil
}

// devRedis is the Redis that `dev` uses when --redis is not given.
type devRedis struct {
	URL  string
	Kind string // "redis-server" or "in-process"
	stop func()
}

// startDevRedis starts redis-server from PATH with its data in dir, or,
// when there is none, an in-process Redis-compatible server.
func startDevRedis(ctx context.Context, dir string, log *slog.Logger) (*devRedis, error) {
	if path, err := exec.LookPath("redis-server"); err == nil {
		r, err := startRedisServer(ctx, path, dir)
		if err == nil {
			return r, nil
		}
		log.Warn("redis-server from PATH did not start; falling back to the in-process server", "err", err)
	}
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("in-process Redis: %w", err)
	}
	log.Warn("no redis-server on PATH: using an in-process Redis-compatible server. It is for development only: nothing is persisted, and some asynq tools may not work against it. Install redis-server or pass --redis for anything else.")
	return &devRedis{URL: "redis://" + m.Addr(), Kind: "in-process", stop: m.Close}, nil
}

func startRedisServer(ctx context.Context, path, dir string) (*devRedis, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("redis data dir: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		return nil, err
	}
	// AOF with noeviction: what asynq and exactly-once firing need.
	cmd := exec.Command(path,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
		"--appendonly", "yes", "--save", "", "--maxmemory-policy", "noeviction",
		"--daemonize", "no")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	url := fmt.Sprintf("redis://127.0.0.1:%d", port)
	opt, _ := redis.ParseURL(url)
	c := redis.NewClient(opt)
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := c.Ping(ctx).Err(); err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			logFile.Close()
			return nil, errors.New("redis-server did not answer PING within 10s; see " + logFile.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logFile.Close()
	}
	return &devRedis{URL: url, Kind: "redis-server", stop: stop}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
