package keygc_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/keygc"
	"github.com/cronstream/cronstream/internal/projectiontest"
	"github.com/cronstream/cronstream/internal/promtest"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/replicatest"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}

// TestRemovedEntryKeysDeletedAfterGrace runs a replica with a short grace:
// the keys of a removed entry (watermarks and handover markers in both
// queues it fired in, its scheduler history) are deleted once the grace has
// passed, while a live entry and an entry removed and registered again keep
// theirs, and the re-registered entry goes on firing each tick exactly once.
func TestRemovedEntryKeysDeletedAfterGrace(t *testing.T) {
	const grace = 3 * time.Second
	ns := testenv.StartNATS(t)
	rd := testenv.StartRedis(t)
	rc := rd.Client(t)
	js := ns.JetStream(t)
	names := events.MustNames("gc")
	prefix := names.Prefix()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r1 := replicatest.Start(t, replica.Config{
		NATSURL: ns.URL(), Redis: rc, Names: names, ReplicaID: "r1", SkipRedisChecks: true,
		RemovedKeyGrace: grace, KeySweepInterval: 200 * time.Millisecond,
	})

	client := events.NewClient(js, names)
	put := func(id, queue string) {
		t.Helper()
		if _, err := client.Put(ctx, events.Entry{ID: id, Cron: "@every 1s", Task: events.Task{Type: "t"}, Options: events.Options{Queue: queue}}); err != nil {
			t.Fatalf("put %s: %v", id, err)
		}
	}
	remove := func(id string) {
		t.Helper()
		if _, err := client.Remove(ctx, id); err != nil {
			t.Fatalf("remove %s: %v", id, err)
		}
	}
	exists := func(key string) bool { return rc.Exists(ctx, key).Val() == 1 }
	wm := func(id, queue string) string { return taskstate.Own(prefix, queue).Watermark(id) }
	moved := func(id, queue string) string { return taskstate.Own(prefix, queue).Handover(id) }

	put("live", "q1")
	put("gone", "q1")
	put("back", "q1")
	for _, id := range []string{"live", "gone", "back"} {
		testenv.Eventually(t, 20*time.Second, func() bool { return exists(wm(id, "q1")) }, "entry %s never fired", id)
	}
	// A queue move leaves gone's keys in two slots.
	put("gone", "q2")
	testenv.Eventually(t, 20*time.Second, func() bool { return exists(wm("gone", "q2")) }, "gone never fired in q2")
	goneKeys := []string{wm("gone", "q1"), wm("gone", "q2"), taskstate.SchedulerHistoryKey("gone")}
	for _, k := range []string{moved("gone", "q1"), moved("gone", "q2")} {
		if exists(k) {
			goneKeys = append(goneKeys, k)
		}
	}
	if len(goneKeys) < 4 {
		t.Fatalf("no handover marker after the queue move; keys of gone: %v", goneKeys)
	}

	// Taken before the removal is stored: the grace runs from the stored
	// time, so deletion can come no sooner than grace after this.
	removedAt := time.Now()
	remove("gone")
	remove("back")
	// back is registered again within the grace; its keys must stay.
	put("back", "q1")
	backAgain := time.Now()

	testenv.Eventually(t, 30*time.Second, func() bool {
		for _, k := range goneKeys {
			if exists(k) {
				return false
			}
		}
		return true
	}, "keys of the removed entry never deleted")
	if since := time.Since(removedAt); since < grace {
		t.Fatalf("keys of the removed entry deleted %s after the removal, before the grace of %s", since, grace)
	}
	for _, k := range []string{wm("live", "q1"), wm("back", "q1"), taskstate.SchedulerHistoryKey("live"), taskstate.SchedulerHistoryKey("back")} {
		if !exists(k) {
			t.Errorf("key %s of a registered entry deleted", k)
		}
	}
	body := promtest.Scrape(t, "http://"+r1.Addr+"/metrics")
	if !strings.Contains(body, "cronstream_removed_entry_keys_deleted_total") {
		t.Errorf("metric cronstream_removed_entry_keys_deleted_total not served")
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "cronstream_removed_entry_keys_deleted_total ") && strings.HasSuffix(line, " 0") {
			t.Errorf("no deleted keys counted: %s", line)
		}
	}

	// gone is registered again after its keys were deleted, in the queue
	// it moved away from: its watermark is restored from the activity
	// stream and no tick fires twice.
	put("gone", "q1")
	goneAgain := time.Now()
	testenv.Eventually(t, 20*time.Second, func() bool { return exists(wm("gone", "q1")) }, "gone never fired again")
	// A few more ticks of both, then stop and read their ledgers.
	testenv.Eventually(t, 20*time.Second, func() bool { return time.Since(goneAgain) > 4*time.Second }, "")
	if err := r1.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	for id, again := range map[string]time.Time{"back": backAgain, "gone": goneAgain} {
		handled := ticksHandled(t, js, names, id)
		for s, n := range handled {
			if n > 1 {
				t.Errorf("%s: tick %s handled %d times", id, time.Unix(s, 0).UTC().Format(time.TimeOnly), n)
			}
		}
		for s := again.Unix() + 2; s <= stopped.Unix()-2; s++ {
			if handled[s] == 0 {
				t.Errorf("%s: tick %s after the re-registration never handled", id, time.Unix(s, 0).UTC().Format(time.TimeOnly))
			}
		}
	}
}

