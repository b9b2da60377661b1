package scheduler_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/ownership"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/internal/testlog"
	"github.com/cronstream/cronstream/projector"
)

// The integration tests run the scheduler the way a replica does: each node
// has its own NATS connection, projector, membership, relay, shard
// ownership and scheduler. Only the servers are shared: one real
// redis-server and one embedded nats-server per test.

const testPrefix = "st"

var testNames = events.MustNames(testPrefix)

// heartbeat is the nodes' membership heartbeat: short, so a crashed node
// leaves the live set within a couple of seconds.
const heartbeat = 500 * time.Millisecond

type env struct {
	t      *testing.T
	redis  *testenv.Redis
	nats   *testenv.NATS
	rc     *redis.Client
	js     jetstream.JetStream
	client *events.Client
	store  *taskstate.Store
}

func newEnv(t *testing.T, streams ...events.StreamConfig) *env {
	t.Helper()
	e := &env{t: t, redis: testenv.StartRedis(t), nats: testenv.StartNATS(t)}
	e.rc = e.redis.Client(t)
	e.store = taskstate.New(e.rc)
	e.js = e.nats.JetStream(t)
	cfg := events.StreamConfig{Names: testNames}
	if len(streams) > 0 {
		cfg = streams[0]
		cfg.Names = testNames
	}
	if err := events.EnsureStreams(testenv.Context(t, 30*time.Second), e.js, cfg); err != nil {
		t.Fatalf("ensure streams: %v", err)
	}
	e.client = events.NewClient(e.js, testNames, events.WithSource("test"))
	return e
}

// testLogger logs into t's log: errors only, everything down to debug when
// CRONSTREAM_TEST_LOG is set.
func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("CRONSTREAM_TEST_LOG") != "" {
		return testlog.Logger(t, slog.LevelDebug)
	}
	// Shown only when the test fails: what went wrong on the way.
	return testlog.Logger(t, slog.LevelWarn)
}

var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

func every(id, spec string, mod ...func(*events.Entry)) events.Entry {
	e := events.Entry{ID: id, Cron: spec, Task: events.Task{Type: "tick:" + id, Payload: []byte(`{"id":"` + id + `"}`)}}
	for _, m := range mod {
		m(&e)
	}
	return e
}

// entriesOf returns entry(i) for each i in [0, n).
func entriesOf(n int, entry func(i int) events.Entry) []events.Entry {
	out := make([]events.Entry, n)
	for i := range out {
		out[i] = entry(i)
	}
	return out
}

func (e *env) put(entries ...events.Entry) uint64 {
	e.t.Helper()
	var rev uint64
	for _, en := range entries {
		res, err := e.client.Put(testenv.Context(e.t, 10*time.Second), en)
		if err != nil {
			e.t.Fatalf("put %s: %v", en.ID, err)
		}
		rev = res.Revision
	}
	return rev
}

// nodeOpts tune one node.
type nodeOpts struct {
	sched func(*scheduler.Config)
	relay func(*relay.Config)
	// clock, when set, replaces the local clock (tests shift it to make
	// time pass for the scheduler without waiting).
	clock *scheduler.Clock
	// noRelay runs no relay (records stay in the outbox).
	noRelay bool
	// projection wraps the node's projection (fence tests).
	projection func(*projector.Projector) scheduler.Projection
	// rc is the node's Redis client (default: one on the test's server).
	rc *redis.Client
	// noHistory runs the node without the stream History a replica always
	// has (replica.Run wires NewStreamHistory): with ownership, an entry
	// that changes queue changes shard, and its new owner closes the old
	// queue only through the history.
	noHistory bool
	// ownsAll runs the node without shard ownership: it fires every
	// entry, as a lone replica (tests where several replicas must each
	// try every tick).
	ownsAll bool
	// own tunes the node's ownership.
	own func(*ownership.Config)
	// members, when set, replaces the membership ownership follows (split
	// views).
	members func(*replica.Membership) ownership.Members
	// natsURL is the NATS server the node connects to (default the
	// test's; a proxy's to cut the node off).
	natsURL string
	// beat, when set, is called before each of the node's heartbeats (a
	// test blocks it to freeze the node).
	beat func()
	// info, when set, adds to each of the node's heartbeats (what a
	// replica reports for status).
	info func(*replica.Info)
}

