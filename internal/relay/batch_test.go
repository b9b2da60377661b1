package relay_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// writeBatch writes one batch record of n recovery events of queue, each
// padded to about size bytes, as the recover script does, and returns its
// id and the events' ids and JSON.
func (e *env) writeBatch(queue string, n, size int) (string, []string, [][]byte) {
	e.t.Helper()
	c := ctx(e.t, 30*time.Second)
	var ids []string
	var evs [][]byte
	for range n {
		e.n++
		task := fmt.Sprintf("task-%d", e.n)
		id := events.RecoveredEventID(queue, task, 0, time.Unix(1_700_000_000, 0))
		b := eventtest.MarshalAt(e.t, id, time.Now(), events.TypeTaskRetried, "cronstream/test", queue, events.TaskRecovered{
			TaskID: task, Queue: queue, Type: "t", MaxRetry: 3, Error: strings.Repeat("e", size), Replica: "test",
		})
		ids, evs = append(ids, id), append(evs, b)
	}
	batchID := events.BatchID(n, ids[0])
	data := outbox.BatchRecordTag + "[" + string(bytes.Join(evs, []byte(","))) + "]"
	if err := e.store.RegisterOutbox(c, prefix, queue); err != nil {
		e.t.Fatal(err)
	}
	if err := e.rc.XAdd(c, &redis.XAddArgs{Stream: taskstate.Own(prefix, queue).Outbox(), Values: []any{"id", batchID, "data", data}}).Err(); err != nil {
		e.t.Fatal(err)
	}
	return batchID, ids, evs
}

// storedMsgs are the activity stream's messages: Nats-Msg-Id, subject and
// data.
func (e *env) storedMsgs() []jetstream.RawStreamMsg {
	e.t.Helper()
	return testenv.StreamMsgs(e.t, e.js, names.ActivityStream())
}

