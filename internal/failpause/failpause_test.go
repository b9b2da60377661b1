package failpause_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/failpause"
	"github.com/cronstream/cronstream/internal/promtest"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/replicatest"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}

// startReplica runs a replica until the test ends and returns its HTTP
// address once it is ready.
func startReplica(t *testing.T, ns *testenv.NATS, rc redis.UniversalClient, names events.Names, id string) string {
	t.Helper()
	return replicatest.Start(t, replica.Config{
		NATSURL: ns.URL(), Redis: rc, Names: names, ReplicaID: id, SkipRedisChecks: true,
		RecoverInterval: 200 * time.Millisecond, RecoverGrace: 100 * time.Millisecond,
	}).Addr
}

func pausedEvents(t *testing.T, c *events.Client, id string) int {
	t.Helper()
	recs, err := c.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range recs {
		if r.Event != nil && strings.HasPrefix(r.Event.Type, events.TypeEntryPaused) {
			n++
		}
	}
	return n
}

// metric is the value text of the unlabelled sample name the replica at
// addr serves on /metrics ("" when it serves none).
func metric(t *testing.T, addr, name string) string {
	t.Helper()
	return promtest.Sample(promtest.Scrape(t, "http://"+addr+"/metrics"), name)
}

// TestPauseOnFailureWithAsynqWorker: two replicas and a real asynq worker
// whose handler fails, with max retry 0. The entry with pause_on_failure is
// paused by exactly one config event once its task is archived, its note
// naming the task and the (sanitised) error, and fires no more; an entry
// without the flag in the same queue keeps firing. After a resume (the
// handler now succeeding) it fires again, and its old archived tasks do not
// pause it again, not even for a replica that starts afterwards and reads
// the archived set from the start of its look-back.
func TestPauseOnFailureWithAsynqWorker(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	rd := testenv.StartRedis(t)
	rc := rd.Client(t)
	names := events.MustNames("pof")
	prefix := names.Prefix()
	ctx := context.Background()
	addr1 := startReplica(t, ns, rc, names, "r1")
	addr2 := startReplica(t, ns, rc, names, "r2")

	var failing atomic.Bool
	failing.Store(true)
	srv := asynq.NewServerFromRedisClient(rc, asynq.Config{
		Concurrency: 4, Queues: map[string]int{"pof": 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 50 * time.Millisecond, ShutdownTimeout: time.Second,
	})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		if failing.Load() {
			return errors.New("boom \x1b[31mred\x1b[0m\nsecond line")
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)

	client := events.NewClient(ns.JetStream(t), names)
	zero := 0
	for _, e := range []events.Entry{
		{ID: "fails", PauseOnFailure: true},
		{ID: "keeps"},
	} {
		e.Cron, e.Task, e.Options = "@every 1s", events.Task{Type: "work"}, events.Options{Queue: "pof", MaxRetry: &zero}
		if _, err := client.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	started := time.Now()

	var got events.Entry
	testenv.Eventually(t, 20*time.Second, func() bool {
		e, _, err := client.Get(ctx, "fails")
		got = e
		return err == nil && e.Paused
	}, "entry with pause_on_failure never paused")
	t.Logf("paused %s after the put", time.Since(started).Round(100*time.Millisecond))
	if !strings.HasPrefix(got.Note, "paused on failure: task "+prefix+":fails:") || !strings.Contains(got.Note, "boom [31mred [0m second line") ||
		strings.ContainsAny(got.Note, "\x1b\n") {
		t.Fatalf("pause note %q does not name the task and its sanitised error", got.Note)
	}
	task := strings.Fields(got.Note)[4]
	if s, err := rc.HGet(ctx, taskstate.Keys("pof").Task(task), "state").Result(); err != nil || s != taskstate.StateArchived {
		t.Fatalf("task %s named by the note: state %q, %v; want archived", task, s, err)
	}

	store := taskstate.New(rc)
	watermark := func(id string) time.Time {
		tick, _, _, err := store.Watermark(ctx, prefix, "pof", id)
		if err != nil {
			t.Fatal(err)
		}
		return tick
	}
	// A tick in flight at the pause may still fire; then nothing more.
	pausedAt := time.Now()
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Since(pausedAt) > 2*time.Second }, "")
	stopped, keeps := watermark("fails"), watermark("keeps")
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Since(pausedAt) > 5*time.Second }, "")
	if w := watermark("fails"); !w.Equal(stopped) {
		t.Fatalf("paused entry fired on: watermark %s, was %s", w, stopped)
	}
	if w := watermark("keeps"); !w.After(keeps) {
		t.Fatalf("entry without pause_on_failure stopped firing at %s", w)
	}
	if e, _, err := client.Get(ctx, "keeps"); err != nil || e.Paused {
		t.Fatalf("entry without pause_on_failure: paused %v, %v", e.Paused, err)
	}
	if n := pausedEvents(t, client, "fails"); n != 1 {
		t.Fatalf("%d paused events with two replicas, want 1", n)
	}
	if a, b := metric(t, addr1, "cronstream_failure_pauses_total"), metric(t, addr2, "cronstream_failure_pauses_total"); a+b != "10" && a+b != "01" {
		t.Fatalf("cronstream_failure_pauses_total: r1 %q, r2 %q; want 1 in all", a, b)
	}

	failing.Store(false)
	if _, err := client.Resume(ctx, "fails"); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	testenv.Eventually(t, 10*time.Second, func() bool { return watermark("fails").After(resumed) }, "resumed entry never fired again")
	// A replica started now reads every archived task of the look-back,
	// the one that paused the entry included.
	startReplica(t, ns, rc, names, "r3")
	testenv.Eventually(t, 20*time.Second, func() bool { return time.Since(resumed) > 3*failpause.DefaultInterval+2*time.Second }, "")
	if e, _, err := client.Get(ctx, "fails"); err != nil || e.Paused {
		t.Fatalf("resumed entry paused again by a task archived before the resume: %q, %v", e.Note, err)
	}
	if n := pausedEvents(t, client, "fails"); n != 1 {
		t.Fatalf("%d paused events after the resume, want 1", n)
	}
}

