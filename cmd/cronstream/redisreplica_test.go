package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestRedisReplicaStoppedUnderRun: a replica runs with the default
// --redis-wait-replicas auto against a Redis primary with a replica. The
// Redis replica stops: firing goes on, the events are published marked
// unconfirmed, counted in /metrics, and status warns; audit shows the
// mark. The replica back, the events are confirmed again.
func TestRedisReplicaStoppedUnderRun(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	r := testenv.StartRedis(t, testenv.WithPrivateServer())
	standby := testenv.StartRedisReplica(t, r)
	e := &cliEnv{t: t, nats: n, redis: r, vars: append(baseEnv(), "CRONSTREAM_NATS="+n.URL(), "CRONSTREAM_REDIS="+r.URL)}
	e.ok("entry", "put", "w", "--cron", "@every 1s", "--type", "x")
	p := start(t, e.vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", "wait-1", "--redis-wait-timeout", "300ms")
	var addr string
	testenv.Eventually(t, 30*time.Second, func() bool {
		var ok bool
		addr, ok = logValue(p.Stderr(), "serving http", "addr")
		return ok
	}, "run did not log its HTTP address:\n%s", p.Stderr())
	base := "http://" + addr
	fired := func() float64 { return metricValue(base, "cronstream_relay_published_total") }
	testenv.Eventually(t, 30*time.Second, func() bool { return fired() >= 3 }, "no events published:\n%s", p.Stderr())
	if v := metricValue(base, "cronstream_relay_unconfirmed_total"); v != 0 {
		t.Fatalf("cronstream_relay_unconfirmed_total = %v with the Redis replica up", v)
	}

	standby.Stop(t)
	at := fired()
	testenv.Eventually(t, 30*time.Second, func() bool { return fired() >= at+5 }, "firing stopped with the Redis replica down:\n%s", p.Stderr())
	if v := metricValue(base, "cronstream_relay_unconfirmed_total"); v < 4 {
		t.Errorf("cronstream_relay_unconfirmed_total = %v after 5 events with the Redis replica down", v)
	}
	if v := metricValue(base, "cronstream_relay_redis_wait_behind"); v != 1 {
		t.Errorf("cronstream_relay_redis_wait_behind = %v, want 1", v)
	}
	if got := strings.Count(p.Stderr(), "Redis replicas did not confirm the writes of published events"); got != 1 {
		t.Errorf("%d log lines about the unconfirmed writes, want 1:\n%s", got, p.Stderr())
	}
	var st struct {
		Replicas []struct {
			RedisWait *relay.WaitStatus `json:"redis_wait"`
		} `json:"replicas"`
		Warnings []string `json:"warnings"`
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		e.okJSON(&st, "status", "--json")
		return len(st.Replicas) == 1 && st.Replicas[0].RedisWait != nil && st.Replicas[0].RedisWait.Behind
	}, "status does not show the unconfirmed events: %+v", lazy(func() string { b, _ := json.Marshal(st); return string(b) }))
	if !strings.Contains(strings.Join(st.Warnings, "\n"), "replica wait-1: publishing events whose Redis writes its replicas have not confirmed (WAIT for 1: timeout)") {
		t.Errorf("status warnings: %q", st.Warnings)
	}
	if out := e.ok("status"); !strings.Contains(out, "its replicas have not confirmed") {
		t.Errorf("status text lacks the warning:\n%s", out)
	}
	if out := e.ok("audit", "--entry", "w", "--type", "fired", "--tail", "2"); strings.Count(out, "[published before Redis replicas confirmed it: 0/1 ") != 2 {
		t.Errorf("audit does not mark the last fires:\n%s", out)
	}

	standby.Start(t)
	standby.Follow(t, r)
	testenv.Eventually(t, 60*time.Second, func() bool { return metricValue(base, "cronstream_relay_redis_wait_behind") == 0 }, "the Redis replica never confirmed again:\n%s", p.Stderr())
	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d", code)
	}
}