// node is one replica wired by hand.
type node struct {
	id      string
	nc      *nats.Conn
	js      jetstream.JetStream
	rc      *redis.Client
	store   *taskstate.Store
	proj    *projector.Projector
	members *replica.Membership
	relay   *relay.Relay
	sched   *scheduler.Scheduler
	metrics *scheduler.Metrics // the scheduler's (counts)
	own     *ownership.Manager // nil with ownsAll
	firing  atomic.Pointer[scheduler.Scheduler]
	once    sync.Once
}

// readyToOwn is the node's readiness for shards, as a replica's.
func (n *node) readyToOwn() bool {
	s := n.firing.Load()
	return n.proj.CaughtUp() && (s == nil || s.Fenced() < ownership.FencedFor)
}

func (e *env) startNode(id string, o nodeOpts) *node {
	e.t.Helper()
	t := e.t
	n := &node{id: id}
	if o.natsURL != "" {
		var err error
		if n.nc, err = nats.Connect(o.natsURL, nats.Name(id), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
			nats.IgnoreDiscoveredServers(), nats.RetryOnFailedConnect(true)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.nc.Close)
	} else {
		n.nc = e.nats.Connect(t, nats.Name(id))
	}
	js, err := jetstream.New(n.nc)
	if err != nil {
		t.Fatal(err)
	}
	n.js = js
	n.rc = o.rc
	if n.rc == nil {
		n.rc = e.redis.Client(t)
	}
	n.store = taskstate.New(n.rc)
	log := testLogger(t).With("replica", id)

	if n.proj, err = projector.New(projector.Config{JS: js, Names: testNames, Logger: log, Heartbeat: 500 * time.Millisecond}); err != nil {
		t.Fatalf("%s: new projector: %v", id, err)
	}
	if err := n.proj.Start(testenv.Context(t, 30*time.Second)); err != nil {
		t.Fatalf("%s: start projector: %v", id, err)
	}
	kv, err := replica.OpenReplicasBucket(testenv.Context(t, 10*time.Second), js, testNames, 1, 3*heartbeat)
	if err != nil {
		t.Fatalf("%s: replicas bucket: %v", id, err)
	}
	if n.members, err = replica.NewMembership(replica.MembershipConfig{KV: kv, JS: js, Self: replica.Info{ID: id, Started: time.Now()}, Interval: heartbeat, Logger: log,
		Update: func(i *replica.Info) {
			if o.beat != nil {
				o.beat()
			}
			i.Shards, i.Ready = !o.ownsAll, n.readyToOwn()
			if o.info != nil {
				o.info(i)
			}
		}}); err != nil {
		t.Fatalf("%s: new membership: %v", id, err)
	}
	if err := n.members.Start(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatalf("%s: membership: %v", id, err)
	}
	rcfg := relay.Config{
		Outbox: n.store, JS: js, Names: testNames, Owner: id,
		Interval: 100 * time.Millisecond, LeaseTTL: 2 * time.Second, Logger: log,
	}
	if o.relay != nil {
		o.relay(&rcfg)
	}
	if n.relay, err = relay.New(rcfg); err != nil {
		t.Fatalf("%s: new relay: %v", id, err)
	}
	if !o.noRelay {
		if err := n.relay.Start(testenv.Context(t, time.Second)); err != nil {
			t.Fatalf("%s: start relay: %v", id, err)
		}
	}
	var proj scheduler.Projection = n.proj
	if o.projection != nil {
		proj = o.projection(n.proj)
	}
	if !o.ownsAll {
		var members ownership.Members = n.members
		if o.members != nil {
			members = o.members(n.members)
		}
		ocfg := ownership.Config{Store: n.store, Members: members, Names: testNames, ReplicaID: id,
			Queues: n.proj.Queues, Ready: n.readyToOwn, HeardNATS: n.members.LastBeat,
			MemberTTL: 3 * heartbeat, Logger: log}
		if o.own != nil {
			o.own(&ocfg)
		}
		if n.own, err = ownership.New(ocfg); err != nil {
			t.Fatalf("%s: new ownership: %v", id, err)
		}
	}
	scfg := scheduler.Config{
		Redis: n.rc, Projection: proj, Names: testNames,
		ReplicaID: id, Clock: o.clock, Visibility: time.Second,
		OutboxBytes: n.relay.BacklogBytes, OnFire: n.relay.Notify, Logger: log,
	}
	if n.own != nil {
		scfg.Shards = n.own
	}
	if !o.noHistory {
		scfg.History = scheduler.NewStreamHistory(n.js, testNames)
	}
	if o.sched != nil {
		o.sched(&scfg)
	}
	if scfg.Metrics == nil {
		scfg.Metrics = scheduler.NewMetrics(nil)
	}
	n.metrics = scfg.Metrics
	n.sched, err = scheduler.New(scfg)
	if err != nil {
		t.Fatalf("%s: new scheduler: %v", id, err)
	}
	if err := n.sched.Start(testenv.Context(t, 30*time.Second)); err != nil {
		t.Fatalf("%s: start scheduler: %v", id, err)
	}
	n.firing.Store(n.sched)
	if n.own != nil {
		n.members.Refresh() // ready now: said at once
		if err := n.own.Start(testenv.Context(t, 10*time.Second)); err != nil {
			t.Fatalf("%s: start ownership: %v", id, err)
		}
	}
	t.Cleanup(n.stop)
	return n
}