// TestPauseOnRecovererArchive: a task of the entry whose worker died with
// no retries left is archived by the replica's recoverer (lease expired),
// and that pauses the entry too, the note naming the task and asynq's
// lease-expired error.
func TestPauseOnRecovererArchive(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	rd := testenv.StartRedis(t)
	rc := rd.Client(t)
	names := events.MustNames("rpof")
	ctx := context.Background()
	startReplica(t, ns, rc, names, "r1")
	client := events.NewClient(ns.JetStream(t), names)
	zero := 0
	// Fires once a year: the task below is the only one.
	if _, err := client.Put(ctx, events.Entry{ID: "dies", Cron: "0 0 1 1 *", Task: events.Task{Type: "work"},
		Options: events.Options{Queue: "rq", MaxRetry: &zero}, PauseOnFailure: true}); err != nil {
		t.Fatal(err)
	}
	// The task a dead worker left active, as asynq's Dequeue leaves it.
	tick := time.Now().Add(-time.Minute).Truncate(time.Second)
	id := schedule.TaskID(names.Prefix(), "dies", tick)
	b, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "work", ID: id, Queue: "rq", Retry: 0, Timeout: 1800})
	if err != nil {
		t.Fatal(err)
	}
	k := taskstate.Keys("rq")
	pipe := rc.TxPipeline()
	pipe.SAdd(ctx, taskstate.AllQueuesKey, "rq")
	pipe.HSet(ctx, k.Task(id), "msg", b, "state", taskstate.StateActive)
	pipe.LPush(ctx, k.Active(), id)
	pipe.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(time.Now().Add(-time.Minute).Unix()), Member: id})
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	var got events.Entry
	testenv.Eventually(t, 20*time.Second, func() bool {
		e, _, err := client.Get(ctx, "dies")
		got = e
		return err == nil && e.Paused
	}, "entry never paused after the recoverer archived its task")
	if want := "task " + id + " archived at "; !strings.Contains(got.Note, want) || !strings.Contains(got.Note, "lease expired") {
		t.Fatalf("pause note %q: want it to name %q and the lease-expired error", got.Note, id)
	}
}

func TestNote(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct{ in, want string }{
		{"boom", "boom"},
		{"", "(no error message)"},
		{"a\x1b[2Jb\r\n\tc\u202ed\u0000", "a [2Jb c d"},
		{"bad \xff utf8", "bad utf8"},
		{strings.Repeat("é", 400), strings.Repeat("é", failpause.MaxErrorLen/2) + "…"},
	} {
		want := "paused on failure: task p:e:2026-12-01T09:00:00Z archived at 2026-12-01T10:00:00Z: " + c.want
		if got := failpause.Note("p:e:2026-12-01T09:00:00Z", at, c.in); got != want {
			t.Errorf("Note(%q) = %q, want %q", c.in, got, want)
		}
	}
	// A task id is anyone's to write into the archived set.
	if got := failpause.Note("p:e:x\x1b[2J\xff", at, "e"); got != "paused on failure: task p:e:x [2J archived at 2026-12-01T10:00:00Z: e" {
		t.Errorf("Note with a hostile task id = %q", got)
	}
}

