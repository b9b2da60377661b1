package relay_test

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// writeTicks fires one plain tick of n entries of queue in one batch, as
// the scheduler fires a second's due entries (the fire script's bulk path,
// so the fired records share multi-records), every other record compact.
// It returns the events' ids and the JSON each is to be published as.
func (e *env) writeTicks(queue string, n int) ([]string, [][]byte) {
	e.t.Helper()
	now := time.Now().UTC()
	e.n++
	tick := time.Unix(1_700_000_000+int64(e.n), 0).UTC()
	fires := make([]taskstate.Fire, n)
	ids := make([]string, n)
	want := make([][]byte, n)
	for i := range fires {
		entry := fmt.Sprintf("m%d", i)
		taskID := fmt.Sprintf("%s:%s:%d", prefix, entry, tick.Unix())
		ids[i] = fmt.Sprintf("fire:%s:%d", entry, tick.Unix())
		fired := events.Fired{Entry: entry, ScheduledAt: tick, EnqueuedAt: now, TaskID: taskID, Queue: queue, Revision: 7, Replica: "test"}
		rec := outbox.AppendFiredRecord(nil, &fired)
		want[i], _, _ = outbox.ExpandFiredRecord(nil, ids[i], rec, queue)
		if i%2 == 1 {
			rec = want[i]
		}
		fires[i] = taskstate.NewTickFire(prefix, queue, entry, tick, time.Time{}, false,
			&taskstate.TaskMessage{Type: "t", ID: taskID}, taskstate.Record{ID: ids[i], Data: rec})
	}
	res, err := e.store.FireBatch(ctx(e.t, 30*time.Second), taskstate.Fences{ConfigSeq: 1}, fires)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, r := range res {
		if r.Status != taskstate.StatusFired {
			e.t.Fatalf("fire: %s", r.Status)
		}
	}
	return ids, want
}

// TestRelayPublishesMultiRecords: the fired records of a bulk fire, held in
// a few multi-records, are published one message per event, in order, each
// under its own id on its entry's subject with the event's full JSON. A
// record of a multi-record that does not decode is dropped alone, a
// multi-record that does not frame is dropped whole, and the outbox empties.
func TestRelayPublishesMultiRecords(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	const queue = "q multi"
	ids, want := e.writeTicks(queue, 150)
	c := ctx(t, 30*time.Second)
	recs, err := e.store.ReadOutbox(c, prefix, queue, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || outbox.FormOf(recs[0].Data) != outbox.RecordMulti {
		t.Fatalf("%d outbox records for 150 fires, want 3 multi-records", len(recs))
	}

	// A hand-written multi-record: good, unroutable, not one event, good.
	good := ids[0] + "-again"
	goodJSON := bytes.Replace(want[0], []byte(ids[0]), []byte(good), 1)
	data := []byte(outbox.MultiRecordTag)
	data = outbox.AppendFrame(data, good, goodJSON)
	data = outbox.AppendFrame(data, "odd", []byte(`{"id":"odd","type":"com.example.odd","subject":"m1"}`))
	data = outbox.AppendFrame(data, "batch", []byte(outbox.BatchRecordTag+"[]"))
	last := ids[1] + "-again"
	data = outbox.AppendFrame(data, last, bytes.Replace(want[1], []byte(ids[1]), []byte(last), 1))
	for _, d := range [][]byte{data, []byte("M1 5 5 ab")} {
		if err := e.rc.XAdd(c, &redis.XAddArgs{Stream: taskstate.Own(prefix, queue).Outbox(), Values: []any{"id", "multi:hand", "data", d}}).Err(); err != nil {
			t.Fatal(err)
		}
	}

	var heard []string
	r := e.newRelay("r1", func(c *relay.Config) { c.OnPublished = func(ids []string) { heard = append(heard, ids...) } })
	if err := r.Flush(c); err != nil {
		t.Fatal(err)
	}
	// The replica hears of every event its relay handled, framed ones too
	// (the scheduler and the stall detector learn of their own fires so).
	if want := append(append([]string{}, ids...), good, "odd", "batch", last); !slices.Equal(heard, want) {
		t.Fatalf("OnPublished heard %d ids, want %d: %q", len(heard), len(want), heard)
	}
	msgs := e.storedMsgs()
	wantIDs := append(append([]string{}, ids...), good, last)
	if len(msgs) != len(wantIDs) {
		t.Fatalf("%d messages, want %d", len(msgs), len(wantIDs))
	}
	for i, m := range msgs[:len(ids)] {
		id := m.Header.Get(jetstream.MsgIDHeader)
		entry := strings.Split(ids[i], ":")[1]
		if id != ids[i] || m.Subject != names.FireSubject(entry) || !bytes.Equal(m.Data, want[i]) {
			t.Fatalf("message %d: %s on %s\n%s\nwant %s on %s\n%s", i, id, m.Subject, m.Data, ids[i], names.FireSubject(entry), want[i])
		}
	}
	for i, m := range msgs[len(ids):] {
		if id := m.Header.Get(jetstream.MsgIDHeader); id != wantIDs[len(ids)+i] {
			t.Fatalf("message %d: %s, want %s", len(ids)+i, id, wantIDs[len(ids)+i])
		}
	}
	if n := e.outboxLen(queue); n != 0 {
		t.Fatalf("%d records left", n)
	}
	// The two frames and the record dropped are counted (and logged).
	if n := r.Dropped(); n != 3 {
		t.Fatalf("%d records counted as dropped, want 3", n)
	}
}

// TestRelayOldMultiRecordChecked: a multi-record whose first events a relay
// published before it died, left in the outbox past the stream's duplicate
// window, has those events looked up and only the others published.
func TestRelayOldMultiRecordChecked(t *testing.T) {
	t.Parallel()
	const window = time.Second
	e := newEnvOn(t, testenv.StartNATS(t), window)
	ids, want := e.writeTicks("q", 10)
	c := ctx(t, 10*time.Second)
	for i := range 4 {
		entry := strings.Split(ids[i], ":")[1]
		if _, err := e.js.PublishMsg(c, &nats.Msg{Subject: names.FireSubject(entry), Data: want[i], Header: nats.Header{jetstream.MsgIDHeader: []string{ids[i]}}}); err != nil {
			t.Fatal(err)
		}
	}
	stale := time.Now().Add(2 * window)
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Now().After(stale) }, "the duplicate window to pass")
	r := e.newRelay("r2", func(c *relay.Config) { c.DuplicateWindow = window })
	if err := r.Flush(ctx(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, e.stored(), ids)
	if n := e.outboxLen("q"); n != 0 {
		t.Fatalf("%d records left", n)
	}
}