// stop shuts the node down as a replica does on SIGTERM: firing stops, the
// outbox is flushed, the heartbeat removed.
func (n *node) stop() {
	n.once.Do(func() {
		c, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = n.sched.Stop(c)
		if n.own != nil {
			_ = n.own.Stop(c)
		}
		_ = n.relay.Stop(c)
		_ = n.members.Stop(c)
		_ = n.proj.Stop(c)
		n.nc.Close()
	})
}

// crash stops the node as kill -9 would: connections drop first, nothing is
// flushed, released or removed; its leases and heartbeat expire on their own.
func (n *node) crash() {
	n.once.Do(func() {
		n.nc.Close()
		_ = n.rc.Close()
		dead, cancel := context.WithCancel(context.Background())
		cancel()
		_ = n.sched.Stop(dead)
		if n.own != nil {
			_ = n.own.Stop(dead)
		}
		_ = n.relay.Stop(dead)
		_ = n.members.Stop(dead)
		_ = n.proj.Stop(dead)
	})
}

// shiftClock is a scheduler clock that runs ahead of the local one by an
// adjustable offset.
type shiftClock struct {
	off   atomic.Int64
	clock *scheduler.Clock
}

func newShiftClock(t testing.TB, offset time.Duration) *shiftClock {
	c := &shiftClock{}
	c.clock = scheduler.NewClock(func(context.Context) (time.Time, error) {
		return time.Now().Add(time.Duration(c.off.Load())), nil
	})
	c.set(t, offset)
	return c
}