// logLines collects log records' messages.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	l.lines = append(l.lines, msg)
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }
func (l *logLines) tail() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines[max(0, len(l.lines)-3):]
}

func (l *logLines) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			n++
		}
	}
	return n
}

// TestPauseRetriedWhileNATSDown: a pause decided while NATS is down is
// logged, counted and kept; once NATS is back a later scan publishes it, or
// finds that the failed attempt landed after all (the NATS client sends
// what it buffered when it reconnects), and counts and logs it once.
func TestPauseRetriedWhileNATSDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	rc := testenv.StartRedis(t).Client(t)
	names := events.MustNames("down")
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	client := events.NewClient(js, names, events.WithRetryBudget(500*time.Millisecond))
	zero := 0
	res, err := client.Put(ctx, events.Entry{ID: "e", Cron: "0 0 1 1 *", Task: events.Task{Type: "work"},
		Options: events.Options{Queue: "dq", MaxRetry: &zero}, PauseOnFailure: true})
	if err != nil {
		t.Fatal(err)
	}
	put := time.Now()
	proj := startProjector(t, js, names)
	if err := proj.WaitFor(ctx, res.Revision); err != nil {
		t.Fatal(err)
	}
	// Archived in a later second than the put that armed the entry, as an
	// asynq worker archives: message with the error, state, score now.
	testenv.Eventually(t, 5*time.Second, func() bool { return time.Since(put) > 1100*time.Millisecond }, "")
	id := schedule.TaskID(names.Prefix(), "e", put.Truncate(time.Second))
	b, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "work", ID: id, Queue: "dq", ErrorMsg: "disk full", LastFailedAt: time.Now().Unix()})
	if err != nil {
		t.Fatal(err)
	}
	k := taskstate.Keys("dq")
	if err := rc.HSet(ctx, k.Task(id), "msg", b, "state", taskstate.StateArchived).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.ZAdd(ctx, k.Archived(), redis.Z{Score: float64(time.Now().Unix()), Member: id}).Err(); err != nil {
		t.Fatal(err)
	}

	logs := &logLines{}
	metrics := failpause.NewMetrics(nil)
	w := newWatcher(t, failpause.Config{Store: taskstate.New(rc), Projection: proj, Entries: client, Names: names,
		Logger: slog.New(logs), Metrics: metrics})
	ns.Shutdown()
	scanCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if got := w.Scan(scanCtx); len(got) != 0 {
		t.Fatalf("paused %v with NATS down", got)
	}
	if value(t, metrics.Errors) < 1 || value(t, metrics.Pending) != 1 || logs.count("cannot publish the pause") < 1 {
		t.Fatalf("failed pause: errors %v, pending %v, log lines %d", value(t, metrics.Errors), value(t, metrics.Pending), logs.count("cannot publish the pause"))
	}
	ns.Restart(t)
	testenv.Eventually(t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return len(w.Scan(ctx)) == 1
	}, "pause never published after NATS came back: %q", logs.tail())
	e, _, err := client.Get(ctx, "e")
	if err != nil || !e.Paused || !strings.Contains(e.Note, id) || !strings.HasSuffix(e.Note, ": disk full") {
		t.Fatalf("after NATS came back: paused %v note %q, %v", e.Paused, e.Note, err)
	}
	if value(t, metrics.Paused) != 1 || value(t, metrics.Pending) != 0 || logs.count("entry paused on failure") != 1 {
		t.Fatalf("paused %v, pending %v, log lines %d", value(t, metrics.Paused), value(t, metrics.Pending), logs.count("entry paused on failure"))
	}
	// Later scans find nothing more to do.
	if got := w.Scan(ctx); len(got) != 0 {
		t.Fatalf("second pause of %v", got)
	}
}

// value reads a counter's or gauge's value.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if c := d.GetCounter(); c != nil {
		return c.GetValue()
	}
	return d.GetGauge().GetValue()
}