// TestRelayPublishesBatchRecords: a batch record (a mass recovery's) goes to
// the queue's recovery subject as one message, its data the JSON array of
// the events, under the record's id; the events decode as they were
// written.
func TestRelayPublishesBatchRecords(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	batchID, ids, evs := e.writeBatch("q one", 5, 100)
	fires := e.write("q one", "a", 2)
	r := e.newRelay("r1", nil)
	if err := r.Flush(ctx(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	msgs := e.storedMsgs()
	if len(msgs) != 3 {
		t.Fatalf("%d messages, want the batch and 2 fires", len(msgs))
	}
	b := msgs[0]
	if got := b.Header.Get(jetstream.MsgIDHeader); got != batchID || b.Subject != names.RecoverySubject("q one") {
		t.Fatalf("batch published as %q on %s, want %q on %s", got, b.Subject, batchID, names.RecoverySubject("q one"))
	}
	if want := "[" + string(bytes.Join(evs, []byte(","))) + "]"; string(b.Data) != want {
		t.Fatalf("batch data\n%s\nwant\n%s", b.Data, want)
	}
	got, err := events.DecodeEvents(b.Data)
	if err != nil || len(got) != len(ids) {
		t.Fatalf("batch decodes to %d events, %v", len(got), err)
	}
	for i, ev := range got {
		if ev.ID != ids[i] || ev.Type != events.TypeTaskRetried {
			t.Fatalf("event %d: %s %s, want %s", i, ev.ID, ev.Type, ids[i])
		}
	}
	for i, m := range msgs[1:] {
		if id := m.Header.Get(jetstream.MsgIDHeader); id != fires[i] {
			t.Fatalf("message %d: %s, want %s", i+1, id, fires[i])
		}
	}
	if n := e.outboxLen("q one"); n != 0 {
		t.Fatalf("%d records left", n)
	}
}

// TestRelaySplitsBatchOverMaxPayload: where the server takes less in one
// message than a batch holds, each of its events goes as its own message
// under its own id, in order, and the record is done once all are stored.
func TestRelaySplitsBatchOverMaxPayload(t *testing.T) {
	t.Parallel()
	e := newEnvOn(t, natsWithMaxPayload(t, 4096), 0)
	_, ids, evs := e.writeBatch("q", 10, 600) // about 8 KB
	r := e.newRelay("r1", nil)
	if err := r.Flush(ctx(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	msgs := e.storedMsgs()
	if len(msgs) != len(ids) {
		t.Fatalf("%d messages, want one per event (%d)", len(msgs), len(ids))
	}
	for i, m := range msgs {
		if id := m.Header.Get(jetstream.MsgIDHeader); id != ids[i] || !bytes.Equal(m.Data, evs[i]) || m.Subject != names.RecoverySubject("q") {
			t.Fatalf("message %d: %s on %s, want event %s", i, id, m.Subject, ids[i])
		}
	}
	if n := e.outboxLen("q"); n != 0 {
		t.Fatalf("%d records left", n)
	}
}

// TestRelayReadsLargeRecordsInSmallReads: a backlog of large batch records
// is read a few records at a time (about readBytes a read), from the first
// read on: a read of Batch of them would be one Redis call copying tens of
// megabytes.
func TestRelayReadsLargeRecordsInSmallReads(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	private := testenv.StartRedis(t, testenv.WithPrivateServer()).Client(t)
	e.rc, e.store = private, taskstate.New(private)
	const records = 24
	for range records {
		e.writeBatch("q", 4, 50_000) // about 200 KB a record
	}
	if err := private.ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	r := e.newRelay("r1", func(c *relay.Config) { c.Batch = 512 })
	if err := r.Flush(ctx(t, 60*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := e.storedCount(); n != records {
		t.Fatalf("%d messages, want %d", n, records)
	}
	reads := testenv.RedisCommandStats(t, private)["xrange"].Calls
	// 4.8 MB in reads of at most about 1 MB.
	if reads < 5 {
		t.Fatalf("%d XRANGE calls for %d records of 200 KB, want reads of about 1 MB", reads, records)
	}
}

// natsWithMaxPayload starts a NATS server that takes at most max bytes in
// one message.
func natsWithMaxPayload(t *testing.T, max int) *testenv.NATS {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("max_payload: %d\n", max)), 0o600); err != nil {
		t.Fatal(err)
	}
	return testenv.StartNATSFromConfig(t, conf)
}

// TestRelayOldBatchesChecked: a batch record that a relay published before
// it died, left in the outbox past the stream's duplicate window, is not
// published again: neither as one message, nor event by event where the
// server's max_payload splits it and the dead relay had stored only its
// first events (those are looked up, the others published).
func TestRelayOldBatchesChecked(t *testing.T) {
	t.Parallel()
	const window = time.Second
	for _, tc := range []struct {
		name       string
		maxPayload int // 0: the default, which takes the whole batch
	}{{"whole", 0}, {"split", 4096}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := testenv.StartNATS(t)
			if tc.maxPayload > 0 {
				n = natsWithMaxPayload(t, tc.maxPayload)
			}
			e := newEnvOn(t, n, window)
			batchID, ids, evs := e.writeBatch("q", 10, 600)
			c := ctx(t, 10*time.Second)
			subj := names.RecoverySubject("q")
			publish := func(id string, data []byte) {
				t.Helper()
				if _, err := e.js.PublishMsg(c, &nats.Msg{Subject: subj, Data: data, Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}); err != nil {
					t.Fatal(err)
				}
			}
			want := []string{batchID}
			if tc.maxPayload == 0 {
				publish(batchID, append(append([]byte("["), bytes.Join(evs, []byte(","))...), ']'))
			} else {
				for i := range 4 {
					publish(ids[i], evs[i])
				}
				want = ids
			}
			// Past the stream's window and half the relay's: the stream
			// would take a republished message as new.
			stale := time.Now().Add(2 * window)
			testenv.Eventually(t, 10*time.Second, func() bool { return time.Now().After(stale) }, "the duplicate window to pass")
			r := e.newRelay("r2", func(c *relay.Config) { c.DuplicateWindow = window })
			if err := r.Flush(ctx(t, 20*time.Second)); err != nil {
				t.Fatal(err)
			}
			checkExactlyOnce(t, e.stored(), want)
			if n := e.outboxLen("q"); n != 0 {
				t.Fatalf("%d records left", n)
			}
		})
	}
}
