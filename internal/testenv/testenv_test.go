package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, LeakOptions()...)
}

// fatalRecorder stands in for a testing.TB to observe a Fatalf: it records
// the message and ends the calling goroutine the way FailNow does.
type fatalRecorder struct {
	testing.TB

	mu  sync.Mutex
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

// expectFatal runs fn with a recorder and returns the Fatalf message, failing
// t if fn did not call Fatalf.
func expectFatal(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(rec)
	}()
	<-done
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.msg == "" {
		t.Fatal("expected Fatalf, got none")
	}
	return rec.msg
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestEventually(t *testing.T) {
	t.Parallel()
	calls := 0
	Eventually(t, time.Second, func() bool { calls++; return calls == 3 }, "third call")
	if calls != 3 {
		t.Fatalf("cond called %d times, want 3", calls)
	}

	start := time.Now()
	msg := expectFatal(t, func(tb testing.TB) {
		Eventually(tb, 50*time.Millisecond, func() bool { return false }, "never %s", "true")
	})
	if !strings.Contains(msg, "never true") || !strings.Contains(msg, "50ms") {
		t.Errorf("message %q lacks the caller's text or the timeout", msg)
	}
	if elapsed := time.Since(start); elapsed < 50*time.Millisecond {
		t.Errorf("gave up after %s, before the 50ms timeout", elapsed)
	}
}

func TestRedisKillStopStart(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := StartRedis(t, WithPrivateServer())
	if !r.Owned() || r.DB != 0 || r.URL != "redis://"+r.Addr+"/0" {
		t.Fatalf("private server: Owned=%v DB=%d URL=%q Addr=%q", r.Owned(), r.DB, r.URL, r.Addr)
	}
	if !strings.HasPrefix(r.Addr, "127.0.0.1:") {
		t.Fatalf("Addr %q is not on loopback", r.Addr)
	}
	c := r.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var cfg []string
	for _, p := range []string{"save", "appendonly", "maxmemory-policy", "bind"} {
		cfg = append(cfg, fmt.Sprint(c.ConfigGet(ctx, p).Val()))
	}
	if got, want := strings.Join(cfg, " "), "map[save:] map[appendonly:no] map[maxmemory-policy:noeviction] map[bind:127.0.0.1]"; got != want {
		t.Errorf("config %s, want %s", got, want)
	}

	r.Kill(t)
	if err := pingRaw(r.Addr); err == nil {
		t.Fatal("PING answered after Kill")
	}
	r.Start(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Start: %v", err)
	}
	if n := c.Exists(ctx, "k").Val(); n != 0 {
		t.Errorf("key survived Kill without persistence")
	}

	if err := c.Set(ctx, "k2", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.Stop(t)
	if err := pingRaw(r.Addr); err == nil {
		t.Fatal("PING answered after Stop")
	}
	r.Start(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after second Start: %v", err)
	}
}

func TestRedisParallelServersAreSeparate(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	a, b := StartRedis(t, WithPrivateServer()), StartRedis(t, WithPrivateServer())
	if a.Addr == b.Addr {
		t.Fatalf("two servers share %s", a.Addr)
	}
	a.Client(t).Set(ctx, "only-a", 1, 0)
	if n := b.Client(t).Exists(ctx, "only-a").Val(); n != 0 {
		t.Error("b sees a's key")
	}
}

func TestRedisAOFSurvivesKill(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := StartRedis(t, WithAOF())
	c := r.Client(t)
	if got := c.ConfigGet(ctx, "appendfsync").Val()["appendfsync"]; got != "always" {
		t.Fatalf("appendfsync %q, want always", got)
	}
	const n = 200
	for i := range n {
		if err := c.Set(ctx, "k"+strconv.Itoa(i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	r.Kill(t)
	r.Start(t)
	if got := c.DBSize(ctx).Val(); got != n {
		t.Fatalf("after Kill+Start %d keys, want %d", got, n)
	}
	if got := c.Get(ctx, "k199").Val(); got != "199" {
		t.Fatalf("k199 = %q", got)
	}
	// Stop is graceful and must keep the data too.
	r.Stop(t)
	r.Start(t)
	if got := c.DBSize(ctx).Val(); got != n {
		t.Fatalf("after Stop+Start %d keys, want %d", got, n)
	}
}

func TestRedisMissingBinary(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	t.Setenv("PATH", t.TempDir())
	msg := expectFatal(t, func(tb testing.TB) { StartRedis(tb) })
	if !strings.Contains(msg, "apt-get install -y redis-server") || !strings.Contains(msg, "REDIS_URL") {
		t.Errorf("message %q should name the install command and REDIS_URL", msg)
	}
	msg = expectFatal(t, func(tb testing.TB) { StartRedisCluster(tb) })
	if !strings.Contains(msg, "apt-get install -y redis-server") {
		t.Errorf("message %q should name the install command", msg)
	}
}

func TestRedisURLMode(t *testing.T) {
	ctx := ctxT(t)
	t.Setenv("REDIS_URL", "")
	shared := StartRedis(t)
	if !shared.Owned() {
		t.Fatal("without REDIS_URL the server must be private")
	}
	admin := shared.Client(t) // database 0: the claims
	t.Setenv("REDIS_URL", shared.URL)

	a, b := StartRedis(t), StartRedis(t)
	if a.Owned() || b.Owned() {
		t.Fatal("REDIS_URL servers must not be owned")
	}
	if a.Addr != shared.Addr || b.Addr != shared.Addr {
		t.Fatalf("addresses %s %s, want %s", a.Addr, b.Addr, shared.Addr)
	}
	if a.DB == b.DB || a.DB < 1 || a.DB > 15 || b.DB < 1 || b.DB > 15 {
		t.Fatalf("databases %d and %d, want two distinct in 1..15", a.DB, b.DB)
	}
	if want := "redis://" + shared.Addr + "/" + strconv.Itoa(a.DB); a.URL != want {
		t.Errorf("URL %q, want %q", a.URL, want)
	}
	ca, cb := a.Client(t), b.Client(t)
	if err := ca.Set(ctx, "k", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := cb.Set(ctx, "k", "b", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := ca.Get(ctx, "k").Val(); got != "a" {
		t.Errorf("a reads %q, want its own value", got)
	}

	// Servers from REDIS_URL cannot be killed; WithAOF gets a private one.
	msg := expectFatal(t, func(tb testing.TB) { a.Kill(tb) })
	if !strings.Contains(msg, "REDIS_URL") {
		t.Errorf("Kill message %q should explain REDIS_URL", msg)
	}
	if p := StartRedis(t, WithAOF()); !p.Owned() || p.Addr == shared.Addr {
		t.Error("WithAOF must start a private server even with REDIS_URL set")
	}

	// A subtest's database is flushed and its claim released at its cleanup.
	var usedDB int
	t.Run("scoped", func(t *testing.T) {
		s := StartRedis(t)
		usedDB = s.DB
		s.Client(t).Set(ctx, "left", 1, 0)
	})
	if n := admin.Exists(ctx, claimKeyPrefix+strconv.Itoa(usedDB)).Val(); n != 0 {
		t.Errorf("claim of database %d not released", usedDB)
	}
	probe := redis.NewClient(&redis.Options{Addr: shared.Addr, DB: usedDB})
	defer probe.Close()
	if n := probe.DBSize(ctx).Val(); n != 0 {
		t.Errorf("database %d holds %d keys after cleanup", usedDB, n)
	}

	// A claim by a live process elsewhere is respected; one by a dead
	// process on this host is taken over.
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	free := []int{}
	for db := firstSharedDB; db <= lastSharedDB; db++ {
		if db != a.DB && db != b.DB {
			free = append(free, db)
		}
	}
	liveDB, deadDB := free[0], free[1]
	admin.Set(ctx, claimKeyPrefix+strconv.Itoa(liveDB), host+"/1/live", time.Minute)
	admin.Set(ctx, claimKeyPrefix+strconv.Itoa(deadDB), fmt.Sprintf("%s/%d/dead", host, dead.Process.Pid), time.Minute)
	defer admin.Del(ctx, claimKeyPrefix+strconv.Itoa(liveDB))
	if s := StartRedis(t); s.DB != deadDB {
		t.Errorf("got database %d, want %d whose claimant is dead (live claim on %d)", s.DB, deadDB, liveDB)
	}

	// Exhaustion is reported clearly.
	for _, db := range free {
		key := claimKeyPrefix + strconv.Itoa(db)
		if admin.SetNX(ctx, key, host+"/1/filler", time.Minute).Val() {
			defer admin.Del(ctx, key)
		}
	}
	msg = expectFatal(t, func(tb testing.TB) { StartRedis(tb) })
	if !strings.Contains(msg, "all in use") {
		t.Errorf("exhaustion message %q", msg)
	}
}

func TestRedisCluster(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	rc := StartRedisCluster(t)
	if len(rc.Addrs) != 3 {
		t.Fatalf("%d addresses, want 3", len(rc.Addrs))
	}
	c := rc.Client(t)

	// 2000 keys cover every master (and most slots); each must be readable.
	const n = 2000
	for i := range n {
		if err := c.Set(ctx, "key:"+strconv.Itoa(i), i, 0).Err(); err != nil {
			t.Fatalf("SET key:%d: %v", i, err)
		}
	}
	var mu sync.Mutex
	var total int64
	masters := 0
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		size, err := m.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		if size == 0 {
			return fmt.Errorf("master %s holds no keys", m.Options().Addr)
		}
		mu.Lock()
		total += size
		masters++
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if masters != 3 || total != n {
		t.Fatalf("%d masters hold %d keys, want 3 and %d", masters, total, n)
	}

	script := redis.NewScript(`
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[1])
return redis.call('MGET', KEYS[1], KEYS[2])`)
	got, err := script.Run(ctx, c, []string{"{tag}:a", "{tag}:b"}, "x").StringSlice()
	if err != nil {
		t.Fatalf("EVAL over {tag} keys: %v", err)
	}
	if strings.Join(got, ",") != "x,x" {
		t.Fatalf("EVAL returned %v", got)
	}
	// Keys in different slots must be refused: the cluster is real.
	err = script.Run(ctx, c, []string{"a", "b"}, "x").Err()
	if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Errorf("cross-slot EVAL: %v, want CROSSSLOT", err)
	}
}

func TestNATSRestartKeepsStream(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	n := StartNATS(t)
	if !strings.HasPrefix(n.URL(), "nats://127.0.0.1:") {
		t.Fatalf("URL %q", n.URL())
	}
	if !n.Server().JetStreamEnabled() {
		t.Fatal("JetStream is off")
	}
	js := n.JetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.a", []byte("one")); err != nil {
		t.Fatal(err)
	}
	url, before := n.URL(), n.Server()

	n.Shutdown()
	n.Shutdown() // idempotent
	n.Restart(t)
	if n.URL() != url || n.Server() == before {
		t.Fatalf("after Restart URL %s (was %s), same server object %v", n.URL(), url, n.Server() == before)
	}

	fresh := n.JetStream(t)
	s, err := fresh.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetLastMsgForSubject(ctx, "t.a")
	if err != nil || string(msg.Data) != "one" {
		t.Fatalf("after Restart: %v %v", msg, err)
	}
	// The first connection reconnects to the same port by itself.
	Eventually(t, 10*time.Second, func() bool {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := js.Publish(pctx, "t.a", []byte("two"))
		return err == nil
	}, "publish on the pre-restart connection")
}

// streamMsgsOn returns how many messages node's own copy of stream holds.
func streamMsgsOn(t *testing.T, srv *server.Server, stream string) uint64 {
	t.Helper()
	jsz, err := srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, acc := range jsz.AccountDetails {
		for _, s := range acc.Streams {
			if s.Name == stream {
				return s.State.Msgs
			}
		}
	}
	return 0
}

func TestNATSClusterFailover(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	c := StartNATSCluster(t, 3)
	if got := len(strings.Split(c.URLs(), ",")); got != 3 {
		t.Fatalf("URLs %q", c.URLs())
	}
	for i, n := range c.Nodes {
		if name := n.Server().Name(); name != "n"+strconv.Itoa(i) {
			t.Errorf("node %d named %q", i, name)
		}
	}
	js := c.JetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "C", Subjects: []string{"c.>"}, Replicas: 3}); err != nil {
		t.Fatalf("create R3 stream right after StartNATSCluster: %v", err)
	}
	publish := func(i int) error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := js.Publish(pctx, "c.x", []byte(strconv.Itoa(i)), jetstream.WithMsgID("m"+strconv.Itoa(i)))
		return err
	}
	for i := range 10 {
		if err := publish(i); err != nil {
			t.Fatal(err)
		}
	}

	leader := c.StreamLeader(t, "C")
	c.StopNode(leader)
	var lastErr error
	Eventually(t, natsLeaderTimeout, func() bool {
		lastErr = publish(10)
		return lastErr == nil
	}, "publish after stopping stream leader n%d (last error: %v)", leader, lazyString(func() string { return fmt.Sprint(lastErr) }))
	if next := c.StreamLeader(t, "C"); next == leader {
		t.Fatalf("stopped node %d still leads", leader)
	}
	for i := 11; i < 20; i++ {
		if err := publish(i); err != nil {
			t.Fatal(err)
		}
	}

	c.RestartNode(t, leader)
	restarted := c.Nodes[leader].Server()
	if got := streamMsgsOn(t, restarted, "C"); got != 20 {
		t.Fatalf("restarted node n%d holds %d messages, want 20", leader, got)
	}
	info, err := js.Stream(ctx, "C")
	if err != nil {
		t.Fatal(err)
	}
	if msgs := info.CachedInfo().State.Msgs; msgs != 20 {
		t.Fatalf("stream holds %d messages, want 20 (dedup by Msg-Id)", msgs)
	}
}

// TestNATSClusterRestartAll: every node stopped, then all started again:
// the replicated stream keeps its messages and takes new ones.
func TestNATSClusterRestartAll(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	c := StartNATSCluster(t, 3)
	js := c.JetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "A", Subjects: []string{"a.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	publish := func(i int) error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := js.Publish(pctx, "a.x", []byte(strconv.Itoa(i)), jetstream.WithMsgID("m"+strconv.Itoa(i)))
		return err
	}
	for i := range 10 {
		if err := publish(i); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.Nodes {
		c.StopNode(i)
	}
	c.RestartAll(t)
	var lastErr error
	Eventually(t, natsLeaderTimeout, func() bool {
		lastErr = publish(10)
		return lastErr == nil
	}, "publish after the whole cluster restarted (last error: %v)", lazyString(func() string { return fmt.Sprint(lastErr) }))
	held := map[string]uint64{}
	Eventually(t, natsLeaderTimeout, func() bool {
		for _, n := range c.Nodes {
			held[n.name] = streamMsgsOn(t, n.Server(), "A")
		}
		return held["n0"] == 11 && held["n1"] == 11 && held["n2"] == 11
	}, "every node holds the 11 messages after the restart (holds %v)", lazyString(func() string { return fmt.Sprint(held) }))
}

func TestNATSClusterTooSmall(t *testing.T) {
	t.Parallel()
	msg := expectFatal(t, func(tb testing.TB) { StartNATSCluster(tb, 1) })
	if !strings.Contains(msg, "at least 2") {
		t.Errorf("message %q", msg)
	}
}

func TestNATSConnectOptionsOverride(t *testing.T) {
	t.Parallel()
	n := StartNATS(t)
	nc := n.Connect(t, nats.Name("custom"), nats.MaxReconnects(0))
	if nc.Opts.Name != "custom" || nc.Opts.MaxReconnect != 0 {
		t.Errorf("caller options not applied: name %q maxReconnect %d", nc.Opts.Name, nc.Opts.MaxReconnect)
	}
	dflt := n.Connect(t)
	if dflt.Opts.ReconnectWait != natsReconnectWait || dflt.Opts.MaxReconnect != -1 {
		t.Errorf("defaults: reconnectWait %s maxReconnect %d", dflt.Opts.ReconnectWait, dflt.Opts.MaxReconnect)
	}
}

// A port taken between picking and binding must be reported as a bind
// conflict, fast, so the start is retried on new ports.
func TestBindConflictDetected(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port

	bin, err := lookupRedisServer()
	if err != nil {
		t.Skip(err) // no redis-server on PATH: TestRedisMissingBinary checks the install hint instead
	}
	dir := t.TempDir()
	redisStart := time.Now()
	p := &redisProc{bin: bin, dir: dir, logPath: filepath.Join(dir, "redis.log"), port: taken}
	err = p.start()
	if !errors.Is(err, errBindConflict) {
		t.Errorf("redis-server on a taken port: %v, want errBindConflict", err)
	}
	if p.running() {
		t.Error("redis-server left running after a failed start")
	}
	t.Logf("redis conflict noticed after %s", time.Since(redisStart))

	// Another redis-server on the port answers PING; ours must still count
	// as failed rather than borrow that server.
	other := StartRedis(t, WithPrivateServer())
	otherPort, _ := strconv.Atoi(other.Addr[strings.LastIndex(other.Addr, ":")+1:])
	dir2 := t.TempDir()
	p2 := &redisProc{bin: bin, dir: dir2, logPath: filepath.Join(dir2, "redis.log"), port: otherPort}
	if err := p2.start(); !errors.Is(err, errBindConflict) {
		p2.terminate()
		t.Errorf("redis-server on a port held by another redis-server: %v, want errBindConflict", err)
	}

	// A route is needed for clustered JetStream to get as far as listening.
	route := &url.URL{Scheme: "nats-route", Host: l.Addr().String()}
	n, err := newNATS(t, "conflict", &natsClusterConfig{name: natsClusterName, port: taken, routes: []*url.URL{route}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.cleanup(t) })
	start := time.Now()
	err = n.boot()
	if !errors.Is(err, errBindConflict) {
		t.Errorf("nats-server on a taken route port: %v, want errBindConflict", err)
	}
	t.Logf("nats conflict noticed after %s", time.Since(start))
	if elapsed := time.Since(start); elapsed > natsReadyTimeout/2 {
		t.Errorf("conflict noticed after %s", elapsed)
	}
}

// TestFreePortsClaimed: a port freePorts handed out is not handed out again,
// by this process or another, while the process that picked it lives, even
// when nothing listens on it (a server stopped to be restarted).
func TestFreePortsClaimed(t *testing.T) {
	// Where the kernel's ephemeral range leaves no fixed range, freePorts
	// lets the kernel pick and claims nothing; claimPort is checked below
	// either way.
	if low, high := fixedPortRange(); high > low {
		ports, err := freePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		if claimPort(ports[0]) {
			t.Errorf("port %d handed out by freePorts was claimed again by the same process", ports[0])
		}
	}

	// Another process's claim: a lock held on a port's file through an
	// open file of its own, as a second test binary holds it.
	var other int
	for p := 10000; p < 65536; p++ {
		if _, err := os.Stat(filepath.Join(os.TempDir(), "cronstream-test-ports", strconv.Itoa(p))); err != nil {
			other = p
			break
		}
	}
	if err := os.MkdirAll(filepath.Join(os.TempDir(), "cronstream-test-ports"), 0o777); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "cronstream-test-ports", strconv.Itoa(other)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if claimPort(other) {
		t.Errorf("port %d claimed while another open file holds its lock", other)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if !claimPort(other) {
		t.Errorf("port %d not claimed once its lock was let go", other)
	}
	if claimPort(other) {
		t.Errorf("port %d claimed twice by one process", other)
	}
}
