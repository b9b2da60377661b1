package failpause_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/failpause"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestArmedIndexFollowsChanges: the watcher's index of armed entries
// follows the projection's changes (a put that arms, a pause, a resume, a
// put that disarms, a removal, a queue move), and a scan reads the
// archived sets only of the queues that hold armed entries and whose
// duties its replica holds.
func TestArmedIndexFollowsChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	rc := testenv.StartRedis(t).Client(t)
	names := events.MustNames("index")
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	client := events.NewClient(js, names)
	put := func(id, queue string, arm bool) uint64 {
		t.Helper()
		res, err := client.Put(ctx, events.Entry{ID: id, Cron: "0 0 1 1 *", Task: events.Task{Type: "work"},
			Options: events.Options{Queue: queue}, PauseOnFailure: arm})
		if err != nil {
			t.Fatal(err)
		}
		return res.Revision
	}
	for i, q := range []string{"a", "a", "b", "c"} {
		put(string(rune('p'+i)), q, q != "c")
	}
	last := put("plain", "c", false)
	proj := startProjector(t, js, names)
	metrics := failpause.NewMetrics(nil)
	holds := map[string]bool{"a": true, "b": false, "c": true}
	w := newWatcher(t, failpause.Config{Store: taskstate.New(rc), Projection: proj, Entries: client, Names: names,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: metrics, Holds: func(q string) bool { return holds[q] }})
	t.Cleanup(func() { _ = w.Stop(ctx) })
	scan := func(rev uint64, armed, queues float64, why string) {
		t.Helper()
		if err := proj.WaitFor(ctx, rev); err != nil {
			t.Fatal(err)
		}
		w.Scan(ctx)
		if a, q := value(t, metrics.Armed), value(t, metrics.Queues); a != armed || q != queues {
			t.Errorf("%s: %v armed entries in %v queues scanned, want %v in %v", why, a, q, armed, queues)
		}
	}
	// p and q armed in a (held), r in b (another replica's).
	scan(last, 3, 1, "at start")
	holds["b"] = true
	scan(last, 3, 2, "b's duties taken")
	res, err := client.Pause(ctx, "p", "by hand")
	if err != nil {
		t.Fatal(err)
	}
	scan(res.Revision, 2, 2, "p paused")
	if res, err = client.Resume(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	scan(res.Revision, 3, 2, "p resumed")
	scan(put("q", "a", false), 2, 2, "q disarmed")
	if res, err = client.Remove(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	scan(res.Revision, 1, 1, "r removed")
	scan(put("plain", "c", true), 2, 2, "plain armed in c")
	// p moves to b: its old queue a is still scanned for it (MovedScan).
	scan(put("p", "b", true), 2, 3, "p moved from a to b")
}