// TestScanPagesThroughArchive: with pages of 3, a scan reads an archived
// set of many members sharing scores (tasks of asynq clients and of two
// entries, the first at exactly the look-back's start), pauses both
// entries, and the next scan reads nothing again.
func TestScanPagesThroughArchive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	rc := testenv.StartRedis(t).Client(t)
	names := events.MustNames("pages")
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	client := events.NewClient(js, names)
	var last uint64
	for _, id := range []string{"a", "b"} {
		res, err := client.Put(ctx, events.Entry{ID: id, Cron: "0 0 1 1 *", Task: events.Task{Type: "work"},
			Options: events.Options{Queue: "big"}, PauseOnFailure: true})
		if err != nil {
			t.Fatal(err)
		}
		last = res.Revision
	}
	put := time.Now()
	proj := startProjector(t, js, names)
	if err := proj.WaitFor(ctx, last); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return time.Since(put) > 1100*time.Millisecond }, "")
	s0 := time.Now().Truncate(time.Second)
	k := taskstate.Keys("big")
	archive := func(id string, at time.Time, errMsg string) {
		t.Helper()
		b, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "work", ID: id, Queue: "big", ErrorMsg: errMsg})
		if err != nil {
			t.Fatal(err)
		}
		if err := rc.HSet(ctx, k.Task(id), "msg", b, "state", taskstate.StateArchived).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rc.ZAdd(ctx, k.Archived(), redis.Z{Score: float64(at.Unix()), Member: id}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 7 {
		archive("0000-foreign-"+strconv.Itoa(i), s0, "not ours")
	}
	taskA := schedule.TaskID(names.Prefix(), "a", s0.Add(-time.Minute))
	archive(taskA, s0, "a failed")
	for i := range 5 {
		archive("zzzz-foreign-"+strconv.Itoa(i), s0.Add(time.Second), "not ours")
	}
	taskB := schedule.TaskID(names.Prefix(), "b", s0.Add(-time.Minute))
	archive(taskB, s0.Add(2*time.Second), "b failed")

	const lookback = time.Hour
	w := newWatcher(t, failpause.Config{Store: taskstate.New(rc), Projection: proj, Entries: client, Names: names,
		Lookback: lookback, Page: 3, Now: func() time.Time { return s0.Add(lookback) },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	got := w.Scan(ctx)
	slices.Sort(got)
	if !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("first scan paused %v, want [a b]", got)
	}
	for id, task := range map[string]string{"a": taskA, "b": taskB} {
		e, _, err := client.Get(ctx, id)
		if err != nil || !e.Paused || !strings.Contains(e.Note, task) || !strings.HasSuffix(e.Note, ": "+id+" failed") {
			t.Fatalf("entry %s: paused %v note %q, %v", id, e.Paused, e.Note, err)
		}
	}
	if got := w.Scan(ctx); len(got) != 0 {
		t.Fatalf("second scan paused %v", got)
	}
}

func startProjector(t *testing.T, js jetstream.JetStream, names events.Names) *projector.Projector {
	t.Helper()
	proj, err := projector.New(projector.Config{JS: js, Names: names, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Heartbeat: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := proj.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proj.Stop(context.Background()) })
	return proj
}

func newWatcher(t *testing.T, cfg failpause.Config) *failpause.Watcher {
	t.Helper()
	w, err := failpause.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestPauseOnFailureAfterQueueMove: a task of the entry fails in its queue
// and waits for its retry there; the entry moves to another queue before
// the retry. The retry fails too and archives the task in the old queue,
// after the move: the replica still scans the old queue for the entry and
// pauses it. A replica that starts after the move learns the old queue
// from the entry's history.
func TestPauseOnFailureAfterQueueMove(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	rd := testenv.StartRedis(t)
	rc := rd.Client(t)
	names := events.MustNames("mv")
	ctx := context.Background()
	startReplica(t, ns, rc, names, "r1")

	srv := asynq.NewServerFromRedisClient(rc, asynq.Config{
		Concurrency: 4, Queues: map[string]int{"old": 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 50 * time.Millisecond, ShutdownTimeout: time.Second,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 6 * time.Second },
	})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return errors.New("still broken") })); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)

	client := events.NewClient(ns.JetStream(t), names)
	one := 1
	e := events.Entry{ID: "mover", Cron: "@every 1s", Task: events.Task{Type: "work"}, PauseOnFailure: true,
		Options: events.Options{Queue: "old", MaxRetry: &one}}
	if _, err := client.Put(ctx, e); err != nil {
		t.Fatal(err)
	}
	k := taskstate.Keys("old")
	testenv.Eventually(t, 20*time.Second, func() bool {
		n, err := rc.ZCard(ctx, k.Retry()).Result()
		return err == nil && n > 0
	}, "a task of the entry to wait for its retry in the old queue")
	e.Options.Queue = "new" // no worker there: its tasks wait
	if _, err := client.Put(ctx, e); err != nil {
		t.Fatal(err)
	}
	movedAt := time.Now()
	if n, err := rc.ZCard(ctx, k.Archived()).Result(); err != nil || n != 0 {
		t.Fatalf("%d tasks archived in the old queue before the move (%v): the test needs the archive after it", n, err)
	}

	var got events.Entry
	testenv.Eventually(t, 30*time.Second, func() bool {
		en, _, err := client.Get(ctx, "mover")
		got = en
		return err == nil && en.Paused
	}, "the entry never paused for a task archived in its old queue after the move")
	if !strings.Contains(got.Note, "still broken") {
		t.Fatalf("pause note %q", got.Note)
	}
	task := strings.Fields(got.Note)[4]
	if at, err := rc.ZScore(ctx, k.Archived(), task).Result(); err != nil || int64(at) < movedAt.Unix() {
		t.Fatalf("task %s archived at %v in the old queue (%v), want after the move at %s", task, at, err, movedAt)
	}

	// A watcher started after the move learns the old queue from the
	// entry's history.
	if _, err := client.Resume(ctx, "mover"); err != nil {
		t.Fatal(err)
	}
	logs := &logLines{}
	proj := startProjector(t, ns.JetStream(t), names)
	w := newWatcher(t, failpause.Config{Store: taskstate.New(rc), Projection: proj, Entries: client, Names: names, Logger: slog.New(logs)})
	testenv.Eventually(t, 10*time.Second, func() bool {
		w.Scan(ctx)
		return logs.count("its old queue is still scanned") > 0
	}, "a watcher started after the move did not learn the old queue: %q", logs.tail())
}

