package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/promtest"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// replicatedEnv is an env whose Redis is a private primary with a replica.
type replicatedEnv struct {
	*env
	primary, replica *testenv.Redis
	onReplica        *redis.Client
}

func newReplicatedEnv(t testing.TB) *replicatedEnv {
	t.Helper()
	e := newEnv(t, 0)
	primary := testenv.StartRedis(t, testenv.WithPrivateServer())
	e.rc = primary.Client(t)
	e.store = taskstate.New(e.rc)
	replica := testenv.StartRedisReplica(t, primary)
	return &replicatedEnv{env: e, primary: primary, replica: replica, onReplica: replica.Client(t)}
}

// marks returns the Cronstream-Redis-Unconfirmed header of every message
// in the activity stream, by Nats-Msg-Id.
func (e *env) marks() map[string]string {
	e.t.Helper()
	out := map[string]string{}
	for _, m := range testenv.StreamMsgs(e.t, e.js, names.ActivityStream()) {
		out[m.Header.Get(jetstream.MsgIDHeader)] = m.Header.Get(events.HeaderRedisUnconfirmed)
	}
	return out
}

// blockedInWait reports whether a client of r is blocked in WAIT.
func blockedInWait(t testing.TB, rc *redis.Client) bool {
	list, err := rc.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " cmd=wait ") && strings.Contains(line, " flags=b") {
			return true
		}
	}
	return false
}

// TestRelayWaitsForReplica: with the replica frozen the relay holds the
// batch in WAIT and publishes nothing; once the replica runs, the events
// are published unmarked, and every one's task was on the replica first.
func TestRelayWaitsForReplica(t *testing.T) {
	t.Parallel()
	e := newReplicatedEnv(t)
	want := e.write("default", "a", 5)
	e.replica.Freeze(t)
	r := e.newRelay("r1", func(c *relay.Config) { c.WaitReplicas, c.WaitTimeout = relay.WaitAuto, time.Minute })
	start(t, r)
	testenv.Eventually(t, 10*time.Second, func() bool { return blockedInWait(t, e.rc) }, "the relay to wait for the replica")
	if n := e.storedCount(); n != 0 {
		t.Fatalf("%d events published before the replica acknowledged their writes", n)
	}
	e.replica.Thaw(t)
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxLen("default") == 0 }, "the outbox to drain")
	checkExactlyOnce(t, e.stored(), want)
	for id, mark := range e.marks() {
		if mark != "" {
			t.Errorf("event %s marked %q although the replica confirmed it", id, mark)
		}
	}
	if st := r.WaitStatus(); st.Replicas != 1 || st.Behind || st.Unconfirmed != 0 {
		t.Errorf("WaitStatus = %+v; want 1 replica, not behind, nothing unconfirmed", st)
	}
	if n := e.onReplica.Exists(context.Background(), taskstate.Keys("default").Task(prefix+":a:5")).Val(); n != 1 {
		t.Error("the replica lacks a task whose event was published")
	}
}

