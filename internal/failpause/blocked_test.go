package failpause_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/failpause"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/schedule"
)

// archive puts a task of entry into queue's archived set, archived now,
// as an asynq worker does.
func archive(t *testing.T, rc redis.UniversalClient, names events.Names, entry, queue string, tick time.Time) string {
	t.Helper()
	ctx := context.Background()
	id := schedule.TaskID(names.Prefix(), entry, tick.Truncate(time.Second))
	b, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "work", ID: id, Queue: queue, ErrorMsg: "disk full", LastFailedAt: time.Now().Unix()})
	if err != nil {
		t.Fatal(err)
	}
	k := taskstate.Keys(queue)
	if err := rc.HSet(ctx, k.Task(id), "msg", b, "state", taskstate.StateArchived).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.ZAdd(ctx, k.Archived(), redis.Z{Score: float64(time.Now().Add(2 * time.Second).Unix()), Member: id}).Err(); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestPauseBlockedIsReported: a decided pause that cannot be published is
// never silent. A request the readers refused after the entry's config
// event (here a holder of a replica credential publishing one of another
// form) holds the entry's revision, so the pause waits for the entry's
// next config change: one error line, the error metric, and Ready fails
// once it lasted BlockedAfter; an operator's change lets it through. A
// config stream made before fail-pause requests blocks it the same way,
// saying to run `streams apply`.
func TestPauseBlockedIsReported(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	rc := testenv.StartRedis(t).Client(t)
	names := events.MustNames("blocked")
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	client := events.NewClient(js, names)
	e := events.Entry{ID: "e", Cron: "0 0 1 1 *", Task: events.Task{Type: "work"}, Options: events.Options{Queue: "bq"}, PauseOnFailure: true}
	res, err := client.Put(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	// A request of another form, conditional on the entry's revision: the
	// server stores it, the readers refuse it.
	forged := res.Entry
	forged.Paused, forged.Note = true, "forged"
	raw, _ := json.Marshal(forged)
	ev, _ := events.NewEvent(events.TypeEntryPaused+events.GatedSuffix, "cronstream/evil", "e", json.RawMessage(raw))
	data, _ := ev.Marshal()
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, ev.ID)
	h.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(res.Revision, 10))
	h.Set(jetstream.ExpectedLastSubjSeqSubjHeader, names.EntryRevisionFilter("e"))
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: names.FailPauseSubject("e"), Header: h, Data: data})
	if err != nil {
		t.Fatal(err)
	}
	proj := startProjector(t, js, names)
	if err := proj.WaitFor(ctx, ack.Sequence); err != nil {
		t.Fatal(err)
	}
	archive(t, rc, names, "e", "bq", time.Now().Add(-time.Minute))

	var clockOffset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(clockOffset.Load())) }
	logs := &logLines{}
	metrics := failpause.NewMetrics(nil)
	w := newWatcher(t, failpause.Config{Store: taskstate.New(rc), Projection: proj, Entries: client, Names: names,
		Logger: slog.New(logs), Metrics: metrics, Now: now})
	for range 3 {
		if got := w.Scan(ctx); len(got) != 0 {
			t.Fatalf("paused %v past a refused request", got)
		}
	}
	if logs.count("pause on failure blocked") != 1 || value(t, metrics.Errors) < 3 || value(t, metrics.Pending) != 1 || w.Ready() != nil {
		t.Fatalf("blocked pause: %d lines, errors %v, pending %v, ready %v: %q", logs.count("pause on failure blocked"),
			value(t, metrics.Errors), value(t, metrics.Pending), w.Ready(), logs.tail())
	}
	clockOffset.Store(int64(failpause.BlockedAfter + time.Second))
	w.Scan(ctx)
	if err := w.Ready(); err == nil || !strings.Contains(err.Error(), "entry e blocked") || !strings.Contains(err.Error(), "next config change") {
		t.Fatalf("ready after %s blocked: %v", failpause.BlockedAfter, err)
	}
	// The operator's change (any config event) lets the pause through.
	e.Note = "touched"
	if _, err := client.Put(ctx, e); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(w.Scan(ctx)) == 1 }, "never paused after the operator's change: %q", logs.tail())
	if err := w.Ready(); err != nil {
		t.Fatalf("ready after the pause: %v", err)
	}

	// A config stream without the fail-pause subjects.
	old := events.MustNames("oldstream")
	cfg, err := events.StreamConfig{Names: old}.ConfigStreamConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Subjects = []string{old.ConfigFilter()}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	oldClient := events.NewClient(js, old, events.WithRetryBudget(time.Second))
	res, err = oldClient.Put(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	oldProj := startProjector(t, js, old)
	if err := oldProj.WaitFor(ctx, res.Revision); err != nil {
		t.Fatal(err)
	}
	archive(t, rc, old, "e", "bq", time.Now().Add(-time.Minute))
	logs = &logLines{}
	w = newWatcher(t, failpause.Config{Store: taskstate.New(rc), Projection: oldProj, Entries: oldClient, Names: old, Logger: slog.New(logs)})
	if got := w.Scan(ctx); len(got) != 0 {
		t.Fatalf("paused %v", got)
	}
	if logs.count("streams apply") != 1 {
		t.Fatalf("no line saying to run streams apply: %q", logs.tail())
	}
}