// TestOnlyTheQueueOwnerScans: with two replicas, each queue holding
// entries with pause_on_failure is scanned by exactly one of them (its
// owner: the holder of its shard 0), and a pause still happens.
func TestOnlyTheQueueOwnerScans(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	rc := testenv.StartRedis(t).Client(t)
	names := events.MustNames("prim")
	ctx := context.Background()
	addr1 := startReplica(t, ns, rc, names, "r1")
	addr2 := startReplica(t, ns, rc, names, "r2")
	client := events.NewClient(ns.JetStream(t), names)
	queues := []string{"qa", "qb", "qc"}
	for _, q := range queues {
		if _, err := client.Put(ctx, events.Entry{ID: "far-" + q, Cron: "0 0 1 1 *", Task: events.Task{Type: "work"},
			Options: events.Options{Queue: q}, PauseOnFailure: true}); err != nil {
			t.Fatal(err)
		}
	}
	scanned := func() (int, int) {
		a, _ := strconv.Atoi(metric(t, addr1, "cronstream_failure_pause_queues"))
		b, _ := strconv.Atoi(metric(t, addr2, "cronstream_failure_pause_queues"))
		return a, b
	}
	// A queue's scan follows its shard 0, which moves once as the second
	// replica joins: steadiness is checked once each owns its share.
	settled := func(addr string) bool {
		owned := metric(t, addr, "cronstream_shards_owned")
		return owned != "" && owned != "0" && owned == metric(t, addr, "cronstream_shards_desired")
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		a, b := scanned()
		return settled(addr1) && settled(addr2) && a+b == len(queues)
	}, "each replica to own its share and each queue scanned once")
	for range 5 {
		deadline := time.Now().Add(failpause.DefaultInterval)
		testenv.Eventually(t, 10*time.Second, func() bool { return time.Now().After(deadline) }, "")
		if a, b := scanned(); a+b != len(queues) {
			t.Fatalf("replicas scan %d and %d queues, want %d in all", a, b, len(queues))
		}
	}
	t.Logf("r1 scans %d queues, r2 %d", func() int { a, _ := scanned(); return a }(), func() int { _, b := scanned(); return b }())

	// A task of an entry archived in one of the queues pauses it.
	id := schedule.TaskID(names.Prefix(), "far-qb", time.Now().Add(-time.Minute).Truncate(time.Second))
	b, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "work", ID: id, Queue: "qb", ErrorMsg: "nope", LastFailedAt: time.Now().Unix()})
	if err != nil {
		t.Fatal(err)
	}
	k := taskstate.Keys("qb")
	if err := rc.HSet(ctx, k.Task(id), "msg", b, "state", taskstate.StateArchived).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.ZAdd(ctx, k.Archived(), redis.Z{Score: float64(time.Now().Add(2 * time.Second).Unix()), Member: id}).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		e, _, err := client.Get(ctx, "far-qb")
		return err == nil && e.Paused
	}, "far-qb never paused")
	if n := pausedEvents(t, client, "far-qb"); n != 1 {
		t.Fatalf("%d paused events, want 1", n)
	}
}
