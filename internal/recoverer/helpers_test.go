package recoverer_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/recoverer"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// prefix is the tenant prefix of every test's outboxes and streams.
const prefix = "rv"

var names = events.MustNames(prefix)

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// logSink is a slog handler that keeps every record, so tests can count
// what the recoverer reported, and echoes warnings to the test log.
type logSink struct {
	t  testing.TB
	mu sync.Mutex
	// msgs are "level msg key=value ..." lines.
	msgs []string
}

func (l *logSink) Enabled(context.Context, slog.Level) bool { return true }

func (l *logSink) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	l.msgs = append(l.msgs, b.String())
	l.mu.Unlock()
	return nil
}

func (l *logSink) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logSink) WithGroup(string) slog.Handler      { return l }

// count returns how many records contain every one of the substrings.
func (l *logSink) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
next:
	for _, m := range l.msgs {
		for _, s := range subs {
			if !strings.Contains(m, s) {
				continue next
			}
		}
		n++
	}
	return n
}

// newRecoverer builds a recoverer with test defaults (short interval and
// grace, the test's prefix, a logger into sink when given) for what cfg
// leaves zero.
func newRecoverer(t testing.TB, cfg recoverer.Config, sink *logSink) *recoverer.Recoverer {
	t.Helper()
	if cfg.Names == (events.Names{}) {
		cfg.Names = names
	}
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = "rep1"
	}
	if cfg.Interval == 0 {
		cfg.Interval = 100 * time.Millisecond
	}
	if cfg.Grace == 0 {
		cfg.Grace = time.Second
	}
	if sink == nil {
		sink = &logSink{t: t}
	}
	cfg.Logger = slog.New(sink)
	r, err := recoverer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// seedActive puts tasks into queue exactly as asynq's Dequeue leaves them
// (hash with msg and state active, id pushed at the head of the active
// list, lease entry at lease) in the order given, so ids[0] ends at the
// list's tail, and lists the queue in asynq:queues as asynq's client does.
// It returns the stored msg bytes by id.
func seedActive(t testing.TB, rc redis.UniversalClient, queue string, ids []string, lease time.Time, mutate func(*taskstate.TaskMessage)) map[string][]byte {
	t.Helper()
	ctx := context.Background()
	k := taskstate.Keys(queue)
	msgs := make(map[string][]byte, len(ids))
	if err := rc.SAdd(ctx, taskstate.AllQueuesKey, queue).Err(); err != nil {
		t.Fatal(err)
	}
	for start := 0; start < len(ids); start += 1000 {
		pipe := rc.Pipeline()
		for _, id := range ids[start:min(start+1000, len(ids))] {
			m := &taskstate.TaskMessage{Type: "work", Payload: []byte("payload-" + id), ID: id, Queue: queue,
				Retry: 25, Timeout: 1800, Headers: map[string]string{"h": "v"}}
			if mutate != nil {
				mutate(m)
			}
			b, err := taskstate.EncodeTaskMessage(m)
			if err != nil {
				t.Fatal(err)
			}
			msgs[id] = b
			pipe.HSet(ctx, k.Task(id), "msg", b, "state", taskstate.StateActive)
			pipe.LPush(ctx, k.Active(), id)
			pipe.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(lease.Unix()), Member: id})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("seed active tasks: %v", err)
		}
	}
	return msgs
}

// storedMsg decodes the msg field of a task hash.
func storedMsg(t testing.TB, rc redis.UniversalClient, queue, id string) *taskstate.TaskMessage {
	t.Helper()
	raw, err := rc.HGet(context.Background(), taskstate.Keys(queue).Task(id), "msg").Bytes()
	if err != nil {
		t.Fatalf("task %s/%s: %v", queue, id, err)
	}
	m, err := taskstate.DecodeTaskMessage(raw)
	if err != nil {
		t.Fatalf("task %s/%s: %v", queue, id, err)
	}
	return m
}

// outboxEventCount is the number of events in queue's outbox (a batch
// record holds several).
func outboxEventCount(t testing.TB, rc redis.UniversalClient, queue string) int64 {
	t.Helper()
	return int64(len(outboxEvents(t, rc, queue)))
}

