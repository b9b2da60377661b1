package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/redisscript"
)

// Redis is one Redis database for one test: a private redis-server process, or
// a database of the server named by REDIS_URL.
type Redis struct {
	// Addr is host:port of the server.
	Addr string
	// DB is the logical database this test owns (0 on a private server).
	DB int
	// URL is a redis:// URL naming Addr and DB (and the credentials of
	// REDIS_URL, if any).
	URL string
	// TLSAddr is host:port of the TLS port, with WithTLS ("" otherwise).
	TLSAddr string

	proc *redisProc // nil when the server comes from REDIS_URL
	aof  bool
}

type redisConfig struct {
	aof     bool
	private bool
	tls     *RedisTLS
}

// RedisTLS names the PEM files of a TLS redis-server: its certificate and
// key, and the CA its clients' certificates must be signed by.
type RedisTLS struct {
	CertFile, KeyFile, CAFile string
}

// RedisOption changes how StartRedis provides a server.
type RedisOption func(*redisConfig)

// WithAOF turns on the append-only file with appendfsync always, so every
// acknowledged write survives Kill and Start. Without it the server persists
// nothing. It implies WithPrivateServer: persistence across restarts needs a
// process the test owns.
func WithAOF() RedisOption {
	return func(c *redisConfig) { c.aof = true; c.private = true }
}

// WithPrivateServer starts a private redis-server even when REDIS_URL is set,
// for tests that Kill, Stop or Start the server.
func WithPrivateServer() RedisOption {
	return func(c *redisConfig) { c.private = true }
}

// WithTLS adds a TLS port (Redis.TLSAddr) that requires a client
// certificate signed by f.CAFile (tls-auth-clients yes, Redis's default).
// The plain port stays open on loopback for the test's own client. It
// implies WithPrivateServer.
func WithTLS(f RedisTLS) RedisOption {
	return func(c *redisConfig) { c.tls = &f; c.private = true }
}

// StartRedis provides an empty Redis database for t. With REDIS_URL set (and
// no WithAOF or WithPrivateServer) it claims a free database 1..15 on that
// server, flushes it, and flushes and releases it at cleanup. Otherwise it
// starts redis-server from PATH on a free 127.0.0.1 port with its directory in
// t.TempDir() and stops it at cleanup. Each call is independent, so parallel
// tests each get their own.
func StartRedis(t testing.TB, opts ...RedisOption) *Redis {
	t.Helper()
	var cfg redisConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if raw := os.Getenv("REDIS_URL"); raw != "" && !cfg.private {
		return startSharedRedis(t, raw)
	}

	bin, err := lookupRedisServer()
	if err != nil {
		if cfg.private && os.Getenv("REDIS_URL") != "" {
			t.Fatalf("testenv: %v; this test needs its own redis-server process (REDIS_URL cannot serve it): %s", err, redisInstallHint)
		}
		t.Fatalf("testenv: %v; %s, or set REDIS_URL=redis://host:port to use an existing server", err, redisInstallHint)
	}
	persistence := []string{"--save", "", "--appendonly", "no"}
	if cfg.aof {
		persistence = []string{"--save", "", "--appendonly", "yes", "--appendfsync", "always"}
	}
	proc, err := startRedisProc(bin, t.TempDir(), false, cfg.tls, persistence)
	if err != nil {
		t.Fatalf("testenv: start redis-server: %v", err)
	}
	t.Cleanup(func() {
		proc.terminate()
		if t.Failed() {
			t.Logf("testenv: redis-server %s log tail:\n%s", proc.addr(), tailFile(proc.logPath, 0, logTailLines))
		}
	})
	r := &Redis{
		Addr: proc.addr(),
		DB:   0,
		URL:  "redis://" + proc.addr() + "/0",
		proc: proc,
		aof:  cfg.aof,
	}
	if proc.tls != nil {
		r.TLSAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(proc.tlsPort))
	}
	return r
}

// Options returns fresh go-redis options for r's server and database.
func (r *Redis) Options() *redis.Options {
	opts, err := redis.ParseURL(r.URL)
	if err != nil {
		// r.URL was built from a URL that already parsed, so this is
		// unreachable; fall back to what is known rather than panic.
		return &redis.Options{Addr: r.Addr, DB: r.DB}
	}
	return opts
}

// Client returns a go-redis client on r's database, closed at t's cleanup.
func (r *Redis) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(r.Options())
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Owned reports whether the server is a process this package started, which
// Kill, Stop and Start require.
func (r *Redis) Owned() bool { return r.proc != nil }

// Kill sends SIGKILL to the server and waits for it to exit. Without WithAOF
// all data is lost.
func (r *Redis) Kill(t testing.TB) {
	t.Helper()
	r.mustOwn(t, "Kill")
	if err := r.proc.kill(); err != nil {
		t.Fatalf("testenv: kill: %v", err)
	}
}

// Stop shuts the server down gracefully (SHUTDOWN NOSAVE, or SHUTDOWN with
// WithAOF so the append-only file is flushed) and waits for it to exit.
func (r *Redis) Stop(t testing.TB) {
	t.Helper()
	r.mustOwn(t, "Stop")
	if err := r.proc.shutdown(r.aof); err != nil {
		t.Fatalf("testenv: stop: %v", err)
	}
}

