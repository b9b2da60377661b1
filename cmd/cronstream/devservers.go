package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
// when there is none, an in-process Redis-compatible server. Either listens
// on the port recorded in dir by the first start (devRedisPort), so a
// restart keeps the URL that shells and workers were given.
func startDevRedis(ctx context.Context, dir string, log *slog.Logger) (*devRedis, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("redis data dir: %w", err)
	}
	port, err := devRedisPort(dir)
	if err != nil {
		return nil, err
	}
	if path, err := exec.LookPath("redis-server"); err == nil {
		r, err := startRedisServer(ctx, path, dir, port)
		if err == nil {
			return r, nil
		}
		log.Warn("redis-server from PATH did not start; falling back to the in-process server", "err", err)
	}
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err != nil {
		return nil, fmt.Errorf("in-process Redis on port %d (recorded in %s): %w", port, filepath.Join(dir, devRedisPortFile), err)
	}
	log.Warn("no redis-server on PATH: using an in-process Redis-compatible server. It is for development only: nothing is persisted, and some asynq tools may not work against it. Install redis-server or pass --redis for anything else.")
	return &devRedis{URL: "redis://" + m.Addr(), Kind: "in-process", stop: m.Close}, nil
}

// devRedisPortFile holds, in dev's Redis data dir, the port its Redis
// listens on.
const devRedisPortFile = "port"

// devRedisPort returns the port recorded in dir, or picks a free one and
// records it. A recorded port that another process holds is an error that
// says so: moving to another port would silently break the URL every shell
// and worker was given.
func devRedisPort(dir string) (int, error) {
	file := filepath.Join(dir, devRedisPortFile)
	if b, err := os.ReadFile(file); err == nil {
		port, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || port <= 0 || port > 65535 {
			return 0, fmt.Errorf("%s holds %q, not a port: delete it to pick a new one", file, strings.TrimSpace(string(b)))
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return 0, fmt.Errorf("the dev Redis port %d (recorded in %s, so a restart keeps CRONSTREAM_REDIS) is in use by another process: stop it, or delete %s to pick a new port", port, file, file)
		}
		l.Close()
		return port, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("dev Redis port: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(file, []byte(strconv.Itoa(port)+"\n"), 0o644); err != nil {
		return 0, fmt.Errorf("record the dev Redis port: %w", err)
	}
	return port, nil
}

func startRedisServer(ctx context.Context, path, dir string, port int) (*devRedis, error) {
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