// ticksHandled counts per unix second the scheduled fires and skips of
// entry in the activity stream.
func ticksHandled(t *testing.T, js jetstream.JetStream, names events.Names, entry string) map[int64]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, names.ActivityStream())
	if err != nil {
		t.Fatal(err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{names.FireSubject(entry)}})
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]int{}
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return out // no more messages
		}
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		ev, err := events.DecodeEvent(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case events.TypeEntryFired:
			var f events.Fired
			if err := ev.DecodeData(&f); err != nil {
				t.Fatal(err)
			}
			if f.Trigger == "" && !f.Backfill {
				out[f.ScheduledAt.Unix()]++
			}
		case events.TypeEntrySkipped:
			var sk events.Skipped
			if err := ev.DecodeData(&sk); err != nil {
				t.Fatal(err)
			}
			last := sk.ScheduledAt
			if sk.Until != nil {
				last = *sk.Until
			}
			for s := sk.ScheduledAt.Unix(); s <= last.Unix(); s++ {
				out[s]++
			}
		}
		if md.NumPending == 0 {
			return out
		}
	}
}

// TestSweepKeepsWhatItMustNot runs sweeps directly, with a clock it moves:
// nothing is deleted within the grace; after it, only the removed entry's
// keys go, while an entry never written on this config stream, a
// quarantined entry and a registered one keep theirs.
func TestSweepKeepsWhatItMustNot(t *testing.T) {
	ctx := context.Background()
	ns := testenv.StartNATS(t)
	rc := testenv.StartRedis(t).Client(t)
	js := ns.JetStream(t)
	names := events.MustNames("sweep")
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	client := events.NewClient(js, names)
	for _, id := range []string{"live", "gone", "bad"} {
		if _, err := client.Put(ctx, events.Entry{ID: id, Cron: "@every 1h", Task: events.Task{Type: "t"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Remove(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	// bad's last event cannot be applied: it is quarantined, not removed.
	if _, err := js.Publish(ctx, names.ConfigSubject("bad"), []byte("not an event")); err != nil {
		t.Fatal(err)
	}
	proj := projectiontest.CaughtUp(ctx, t, js, names)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if len(proj.Quarantined()) != 1 {
		t.Fatalf("quarantined %v, want bad", proj.Quarantined())
	}
	prefix := names.Prefix()
	keysOf := map[string]string{}
	for _, id := range []string{"live", "gone", "bad", "unknown"} {
		k := taskstate.Own(prefix, "default").Watermark(id)
		rc.Set(ctx, k, "1 t", 0)
		keysOf[id] = k
	}
	// A held tick (overlap buffer-one) of the removed entry and of a live
	// one, as the fire script writes them.
	own := taskstate.Own(prefix, "default")
	for _, id := range []string{"live", "gone"} {
		rc.HSet(ctx, own.Held(id), "tick", "1000", "task", id+"-task", "prev", "p", "msg", "m", "rec_id", "r", "rec_data", "d")
		rc.SAdd(ctx, own.HeldIndex(), own.Held(id))
	}

	now := time.Now()
	reg := prometheus.NewRegistry()
	holds := true
	sw, err := keygc.New(keygc.Config{
		Store: taskstate.New(rc), Removals: client, Projection: proj, Names: names,
		Grace: time.Hour, Now: func() time.Time { return now }, Metrics: keygc.NewMetrics(reg), Logger: quiet,
		Holds: func() bool { return holds },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res := sw.Sweep(ctx); res.Keys != 0 || res.Waiting != 1 || res.Errors != 0 {
		t.Fatalf("sweep within the grace: %+v, want nothing deleted and gone waiting", res)
	}
	now = now.Add(time.Hour + time.Second)
	// Another replica holds the global duty: this one sweeps nothing.
	holds = false
	if res := sw.Sweep(ctx); res != (keygc.Result{}) || rc.Exists(ctx, keysOf["gone"]).Val() != 1 {
		t.Fatalf("sweep without the global duty: %+v, want none", res)
	}
	holds = true
	if res := sw.Sweep(ctx); res.Keys != 2 || res.Entries != 1 || res.Errors != 0 {
		t.Fatalf("sweep after the grace: %+v, want gone's watermark and held tick deleted", res)
	}
	if rc.Exists(ctx, own.Held("gone")).Val() != 0 || rc.SIsMember(ctx, own.HeldIndex(), own.Held("gone")).Val() {
		t.Error("the removed entry's held tick was not swept from its key and the held index")
	}
	if rc.Exists(ctx, own.Held("live")).Val() != 1 || !rc.SIsMember(ctx, own.HeldIndex(), own.Held("live")).Val() {
		t.Error("the live entry's held tick was swept")
	}
	for id, k := range keysOf {
		if got, want := rc.Exists(ctx, k).Val() == 1, id != "gone"; got != want {
			t.Errorf("watermark of %s exists: %t, want %t", id, got, want)
		}
	}
	if deleted := promtest.MustValue(t, reg, "cronstream_removed_entry_keys_deleted_total"); deleted != 2 {
		t.Errorf("cronstream_removed_entry_keys_deleted_total = %v, want 2", deleted)
	}
}

// TestNewRefuses: New refuses a config without its dependencies (Start and
// Stop are walked through the lifecycle rules in internal/replica's
// TestComponentLifecycles).
func TestNewRefuses(t *testing.T) {
	if _, err := keygc.New(keygc.Config{}); err == nil || !strings.Contains(err.Error(), "required") {
		t.Fatalf("New without dependencies: %v", err)
	}
}