// outboxEvents decodes every event of queue's outbox, in order.
func outboxEvents(t testing.TB, rc redis.UniversalClient, queue string) []*events.Event {
	t.Helper()
	msgs, err := rc.XRange(context.Background(), taskstate.Own(prefix, queue).Outbox(), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*events.Event, 0, len(msgs))
	for _, m := range msgs {
		data, _ := m.Values["data"].(string)
		id, _ := m.Values["id"].(string)
		if batch, ok := outbox.BatchEvents([]byte(data)); ok {
			evs, err := events.DecodeEvents(batch)
			if err != nil || len(evs) < 2 {
				t.Fatalf("outbox batch record %s: %d events, %v", m.ID, len(evs), err)
			}
			if want := events.BatchID(len(evs), evs[0].ID); id != want {
				t.Fatalf("outbox batch record %s: record id %q, want %q", m.ID, id, want)
			}
			out = append(out, evs...)
			continue
		}
		ev, err := events.DecodeEvent([]byte(data))
		if err != nil {
			t.Fatalf("outbox record %s: %v", m.ID, err)
		}
		if id != ev.ID {
			t.Fatalf("outbox record %s: record id %q, event id %q", m.ID, id, ev.ID)
		}
		out = append(out, ev)
	}
	return out
}

// --- NATS: streams, relay, reading the activity stream -----------------------

// startActivity starts an embedded NATS server with the tenant's streams.
func startActivity(t *testing.T) jetstream.JetStream {
	t.Helper()
	js := testenv.StartNATS(t).JetStream(t)
	if err := events.EnsureStreams(ctxT(t, 30*time.Second), js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	return js
}

// startRelay runs a relay for owner until the test ends.
func startRelay(t *testing.T, store *taskstate.Store, js jetstream.JetStream, owner string) *relay.Relay {
	t.Helper()
	rl, err := relay.New(relay.Config{Outbox: store, JS: js, Names: names, Owner: owner,
		Interval: 50 * time.Millisecond, Logger: slog.New(&logSink{t: t})})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rl.Stop(ctxT(t, 10*time.Second)); err != nil {
			t.Errorf("stop relay %s: %v", owner, err)
		}
	})
	return rl
}

// activityMsgs is the number of messages in the activity stream.
func activityMsgs(t testing.TB, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(ctxT(t, 10*time.Second), names.ActivityStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// activityEventCount is the number of events in the activity stream.
func activityEventCount(t testing.TB, js jetstream.JetStream) uint64 {
	t.Helper()
	return uint64(len(activityEvents(t, js)))
}

// streamEvent is one event of the activity stream.
type streamEvent struct {
	Subject string
	// MsgID is the message's Nats-Msg-Id header; for an event of a batch
	// message, whose header is checked to be events.BatchID, the event's
	// own id.
	MsgID string
	Event *events.Event
}

// activityEvents reads every event of the activity stream, in order.
func activityEvents(t testing.TB, js jetstream.JetStream) []streamEvent {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	want := activityMsgs(t, js)
	s, err := js.Stream(ctx, names.ActivityStream())
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]streamEvent, 0, want)
	for got := uint64(0); got < want; {
		batch, err := c.Fetch(int(min(want-got, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			evs, err := events.DecodeEvents(m.Data())
			if err != nil {
				t.Fatalf("activity message on %s: %v", m.Subject(), err)
			}
			msgID := m.Headers().Get(jetstream.MsgIDHeader)
			if events.IsBatch(m.Data()) {
				if want := events.BatchID(len(evs), evs[0].ID); msgID != want || len(evs) < 2 {
					t.Fatalf("batch of %d events on %s: Nats-Msg-Id %q, want %q", len(evs), m.Subject(), msgID, want)
				}
				msgID = ""
			}
			for _, ev := range evs {
				out = append(out, streamEvent{Subject: m.Subject(), MsgID: cmp.Or(msgID, ev.ID), Event: ev})
			}
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("fetch activity: %v", err)
		}
		if n == 0 {
			t.Fatalf("fetch activity: no messages after %d of %d", got, want)
		}
		got += uint64(n)
	}
	return out
}

// recovered decodes the data of a retried or archived event.
func recovered(t testing.TB, ev *events.Event) events.TaskRecovered {
	t.Helper()
	var d events.TaskRecovered
	if err := ev.DecodeData(&d); err != nil {
		t.Fatal(err)
	}
	return d
}

// --- asynq --------------------------------------------------------------------

// pastLeases moves every lease of queue to at, as if asynq's fixed 30 s
// lease had run out long ago (ZADD XX, like asynq's ExtendLease).
func pastLeases(t testing.TB, rc redis.UniversalClient, queue string, at time.Time) {
	t.Helper()
	ctx := context.Background()
	k := taskstate.Keys(queue)
	ids, err := rc.ZRange(ctx, k.Lease(), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if err := rc.ZAddXX(ctx, k.Lease(), redis.Z{Score: float64(at.Unix()), Member: id}).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeClock is a settable wall clock for Config.Now.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}