// Start starts the server again after Stop or Kill, on the same port and
// directory, and waits until it answers PING (with WithAOF: after loading
// the append-only file).
func (r *Redis) Start(t testing.TB) {
	t.Helper()
	r.mustOwn(t, "Start")
	if err := r.proc.start(); err != nil {
		t.Fatalf("testenv: restart: %v", err)
	}
}

func (r *Redis) mustOwn(t testing.TB, op string) {
	t.Helper()
	if r.proc == nil {
		t.Fatalf("testenv: Redis.%s needs a redis-server this test owns, but %s comes from REDIS_URL; pass WithPrivateServer() or WithAOF() to StartRedis", op, r.Addr)
	}
}

// Databases 1..15 of a REDIS_URL server are handed out to tests. Database 0
// holds the claims, so that test processes of different packages, which run
// in parallel and share nothing in memory, never get the same database.
const (
	firstSharedDB  = 1
	lastSharedDB   = 15
	claimKeyPrefix = "cronstream:testenv:db-claim:"
	// claimTTL frees the claims of a test process that died without
	// cleanup, as a last resort; claims of dead processes on this host are
	// taken over sooner (see claimStale).
	claimTTL = time.Hour
)

var (
	claimStealScript = redisscript.New(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0`)
	claimReleaseScript = redisscript.New(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)
)

// errNoFreeDB is returned when every shared database is claimed.
var errNoFreeDB = errors.New("all shared databases are claimed")

func startSharedRedis(t testing.TB, raw string) *Redis {
	t.Helper()
	base, err := redis.ParseURL(raw)
	if err != nil {
		t.Fatalf("testenv: REDIS_URL %q: %v", raw, err)
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("testenv: REDIS_URL %q: %v", raw, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	token, err := claimToken()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	db, err := claimDB(ctx, base, token)
	if errors.Is(err, errNoFreeDB) {
		t.Fatalf("testenv: REDIS_URL %s: %v: databases %d..%d are all in use by running tests (claims are keys %s* in database 0); run fewer test processes at once (go test -p 1) or unset REDIS_URL to start private redis-servers",
			base.Addr, err, firstSharedDB, lastSharedDB, claimKeyPrefix)
	}
	if err != nil {
		t.Fatalf("testenv: REDIS_URL %s: %v", base.Addr, err)
	}

	u.Path = "/" + strconv.Itoa(db)
	r := &Redis{Addr: base.Addr, DB: db, URL: u.String()}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := flushDB(ctx, r.Options()); err != nil {
			t.Errorf("testenv: flush database %d of %s at cleanup: %v", db, base.Addr, err)
		}
		if err := releaseDB(ctx, base, db, token); err != nil {
			t.Errorf("testenv: release database %d of %s: %v", db, base.Addr, err)
		}
	})
	if err := flushDB(ctx, r.Options()); err != nil {
		t.Fatalf("testenv: flush database %d of %s: %v", db, base.Addr, err)
	}
	return r
}

// claimToken names this claim: host and pid let another process on the same
// host recognise a claim whose owner has died; the random part tells two
// claims of one process apart.
func claimToken() (string, error) {
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("hostname for database claim: %w", err)
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", fmt.Errorf("random database claim: %w", err)
	}
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(nonce[:])), nil
}

func claimDB(ctx context.Context, base *redis.Options, token string) (int, error) {
	ctlOpts := *base
	ctlOpts.DB = 0
	ctl := redis.NewClient(&ctlOpts)
	defer ctl.Close()
	if err := ctl.Ping(ctx).Err(); err != nil {
		return 0, fmt.Errorf("ping: %w", err)
	}
	for db := firstSharedDB; db <= lastSharedDB; db++ {
		key := claimKeyPrefix + strconv.Itoa(db)
		ok, err := ctl.SetNX(ctx, key, token, claimTTL).Result()
		if err != nil {
			return 0, fmt.Errorf("claim database %d: %w", db, err)
		}
		if ok {
			return db, nil
		}
		owner, err := ctl.Get(ctx, key).Result()
		if errors.Is(err, redis.Nil) {
			// Released between SETNX and GET; a later scan may get it.
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read claim of database %d: %w", db, err)
		}
		if !claimStale(owner) {
			continue
		}
		stolen, err := claimStealScript.Run(ctx, ctl, []string{key}, owner, token, int(claimTTL/time.Second)).Int()
		if err != nil {
			return 0, fmt.Errorf("take over stale claim of database %d: %w", db, err)
		}
		if stolen == 1 {
			return db, nil
		}
	}
	return 0, errNoFreeDB
}

// claimStale reports whether owner is a claim made by a process on this host
// that no longer exists.
func claimStale(owner string) bool {
	parts := strings.Split(owner, "/")
	if len(parts) != 3 {
		return false
	}
	host, err := os.Hostname()
	if err != nil || parts[0] != host {
		return false
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil || pid == os.Getpid() {
		return false
	}
	return !processAlive(pid)
}

func releaseDB(ctx context.Context, base *redis.Options, db int, token string) error {
	ctlOpts := *base
	ctlOpts.DB = 0
	ctl := redis.NewClient(&ctlOpts)
	defer ctl.Close()
	return claimReleaseScript.Run(ctx, ctl, []string{claimKeyPrefix + strconv.Itoa(db)}, token).Err()
}

func flushDB(ctx context.Context, opts *redis.Options) error {
	c := redis.NewClient(opts)
	defer c.Close()
	return c.FlushDB(ctx).Err()
}