// TestRelayPublishesThroughReplicaOutage: the replica stops. The first
// batch after it waits out the timeout and is published marked; the
// batches after it are published marked at once, without a WAIT each
// (one WAIT per probe at most, none while INFO shows the replica gone);
// everything is counted and shown. The replica back, the next probe
// confirms and the events are published unmarked again.
func TestRelayPublishesThroughReplicaOutage(t *testing.T) {
	t.Parallel()
	e := newReplicatedEnv(t)
	reg := prometheus.NewRegistry()
	const probe = 300 * time.Millisecond
	r := e.newRelay("r1", func(c *relay.Config) {
		c.WaitReplicas, c.WaitTimeout, c.WaitProbe, c.Metrics = relay.WaitAuto, 500*time.Millisecond, probe, relay.NewMetrics(reg)
	})
	start(t, r)
	before := e.write("default", "a", 3)
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxLen("default") == 0 }, "the first events")

	e.replica.Stop(t)
	var during []string
	calls := testenv.RedisCommandStats(t, e.rc)["wait"].Calls
	outage := time.Now()
	for range 20 {
		during = append(during, e.write("default", "a", 2)...)
		testenv.Eventually(t, 5*time.Second, func() bool { return e.outboxLen("default") == 0 }, "events published while the replica is down")
	}
	elapsed := time.Since(outage)
	// One WAIT timed out; later probes find the replica gone (INFO) and
	// do not wait.
	if n := testenv.RedisCommandStats(t, e.rc)["wait"].Calls - calls; n > 1 {
		t.Errorf("%d WAITs in %s while the replica was down; want 1", n, elapsed.Round(time.Millisecond))
	}
	if elapsed > 20*time.Second {
		t.Errorf("20 batches took %s while the replica was down", elapsed)
	}
	marks := e.marks()
	for _, id := range before {
		if marks[id] != "" {
			t.Errorf("event %s before the outage marked %q", id, marks[id])
		}
	}
	for i, id := range during {
		want := "0/1 behind"
		if i < 2 {
			want = "0/1 timeout"
		}
		if marks[id] != want {
			t.Errorf("event %s during the outage marked %q, want %q", id, marks[id], want)
		}
	}
	st := r.WaitStatus()
	if !st.Behind || st.Reason != "timeout" || st.Unconfirmed != uint64(len(during)) || st.Since.IsZero() {
		t.Errorf("WaitStatus = %+v; want behind since the timeout, %d unconfirmed", st, len(during))
	}
	if got := promtest.MustValue(t, reg, "cronstream_relay_unconfirmed_total"); got != float64(len(during)) {
		t.Errorf("cronstream_relay_unconfirmed_total = %v, want %d", got, len(during))
	}
	if got := promtest.MustValue(t, reg, "cronstream_relay_redis_wait_behind"); got != 1 {
		t.Errorf("cronstream_relay_redis_wait_behind = %v, want 1", got)
	}
	checkExactlyOnce(t, e.stored(), append(before, during...))

	e.replica.Start(t)
	e.replica.Follow(t, e.primary)
	// Each probe looks again; a batch confirmed ends the outage.
	testenv.Eventually(t, 20*time.Second, func() bool {
		e.write("default", "a", 1)
		testenv.Eventually(t, 5*time.Second, func() bool { return e.outboxLen("default") == 0 }, "an event while the replica catches up")
		return !r.WaitStatus().Behind
	}, "the replica to confirm again: %v", lazyString(func() string {
		info, _ := e.rc.Info(context.Background(), "replication").Result()
		return fmt.Sprintf("%+v; primary: %s", r.WaitStatus(), info)
	}))
	last := e.write("default", "a", 1)[0]
	testenv.Eventually(t, 10*time.Second, func() bool { return e.outboxLen("default") == 0 }, "the last event")
	if mark := e.marks()[last]; mark != "" {
		t.Errorf("event %s after the replica came back marked %q", last, mark)
	}
}

