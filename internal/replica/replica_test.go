package replica

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(discard{}, &slog.HandlerOptions{Level: slog.LevelError}))
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func TestMembershipFollowsReplicas(t *testing.T) {
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	ctx := context.Background()
	names := events.MustNames("mship")
	kv, err := OpenReplicasBucket(ctx, js, names, 1, 3*200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	a := mustMembership(t, MembershipConfig{KV: kv, JS: js, Self: Info{ID: "a"}, Interval: 200 * time.Millisecond, Logger: quietLogger()})
	seq := uint64(0)
	var mu sync.Mutex
	b := mustMembership(t, MembershipConfig{KV: kv, JS: js, Self: Info{ID: "b"}, Interval: 200 * time.Millisecond, Logger: quietLogger(),
		Update: func(i *Info) {
			mu.Lock()
			defer mu.Unlock()
			seq++
			i.ConfigSeq = seq
		}})
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Stop(ctx) }()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	both := func(m *Membership) func() bool {
		return func() bool { return slices.Equal(m.Live(), []string{"a", "b"}) }
	}
	testenv.Eventually(t, 5*time.Second, both(a), "a never saw b: %v", a.Live())
	testenv.Eventually(t, 5*time.Second, both(b), "b never saw a: %v", b.Live())

	infos, err := ListReplicas(ctx, js, names)
	if err != nil || len(infos) != 2 {
		t.Fatalf("ListReplicas = %v, %v", infos, err)
	}
	if infos[1].ID != "b" || infos[1].ConfigSeq == 0 {
		t.Fatalf("b's heartbeat does not carry its config sequence: %+v", infos[1])
	}

	// A clean stop removes the heartbeat at once.
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Second, func() bool { return slices.Equal(a.Live(), []string{"a"}) }, "a still sees b after its stop: %v", a.Live())
}

// TestMembershipExpiresSilentReplica: a replica that beats once and dies
// without removing its heartbeat stops being live three of its heartbeat
// intervals after its beat; the bucket writes nothing when it later drops
// the heartbeat, so this is the membership's own doing.
func TestMembershipExpiresSilentReplica(t *testing.T) {
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	ctx := context.Background()
	names := events.MustNames("expire")
	kv, err := OpenReplicasBucket(ctx, js, names, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a := mustMembership(t, MembershipConfig{KV: kv, JS: js, Self: Info{ID: "a"}, Interval: 200 * time.Millisecond, Logger: quietLogger()})
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Stop(ctx) }()
	// A replica that beats once and dies without removing its key.
	b, _ := json.Marshal(Info{ID: "ghost", Beat: time.Now(), Every: "1s"})
	if _, err := kv.Put(ctx, "ghost", b); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 3*time.Second, func() bool { return slices.Contains(a.Live(), "ghost") }, "ghost never seen")
	testenv.Eventually(t, 5*time.Second, func() bool { return !slices.Contains(a.Live(), "ghost") }, "dead replica still live: %v", a.Live())
}

func TestRedisWarnings(t *testing.T) {
	ctx := context.Background()
	plain := testenv.StartRedis(t, testenv.WithPrivateServer())
	c := plain.Client(t)
	w := RedisWarnings(ctx, c)
	if len(w) != 1 || !strings.Contains(w[0], "persistence is off") {
		t.Fatalf("no-persistence Redis: warnings %q", w)
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	w = RedisWarnings(ctx, c)
	if len(w) != 2 || !strings.Contains(w[0], "allkeys-lru") {
		t.Fatalf("evicting Redis: warnings %q", w)
	}
	durable := testenv.StartRedis(t, testenv.WithAOF())
	if w := RedisWarnings(ctx, durable.Client(t)); len(w) != 0 {
		t.Fatalf("AOF + noeviction Redis: unexpected warnings %q", w)
	}
}

// TestReplicaLifecycle runs a whole replica: it becomes ready, registers
// itself, and on stop removes its heartbeat and flushes its outbox.
func TestReplicaLifecycle(t *testing.T) {
	ns := testenv.StartNATS(t)
	rd := testenv.StartRedis(t)
	js := ns.JetStream(t)
	names := events.MustNames("life")
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			NATSURL: ns.URL(), Redis: rd.Client(t), Names: names, ReplicaID: "r1",
			HTTPAddr: "127.0.0.1:0", Heartbeat: 200 * time.Millisecond, Logger: quietLogger(),
			Ready: func(addr string) { ready <- addr },
		})
	}()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("replica ended before it was ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("replica not ready within 20s")
	}
	get := func(path string) int {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if get("/healthz") != 200 {
		t.Fatal("/healthz not 200")
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return get("/readyz") == 200 }, "/readyz never 200")
	if get("/metrics") != 200 {
		t.Fatal("/metrics not 200")
	}
	kv, err := js.KeyValue(context.Background(), names.ReplicasBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(context.Background(), "r1"); err != nil {
		t.Fatalf("heartbeat of r1 not in the bucket: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v after a clean stop", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("replica did not stop within 20s")
	}
	if _, err := kv.Get(context.Background(), "r1"); err == nil {
		t.Fatal("heartbeat left behind after a clean stop")
	}
}

func mustMembership(t *testing.T, cfg MembershipConfig) *Membership {
	t.Helper()
	m, err := NewMembership(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestNewMembershipValidates(t *testing.T) {
	if _, err := NewMembership(MembershipConfig{Self: Info{ID: "a"}}); err == nil {
		t.Fatal("NewMembership without a bucket: no error")
	}
}