func (c *shiftClock) set(t testing.TB, offset time.Duration) {
	c.off.Store(int64(offset))
	if err := c.clock.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (c *shiftClock) now() time.Time { return c.clock.Now() }

// waitUntil waits (for the scenario's sake, not as synchronisation) until
// the clock passes at.
func waitUntil(t testing.TB, now func() time.Time, at time.Time) {
	t.Helper()
	testenv.Eventually(t, time.Until(at)+time.Minute, func() bool { return !now().Before(at) }, "clock to pass %s", at)
}

// activity is one event read back from <P>_ACTIVITY.
type activity struct {
	Seq     uint64
	MsgID   string
	Subject string
	Type    string
	Fired   events.Fired
	Skipped events.Skipped
	// Cancelled is a cronstream.task.cancelled event's data.
	Cancelled events.TaskCancelled
	// Lost is a cronstream.task.lost event's data.
	Lost events.TasksLost
	// Unconfirmed is the message's events.HeaderRedisUnconfirmed.
	Unconfirmed string
}

// readActivity returns every event in the activity stream, in stream order.
func (e *env) readActivity() []activity {
	e.t.Helper()
	var out []activity
	for _, m := range testenv.StreamMsgs(e.t, e.js, testNames.ActivityStream()) {
		ev, err := events.DecodeEvent(m.Data)
		if err != nil {
			e.t.Fatalf("activity seq %d: %v", m.Sequence, err)
		}
		a := activity{Seq: m.Sequence, MsgID: m.Header.Get(jetstream.MsgIDHeader), Subject: m.Subject, Type: ev.Type,
			Unconfirmed: m.Header.Get(events.HeaderRedisUnconfirmed)}
		if a.MsgID != ev.ID {
			e.t.Fatalf("activity seq %d: Nats-Msg-Id %q is not the event id %q", a.Seq, a.MsgID, ev.ID)
		}
		switch ev.Type {
		case events.TypeEntryFired:
			if err := ev.DecodeData(&a.Fired); err != nil {
				e.t.Fatal(err)
			}
		case events.TypeEntrySkipped:
			if err := ev.DecodeData(&a.Skipped); err != nil {
				e.t.Fatal(err)
			}
		case events.TypeTaskCancelled:
			if err := ev.DecodeData(&a.Cancelled); err != nil {
				e.t.Fatal(err)
			}
		case events.TypeTaskLost:
			if err := ev.DecodeData(&a.Lost); err != nil {
				e.t.Fatal(err)
			}
		}
		out = append(out, a)
	}
	return out
}

// waitActivity waits until the activity stream holds at least n events.
func (e *env) waitActivity(n uint64, timeout time.Duration) {
	e.t.Helper()
	var have uint64
	if !testenv.WaitFor(timeout, func() bool {
		have = testenv.StreamMsgCount(e.js, testNames.ActivityStream())
		return have >= n
	}) {
		e.t.Fatalf("activity stream to hold %d events within %s: has %d", n, timeout, have)
	}
}

// outboxLen is the number of records waiting in queue's outbox.
func (e *env) outboxLen(queue string) int64 {
	n, err := e.store.OutboxLen(context.Background(), testPrefix, queue)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// outboxEvents is the number of events in the records waiting in queue's
// outbox (a multi-record holds several).
func (e *env) outboxEvents(queue string) int {
	recs, err := e.store.ReadOutbox(context.Background(), testPrefix, queue, "", 100_000)
	if err != nil {
		e.t.Fatal(err)
	}
	n := 0
	for _, r := range recs {
		n += len(outbox.EventIDs(r.EventID, r.Data))
	}
	return n
}

// waitOutboxEmpty waits until every listed queue's outbox is empty; if one
// is not, it says how many records wait and which relay holds its lease.
func (e *env) waitOutboxEmpty(timeout time.Duration, queues ...string) {
	e.t.Helper()
	var left []string
	if !testenv.WaitFor(timeout, func() bool {
		left = left[:0]
		for _, q := range queues {
			if n := e.outboxLen(q); n != 0 {
				key := taskstate.Own(testPrefix, q).OutboxOwner()
				holder, _ := e.rc.Get(context.Background(), key).Result()
				ttl, _ := e.rc.PTTL(context.Background(), key).Result()
				left = append(left, fmt.Sprintf("%s: %d records, lease held by %q for %s", q, n, holder, ttl))
			}
		}
		return len(left) == 0
	}) {
		for _, q := range queues {
			recs, _ := e.store.ReadOutbox(context.Background(), testPrefix, q, "", 5)
			for _, r := range recs {
				left = append(left, fmt.Sprintf("%s holds record %s: %s", q, r.StreamID, strings.Join(outbox.EventIDs(r.EventID, r.Data), " ")))
			}
		}
		e.t.Fatalf("outboxes %v to drain within %s: %s", queues, timeout, strings.Join(left, "; "))
	}
}

// pendingIDs returns the task ids in queue's asynq pending list.
func (e *env) pendingIDs(queue string) []string {
	e.t.Helper()
	ids, err := e.rc.LRange(context.Background(), taskstate.Keys(queue).Pending(), 0, -1).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// taskCount is the number of tasks in queue's pending list.
func (e *env) taskCount(queue string) int64 {
	n, err := e.rc.LLen(context.Background(), taskstate.Keys(queue).Pending()).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// taskExists reports whether queue holds task id.
func (e *env) taskExists(queue, id string) bool {
	n, err := e.rc.Exists(context.Background(), taskstate.Keys(queue).Task(id)).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return n == 1
}

// ledger is what the activity stream says happened to one entry.
type ledger struct {
	fired   map[int64]int // unix second → fired events
	taskIDs map[string]int
	skipped []events.Skipped
	order   []time.Time // scheduled_at of fired events, in stream order
}

func ledgers(acts []activity) map[string]*ledger {
	out := map[string]*ledger{}
	get := func(id string) *ledger {
		l := out[id]
		if l == nil {
			l = &ledger{fired: map[int64]int{}, taskIDs: map[string]int{}}
			out[id] = l
		}
		return l
	}
	for _, a := range acts {
		switch a.Type {
		case events.TypeEntryFired:
			l := get(a.Fired.Entry)
			if a.Fired.Trigger == "" {
				l.fired[a.Fired.ScheduledAt.Unix()]++
				l.order = append(l.order, a.Fired.ScheduledAt)
			}
			l.taskIDs[a.Fired.TaskID]++
		case events.TypeEntrySkipped:
			l := get(a.Skipped.Entry)
			l.skipped = append(l.skipped, a.Skipped)
		}
	}
	return out
}

// handled returns, per second, how many times the ledger handled the tick
// (fired, or covered by a skipped event).
func (l *ledger) handled() map[int64]int {
	h := map[int64]int{}
	for s, n := range l.fired {
		h[s] += n
	}
	for _, sk := range l.skipped {
		last := sk.ScheduledAt
		if sk.Until != nil {
			last = *sk.Until
		}
		for s := sk.ScheduledAt.Unix(); s <= last.Unix(); s++ {
			h[s]++
		}
	}
	return h
}

// firedRange returns the first and last fired second.
func (l *ledger) firedRange() (int64, int64) {
	keys := make([]int64, 0, len(l.fired))
	for k := range l.fired {
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return 0, 0
	}
	slices.Sort(keys)
	return keys[0], keys[len(keys)-1]
}

// checkEverySecond asserts that entry's ticks in [from, to] (unix seconds,
// every second) were each handled exactly once: fired (with a task in
// Redis, when queue is set) or skipped.
func checkEverySecond(t testing.TB, entry string, l *ledger, from, to int64) {
	t.Helper()
	h := l.handled()
	var missing, double []int64
	for s := from; s <= to; s++ {
		switch n := h[s]; {
		case n == 0:
			missing = append(missing, s)
		case n > 1:
			double = append(double, s)
		}
	}
	for s, n := range h {
		if (s < from || s > to) && n > 1 {
			double = append(double, s)
		}
	}
	sort.Slice(double, func(i, j int) bool { return double[i] < double[j] })
	if len(missing) > 0 || len(double) > 0 {
		t.Errorf("entry %s, ticks %s..%s: missing %s, handled twice %s", entry, fmtUnix(from), fmtUnix(to), fmtUnixes(missing), fmtUnixes(double))
	}
}

func fmtUnix(s int64) string { return time.Unix(s, 0).UTC().Format("15:04:05") }

func fmtUnixes(ss []int64) string {
	if len(ss) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(ss))
	for _, s := range ss {
		parts = append(parts, fmtUnix(s))
	}
	if len(parts) > 20 {
		parts = append(parts[:20], fmt.Sprintf("… (%d)", len(ss)))
	}
	return strings.Join(parts, " ")
}