// TestRelayMarkKeepsDuplicatesAndForgeryCheck: an earlier publish of a
// record carried the mark; the relay's unmarked publish of it is a
// duplicate, not a forgery, and the stream keeps the first.
func TestRelayMarkKeepsDuplicatesAndForgeryCheck(t *testing.T) {
	t.Parallel()
	e := newReplicatedEnv(t)
	ids := e.write("default", "a", 2)
	c := ctx(t, 10*time.Second)
	recs, err := e.store.ReadOutbox(c, prefix, "default", "", 1)
	if err != nil || len(recs) != 1 {
		t.Fatalf("read the outbox: %v %v", recs, err)
	}
	earlier := &nats.Msg{Subject: names.FireSubject("a"), Data: recs[0].Data, Header: nats.Header{}}
	earlier.Header.Set(jetstream.MsgIDHeader, ids[0])
	earlier.Header.Set(events.HeaderRedisUnconfirmed, "0/1 timeout")
	if _, err := e.js.PublishMsg(c, earlier); err != nil {
		t.Fatal(err)
	}
	r := e.newRelay("r1", func(c *relay.Config) { c.WaitReplicas = 1 })
	if _, err := r.Pass(ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := r.Forgeries(); got != 0 {
		t.Errorf("Forgeries() = %d: a marked earlier publish taken for a forgery", got)
	}
	checkExactlyOnce(t, e.stored(), ids)
	if m := e.marks(); m[ids[0]] != "0/1 timeout" || m[ids[1]] != "" {
		t.Errorf("marks %v; want the first publish's kept, the second unmarked", m)
	}
}

// TestRelayWaitRefused: a Redis user without WAIT: the events are
// published, marked refused, and the relay says so.
func TestRelayWaitRefused(t *testing.T) {
	t.Parallel()
	e := newReplicatedEnv(t)
	bg := context.Background()
	if err := e.rc.Do(bg, "ACL", "SETUSER", "nowait", "on", ">pw", "~*", "+@all", "-wait").Err(); err != nil {
		t.Fatal(err)
	}
	opts := e.primary.Options()
	opts.Username, opts.Password = "nowait", "pw"
	limited := redis.NewClient(opts)
	t.Cleanup(func() { _ = limited.Close() })
	e.store = taskstate.New(limited)
	ids := e.write("default", "a", 3)
	r := e.newRelay("r1", func(c *relay.Config) { c.WaitReplicas = relay.WaitAuto })
	if _, err := r.Pass(ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, e.stored(), ids)
	for _, id := range ids {
		if mark := e.marks()[id]; mark != "0/1 refused" {
			t.Errorf("event %s marked %q, want \"0/1 refused\"", id, mark)
		}
	}
	if st := r.WaitStatus(); !st.Behind || st.Reason != "refused" {
		t.Errorf("WaitStatus = %+v; want behind, refused", st)
	}
}

// TestRelayWaitsOnClusterMaster: on a Redis Cluster each queue's batch
// waits on the master of its outbox's slot, for that master's replicas:
// with the replica of one master frozen, the relay waits on that master
// and its queue's events stay in the outbox; once it runs again, they and
// the events of a queue whose master has no replica (not waited for) are
// published unmarked.
func TestRelayWaitsOnClusterMaster(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	cluster := testenv.StartRedisCluster(t)
	cc := cluster.Client(t)
	e.store = taskstate.New(cc)
	replica := cluster.AddReplica(t, 0)
	bg := context.Background()
	queueOn := func(addr string) string {
		for i := 0; ; i++ {
			q := fmt.Sprintf("q%d", i)
			if m, err := cc.MasterForKey(bg, taskstate.Own(prefix, q).Outbox()); err == nil && m.Options().Addr == addr {
				return q
			}
		}
	}
	withReplica, without := queueOn(cluster.Addrs[0]), queueOn(cluster.Addrs[1])
	// The relay sees the replica (WaitAuto) before it is frozen.
	first := e.write(withReplica, "a", 1)
	r := e.newRelay("r1", func(c *relay.Config) { c.WaitReplicas, c.WaitTimeout = relay.WaitAuto, time.Minute })
	start(t, r)
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxLen(withReplica) == 0 }, "the first event")

	replica.Freeze(t)
	held := e.write(withReplica, "a", 3)
	free := e.write(without, "b", 3)
	master0 := redis.NewClient(&redis.Options{Addr: cluster.Addrs[0]})
	t.Cleanup(func() { _ = master0.Close() })
	testenv.Eventually(t, 10*time.Second, func() bool { return blockedInWait(t, master0) }, "the relay to wait on the master of %s", withReplica)
	if n := e.outboxLen(withReplica); n != 3 {
		t.Fatalf("%d records left in the outbox of %s while its master's replica is frozen, want 3", n, withReplica)
	}
	replica.Thaw(t)
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxLen(withReplica) == 0 && e.outboxLen(without) == 0 }, "the events after the thaw")
	marks := e.marks()
	for _, id := range append(append(first, held...), free...) {
		if m, ok := marks[id]; !ok || m != "" {
			t.Errorf("event %s: stored %v, mark %q; want stored unmarked", id, ok, m)
		}
	}
}

type lazyString func() string

func (f lazyString) String() string { return f() }
