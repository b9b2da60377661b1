package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// lateAfter is the stall bound the tests run replicas with.
const lateAfter = 3 * time.Second

// metricValue reads one unlabelled metric from a replica's /metrics (-1:
// unreadable).
func metricValue(base, name string) float64 {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			return f
		}
	}
	return -1
}

// readyz returns a replica's /readyz status code and body.
func readyz(base string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(base + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// lateJSON is what the tests read of status --json's late entries.
type lateJSON struct {
	Late   []lateEntry `json:"late"`
	Outbox struct {
		Backlog int64 `json:"backlog"`
	} `json:"outbox"`
}

type lateEntry struct {
	Entry  string    `json:"entry"`
	Queue  string    `json:"queue"`
	Tick   time.Time `json:"tick"`
	Reason string    `json:"reason"`
}

// statusLate runs status --json (which exits non-zero when a part, such
// as Redis, cannot be read) and returns the late entries' ids.
func (e *cliEnv) statusLate(args ...string) ([]string, lateJSON) {
	e.t.Helper()
	r := e.run(append([]string{"status", "--json", "--late-after", lateAfter.String()}, args...)...)
	var st lateJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		e.t.Fatalf("status --json: not JSON (%v):\n%s", err, r)
	}
	var ids []string
	for _, l := range st.Late {
		ids = append(ids, l.Entry)
	}
	return ids, st
}

func containsAll(have []string, want ...string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// TestStallVisible stops firing three ways — Redis refusing writes (as
// during a failover), Redis down, the replica's Redis connection stalled
// (a proxy that stops forwarding) — and checks that each is visible within
// the bound in the metrics, the log, status and /readyz, that all recover,
// and that no tick fired twice.
func TestStallVisible(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	r := testenv.StartRedis(t, testenv.WithPrivateServer(), testenv.WithAOF())
	px := testenv.StartProxy(t, r.Addr)
	env := append(baseEnv(), "CRONSTREAM_NATS="+n.URL(), "CRONSTREAM_REDIS="+r.URL)
	e := &cliEnv{t: t, nats: n, redis: r, vars: env}
	replicaEnv := append(baseEnv(), "CRONSTREAM_NATS="+n.URL(), "CRONSTREAM_REDIS=redis://"+px.Addr())
	p := start(t, replicaEnv, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", "stall-replica",
		"--late-after", lateAfter.String())
	var addr string
	testenv.Eventually(t, 30*time.Second, func() bool {
		var ok bool
		addr, ok = logValue(p.Stderr(), "serving http", "addr")
		return ok
	}, "run did not log its HTTP address")
	base := "http://" + addr
	testenv.Eventually(t, 30*time.Second, func() bool { c, _ := readyz(base); return c == http.StatusOK }, "/readyz never 200:\n%s", p.Stderr())

	e.ok("entry", "put", "s1", "--cron", "@every 1s", "--type", "stall")
	e.ok("entry", "put", "s2", "--cron", "@every 1s", "--type", "stall", "--queue", "q2")
	ins := inspector(t, r.URL)
	testenv.Eventually(t, 30*time.Second, func() bool {
		return len(pendingTasks(t, ins, "default")) >= 2 && len(pendingTasks(t, ins, "q2")) >= 2
	}, "entries did not fire")
	if v := metricValue(base, "cronstream_late_entries"); v != 0 {
		t.Fatalf("healthy: cronstream_late_entries = %v", v)
	}
	if ids, _ := e.statusLate(); len(ids) != 0 {
		t.Fatalf("healthy: status lists late entries %v", ids)
	}

	// The bound, one check and a few seconds for a loaded machine.
	visible := lateAfter + 2*time.Second + 10*time.Second
	// stalled checks every place while the stall lasts; direct says
	// whether status reaches Redis (else it shows what replicas report).
	stalled := func(what string) {
		t.Helper()
		began := time.Now()
		testenv.Eventually(t, visible, func() bool { return metricValue(base, "cronstream_late_entries") >= 2 },
			"%s: cronstream_late_entries not ≥ 2 (now %v)", what, metricValue(base, "cronstream_late_entries"))
		if v := metricValue(base, "cronstream_late_oldest_tick_age_seconds"); v < lateAfter.Seconds() {
			t.Errorf("%s: oldest late tick age %v s, want ≥ %v", what, v, lateAfter.Seconds())
		}
		testenv.Eventually(t, visible, func() bool {
			c, body := readyz(base)
			return c == http.StatusServiceUnavailable && strings.Contains(body, `"stall"`)
		}, "%s: /readyz does not fail the stall check: %s\n%s", what, lazyReady(base), p.Stderr())
		_, body := readyz(base)
		t.Logf("%s: visible after %s; /readyz: %s", what, time.Since(began).Round(100*time.Millisecond), strings.TrimSpace(body))
		testenv.Eventually(t, visible, func() bool {
			ids, _ := e.statusLate()
			return containsAll(ids, "s1", "s2")
		}, "%s: status --json does not list s1 and s2 as late", what)
		if out := e.run("status", "--late-after", lateAfter.String()).stdout; !strings.Contains(out, "\nLate (") ||
			!strings.Contains(out, "  s1 ") || !strings.Contains(out, "  s2 ") {
			t.Errorf("%s: status text has no Late section naming s1 and s2:\n%s", what, out)
		}
	}
	recovered := func(what string) {
		t.Helper()
		defer func() {
			if t.Failed() { // the replica's goroutines, to see what hangs
				_ = p.cmd.Process.Signal(syscall.SIGQUIT)
				<-p.done
				t.Logf("DUMP\n%s", p.Stderr())
			}
		}()
		testenv.Eventually(t, 30*time.Second, func() bool {
			c, _ := readyz(base)
			return c == http.StatusOK && metricValue(base, "cronstream_late_entries") == 0
		}, "%s: not ready with no late entry after the heal (late %v, readyz %s)", what, metricValue(base, "cronstream_late_entries"), lazyReady(base))
		testenv.Eventually(t, 15*time.Second, func() bool { ids, _ := e.statusLate(); return len(ids) == 0 },
			"%s: status still lists late entries after the heal", what)
	}

	// (a) Redis refuses writes.
	admin := r.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "CLIENT", "PAUSE", strconv.Itoa(int(3*visible/time.Millisecond)), "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	stalled("CLIENT PAUSE WRITE")
	testenv.Eventually(t, visible, func() bool {
		for _, l := range strings.Split(p.Stderr(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "entry is late: its tick did not fire" && m["entry"] == "s1" &&
				m["level"] == "WARN" && m["tick"] != nil && m["reason"] != nil {
				return true
			}
		}
		return false
	}, "no warning naming late entry s1, its tick and reason")
	// The reason comes from the replica's heartbeat.
	testenv.Eventually(t, visible, func() bool {
		_, st := e.statusLate()
		i := slices.IndexFunc(st.Late, func(l lateEntry) bool { return l.Entry == "s1" })
		return i >= 0 && st.Late[i].Reason != ""
	}, "status --json does not give the reason s1 is late")
	if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	recovered("CLIENT PAUSE WRITE")

	// (b) Redis down: status cannot read Redis and shows what the replica
	// reports in its heartbeat.
	r.Stop(t)
	stalled("Redis stopped")
	r.Start(t)
	recovered("Redis stopped")

	// (c) The replica's Redis connection stalls: nothing is refused, no
	// connection breaks, nothing answers.
	px.Cut(testenv.Blackhole)
	stalled("Redis connection blackholed")
	px.Heal()
	recovered("Redis connection blackholed")

	// No tick fired twice: every fired event's tick is distinct, and the
	// tasks in Redis are exactly the fired events' tasks.
	// The replica stops first (its outbox flushed at stop), so no tick
	// fires between reading the tasks and reading the events.
	if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("run exited %d", code)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { _, st := e.statusLate(); return st.Outbox.Backlog == 0 }, "outbox not drained")
	checkFiredOnce(t, e, ins, map[string]string{"s1": "default", "s2": "q2"})
}

// checkFiredOnce checks that each entry's fired events name distinct ticks
// and tasks, and that its queue holds exactly those tasks.
func checkFiredOnce(t *testing.T, e *cliEnv, ins *asynq.Inspector, queues map[string]string) {
	t.Helper()
	type event struct {
		Type string       `json:"type"`
		Data events.Fired `json:"data"`
	}
	ticks := map[string]map[int64]bool{}
	tasks := map[string]map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(e.ok("audit", "--json")), "\n") {
		var ev event
		if json.Unmarshal([]byte(l), &ev) != nil || ev.Type != events.TypeEntryFired {
			continue
		}
		f := ev.Data
		if ticks[f.Entry] == nil {
			ticks[f.Entry], tasks[f.Entry] = map[int64]bool{}, map[string]bool{}
		}
		if ticks[f.Entry][f.ScheduledAt.Unix()] || tasks[f.Entry][f.TaskID] {
			t.Errorf("%s: tick %s fired twice (task %s)", f.Entry, f.ScheduledAt, f.TaskID)
		}
		ticks[f.Entry][f.ScheduledAt.Unix()], tasks[f.Entry][f.TaskID] = true, true
	}
	for entry, q := range queues {
		var pending []string
		for _, ti := range pendingTasks(t, ins, q) {
			pending = append(pending, ti.ID)
			if !tasks[entry][ti.ID] {
				t.Errorf("%s: task %s in queue %s has no fired event", entry, ti.ID, q)
			}
		}
		if len(pending) != len(tasks[entry]) {
			t.Errorf("%s: %d tasks in queue %s, %d fired events", entry, len(pending), q, len(tasks[entry]))
		}
		t.Logf("%s: %d ticks fired once each", entry, len(pending))
	}
}

// lazyReady is a replica's /readyz body, read when a failure message is
// printed.
type lazyReady string

func (l lazyReady) String() string { _, b := readyz(string(l)); return b }

// TestClockOffset runs a replica whose local clock is an hour fast (the
// test-only offset) beside one whose clock is right: the corrected clock
// fires every tick on time, and neither replica's fires block the other's.
func TestClockOffset(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	a := start(t, append(slices.Clone(e.vars), "CRONSTREAM_TEST_CLOCK_OFFSET=1h"), "run", "--http", "", "--log-format", "json", "--replica-id", "fast")
	b := start(t, e.vars, "run", "--http", "", "--log-format", "json", "--replica-id", "right")
	testenv.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(a.Stderr(), "test only: this replica's local clock is offset") &&
			strings.Contains(b.Stderr(), "replica running") && strings.Contains(a.Stderr(), "replica running")
	}, "replicas did not start")
	var ids []string
	for i := range 8 {
		id := "clock" + strconv.Itoa(i)
		ids = append(ids, id)
		e.ok("entry", "put", id, "--cron", "@every 1s", "--type", "clock")
	}
	// fired reads the scheduled ticks each replica fired.
	fired := func() map[string][]time.Time {
		out := map[string][]time.Time{}
		for _, l := range strings.Split(e.ok("audit", "--json"), "\n") {
			var ev struct {
				Type string       `json:"type"`
				Data events.Fired `json:"data"`
			}
			if json.Unmarshal([]byte(l), &ev) == nil && ev.Type == events.TypeEntryFired {
				out[ev.Data.Replica] = append(out[ev.Data.Replica], ev.Data.ScheduledAt)
			}
		}
		return out
	}
	from := time.Now()
	testenv.Eventually(t, 30*time.Second, func() bool {
		f := fired()
		after := func(r string) bool {
			return slices.ContainsFunc(f[r], func(tick time.Time) bool { return tick.After(from.Add(3 * time.Second)) })
		}
		return after("fast") && after("right")
	}, "both replicas do not keep firing their entries (fired: %v)", lazyFired(fired))
	now := time.Now()
	for r, ticks := range fired() {
		for _, tick := range ticks {
			if tick.After(now.Add(time.Second)) {
				t.Fatalf("replica %s fired tick %s before it was due (now %s)", r, tick, now)
			}
		}
	}
	if late, _ := e.statusLate(); len(late) != 0 {
		t.Errorf("late entries with one replica's clock an hour fast: %v", late)
	}
	for _, p := range []*proc{a, b} {
		if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
			t.Errorf("run exited %d", code)
		}
	}
}

// lazyFired counts each replica's fires when a failure message is printed.
type lazyFired func() map[string][]time.Time

func (f lazyFired) String() string {
	var parts []string
	for r, ticks := range f() {
		parts = append(parts, r+": "+strconv.Itoa(len(ticks)))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}
