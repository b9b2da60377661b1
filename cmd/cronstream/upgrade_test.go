package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// previousRelease is the commit of the release a rolling upgrade replaces.
const previousRelease = "9d4bc7a"

// oldPut registers an entry with the CLI of an older build (bin), so the
// streams are the ones that build makes: its replicas refuse a config
// stream made by this build, which also captures the fail-pause subjects
// (operations.md, Upgrades).
func oldPut(t *testing.T, bin string, e *cliEnv, id string, args ...string) {
	t.Helper()
	c := exec.Command(bin, append([]string{"entry", "put", id}, args...)...)
	c.Env = e.vars
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("the old CLI's entry put %s: %v\n%s", id, err, out)
	}
}

// buildRelease builds cmd/cronstream of commit from this repository's own
// history, once for every test that asks for that commit, and returns the
// binary. It skips the test when the history does not hold the commit (a
// shallow clone): the build needs it.
func buildRelease(t *testing.T, commit string) string {
	t.Helper()
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not inside a git checkout (%v): the upgrade test builds release %s from the repository's history", err, commit)
	}
	root := strings.TrimSpace(string(top))
	if err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s is not in this clone's history (shallow clone?): the upgrade test builds it; fetch the full history to run it", commit)
	}
	// Built once per commit for the tests that share it, beside the binary
	// under test (TestMain removes both).
	releasesMu.Lock()
	r := releases[commit]
	if r == nil {
		r = &release{}
		releases[commit] = r
	}
	releasesMu.Unlock()
	r.once.Do(func() { r.path, r.err = buildReleaseOnce(root, commit, filepath.Dir(bin)) })
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.path
}

// release is one commit's build, made by the first test that needs it.
type release struct {
	once sync.Once
	path string
	err  error
}

var (
	releasesMu sync.Mutex
	releases   = map[string]*release{}
)

// buildReleaseOnce builds cmd/cronstream of commit from the repository at
// root into dir.
func buildReleaseOnce(root, commit, dir string) (string, error) {
	src, err := os.MkdirTemp(dir, "src-"+commit+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(src)
	out := filepath.Join(dir, "cronstream-"+commit)
	tarball := src + ".tar"
	defer os.Remove(tarball)
	steps := []*exec.Cmd{
		exec.Command("git", "-C", root, "archive", "--format=tar", "--output="+tarball, commit),
		exec.Command("tar", "-xf", tarball, "-C", src),
		// -trimpath: the source is in a new directory each run, and
		// without it the directory is part of every package's build
		// cache key, so the whole module would compile again.
		exec.Command("go", "build", "-trimpath", "-o", out, "./cmd/cronstream"),
	}
	steps[2].Dir = src
	for _, c := range steps {
		if b, err := c.CombinedOutput(); err != nil {
			return "", fmt.Errorf("building release %s: %s: %v\n%s", commit, strings.Join(c.Args, " "), err, b)
		}
	}
	return out, nil
}

// TestRollingUpgrade replaces replicas of the previous release one by one
// with replicas of this build while entries fire every second in two
// queues: an entry updated (handover markers), an entry moved to the other
// queue, an update and a removal written by the new CLI while both builds
// run, a period
// where only old replicas fire over the new build's Redis state, and a NATS
// outage during which the last old replicas die with records in the outbox,
// which the new build's relay publishes. No tick fires twice, none is
// missed, and every task in Redis has its fired event.
func TestRollingUpgrade(t *testing.T) {
	t.Parallel()
	old := buildRelease(t, previousRelease)
	e := newEnv(t, true)
	rc := e.redis.Client(t)
	ctx := context.Background()
	oldCLI := func(args ...string) {
		t.Helper()
		c := exec.Command(old, args...)
		c.Env = e.vars
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", previousRelease, strings.Join(args, " "), err, out)
		}
	}
	running := func(p *proc) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(p.Stderr(), "replica running") },
			"replica did not start:\n%v", lazyStderr{p})
	}
	startReplica := func(path, id string) *proc {
		t.Helper()
		return startBin(t, path, e.vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", id)
	}
	replica := func(path, id string) *proc {
		t.Helper()
		p := startReplica(path, id)
		running(p)
		return p
	}
	type event struct {
		Type string       `json:"type"`
		Data events.Fired `json:"data"`
	}
	fired := func() []events.Fired {
		t.Helper()
		var out []events.Fired
		for _, l := range strings.Split(e.ok("audit", "--json"), "\n") {
			var ev event
			if json.Unmarshal([]byte(l), &ev) == nil && ev.Type == events.TypeEntryFired {
				out = append(out, ev.Data)
			}
		}
		return out
	}
	entries := []string{"u1", "u2", "u3", "u4"}
	// progress waits until every entry fired n more ticks.
	progress := func(when string, n int) {
		t.Helper()
		count := func() map[string]int {
			m := map[string]int{}
			for _, f := range fired() {
				m[f.Entry]++
			}
			return m
		}
		base := count()
		var now map[string]int
		testenv.Eventually(t, 45*time.Second, func() bool {
			now = count()
			for _, id := range entries {
				if now[id] < base[id]+n {
					return false
				}
			}
			return true
		}, "%s: entries do not keep firing (fired before %s, now %s)", when, lazyMap(base), lazy(func() string { return lazyMap(now) }))
	}
	outbox := func() int64 {
		var n int64
		for _, q := range []string{"q1", "q2"} {
			n += rc.XLen(ctx, taskstate.Own(events.DefaultPrefix, q).Outbox()).Val()
		}
		return n
	}

	// The previous release alone: entries written by its CLI, one updated
	// and one moved to the other queue while its replicas fire.
	oldCLI("entry", "put", "u1", "--cron", "@every 1s", "--type", "x", "--queue", "q1")
	oldCLI("entry", "put", "u2", "--cron", "@every 1s", "--type", "y", "--queue", "q2")
	oldCLI("entry", "put", "u3", "--cron", "@every 1s", "--type", "z", "--queue", "q1")
	oldCLI("entry", "put", "u3", "--payload", "2")
	oldCLI("entry", "put", "u4", "--cron", "@every 1s", "--type", "w", "--queue", "q1")
	oldCLI("entry", "put", "u5", "--cron", "@every 1s", "--type", "v", "--queue", "q2")
	o1, o2, o3 := replica(old, "o1"), replica(old, "o2"), replica(old, "o3")
	progress("previous release", 3)
	oldCLI("entry", "put", "u4", "--queue", "q2")
	testenv.Eventually(t, 30*time.Second, func() bool {
		return slices.ContainsFunc(fired(), func(f events.Fired) bool { return f.Entry == "u4" && f.Queue == "q2" })
	}, "u4 does not fire in q2 after its move")
	// The state the new build must read: a fence, a freshness and handover
	// markers in both queues' slots, whatever their format.
	var keys []string
	for _, q := range []string{"q1", "q2"} {
		own := taskstate.Own(events.DefaultPrefix, q)
		keys = append(keys, own.Fence(), own.Freshness(), own.Handover("u4"))
	}
	keys = append(keys, taskstate.Own(events.DefaultPrefix, "q1").Handover("u3"))
	for _, k := range keys {
		if rc.Exists(ctx, k).Val() != 1 {
			t.Errorf("the previous release wrote no %s: the test does not cover reading it", k)
		}
	}

	// One replica replaced: both builds fire side by side, and the new CLI
	// writes an update and a removal.
	o1.stop(syscall.SIGKILL, 10*time.Second)
	n1 := replica(bin, "n1")
	e.ok("entry", "put", "u1", "--payload", "3")
	e.ok("entry", "rm", "u5")
	removedBy := time.Now()
	// The upgrade step (operations.md, Upgrades) while both builds run:
	// `streams apply` adds the fail-pause subjects to the config stream and
	// moves the replicas bucket the previous build kept in memory to file;
	// the replicas of both builds beat into the new bucket.
	applied := e.ok("streams", "apply")
	if !strings.Contains(applied, "CRONSTREAM_CONFIG subjects:") || !strings.Contains(applied, "KV_CRONSTREAM_REPLICAS storage: Memory → File") {
		t.Errorf("streams apply over the previous release's streams:\n%s", applied)
	}
	waitLive(t, e, 30*time.Second, []string{"n1", "o2", "o3"}, "after the bucket moved to file", n1, o2, o3)
	// Replicas of the previous release that run go on; one that starts now
	// refuses the config stream (it captures the fail-pause subjects too),
	// saying so (operations.md, Upgrades: run streams apply once they are
	// all replaced; going back needs the subject removed).
	late := startBin(t, old, e.vars, "run", "--http", "", "--replica-id", "o4")
	if code := late.stop(syscall.Signal(0), 30*time.Second); code == 0 || !strings.Contains(late.Stderr(), "cronstream.failpause.>") {
		t.Errorf("the previous release started on the config stream with the fail-pause subjects: exit %d\n%s", code, late.Stderr())
	}
	// A pause on failure while both builds run: a fail-pause request, as a
	// replica of this build publishes it, on the subject the previous
	// build's readers do not read.
	e.ok("entry", "put", "u6", "--cron", "@every 1s", "--type", "f", "--queue", "q1", "--pause-on-failure")
	var u6 struct {
		Revision uint64 `json:"revision"`
	}
	e.okJSON(&u6, "entry", "get", "u6", "--json")
	names := events.MustNames(events.DefaultPrefix)
	if _, err := events.NewClient(e.nats.JetStream(t), names, events.WithSource("n1")).FailPause(ctx, "u6", u6.Revision,
		events.FailPauseNotePrefix+"task cronstream:u6:2026-01-01T00:00:00Z archived at 2026-01-01T00:00:01Z: test"); err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	progress("o2, o3 and n1", 5)

	// The new replica stops: the old ones fire alone over the state it
	// wrote (fences, markers, freshness).
	if code := n1.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("n1 exited %d", code)
	}
	stopped := time.Now()
	progress("o2 and o3 after n1 ran", 4)
	for _, f := range fired() {
		if f.ScheduledAt.After(stopped.Add(time.Second)) && f.Replica != "o2" && f.Replica != "o3" {
			t.Errorf("tick %s of %s fired by %s while only o2 and o3 ran", f.ScheduledAt, f.Entry, f.Replica)
		}
	}
	n1 = replica(bin, "n1")
	progress("o2, o3 and n1 again", 3)

	// NATS goes down; the old replicas fire into the outbox and die before
	// their records are published; new replicas start.
	e.nats.Shutdown()
	down := time.Now()
	testenv.Eventually(t, 30*time.Second, func() bool { return outbox() >= 12 }, "the outbox does not fill while NATS is down (%s records)", lazy(func() string { return itoa(uint64(outbox())) }))
	o2.stop(syscall.SIGKILL, 10*time.Second)
	o3.stop(syscall.SIGKILL, 10*time.Second)
	// They have no projection until NATS is back, so they fire nothing.
	n2, n3 := startReplica(bin, "n2"), startReplica(bin, "n3")
	atKill := outbox()
	testenv.Eventually(t, 30*time.Second, func() bool { return outbox() >= atKill+8 }, "n1 does not fire while NATS is down")
	e.nats.Restart(t)
	running(n2)
	running(n3)
	testenv.Eventually(t, 60*time.Second, func() bool { return outbox() == 0 }, "the outbox is not published after NATS is back (%s records)", lazy(func() string { return itoa(uint64(outbox())) }))
	progress("the new build alone", 3)
	waitLive(t, e, 60*time.Second, []string{"n1", "n2", "n3"}, "after the upgrade", n1, n2, n3)
	for _, p := range []*proc{n1, n2, n3} {
		if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
			t.Errorf("run exited %d:\n%s", code, p.Stderr())
		}
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return outbox() == 0 }, "records left in the outbox")

	// Every task in Redis once, each with its fired event; each entry's
	// ticks distinct and without a gap from its first fire to its last.
	all := fired()
	byTask := map[string]events.Fired{}
	ticks := map[string][]time.Time{}
	relayedOld := false
	for _, f := range all {
		if _, dup := byTask[f.TaskID]; dup {
			t.Errorf("task %s has two fired events", f.TaskID)
		}
		byTask[f.TaskID] = f
		ticks[f.Entry] = append(ticks[f.Entry], f.ScheduledAt)
		if (f.Replica == "o2" || f.Replica == "o3") && f.ScheduledAt.After(down.Add(time.Second)) {
			relayedOld = true
		}
	}
	if !relayedOld {
		t.Errorf("no fired event of o2 or o3 from the NATS outage: the old replicas' outbox records were not published")
	}
	inRedis := 0
	for _, q := range []string{"q1", "q2"} {
		ids := rc.LRange(ctx, taskstate.Keys(q).Pending(), 0, -1).Val()
		seen := map[string]bool{}
		for _, id := range ids {
			if seen[id] {
				t.Errorf("task %s twice in queue %s", id, q)
			}
			seen[id] = true
			if f, ok := byTask[id]; !ok || f.Queue != q {
				t.Errorf("task %s in queue %s has no fired event in that queue (%+v)", id, q, f)
			}
		}
		inRedis += len(ids)
	}
	if inRedis != len(byTask) {
		t.Errorf("%d tasks in Redis, %d fired events", inRedis, len(byTask))
	}
	for _, f := range all {
		if f.Entry == "u5" && f.ScheduledAt.After(removedBy) {
			t.Errorf("u5 tick %s fired by %s after its removal", f.ScheduledAt.Format(time.TimeOnly), f.Replica)
		}
		// Replicas of the previous build do not read fail-pause requests:
		// they may fire u6 until they are gone (operations.md, Upgrades);
		// those of this build never fire it after its pause.
		if f.Entry == "u6" && f.ScheduledAt.After(pausedAt.Add(time.Second)) && strings.HasPrefix(f.Replica, "n") {
			t.Errorf("u6 tick %s fired by %s after its pause on failure", f.ScheduledAt.Format(time.TimeOnly), f.Replica)
		}
	}
	// The previous build's replicas never met the request: nothing refused,
	// quarantined or failed for it.
	for _, p := range []*proc{o2, o3} {
		for _, l := range strings.Split(p.Stderr(), "\n") {
			if strings.Contains(l, "u6") && (strings.Contains(l, "ERROR") || strings.Contains(l, "WARN")) {
				t.Errorf("previous release on u6: %s", l)
			}
		}
	}
	var st struct {
		Entries struct {
			Quarantined int `json:"quarantined"`
		} `json:"entries"`
	}
	e.okJSON(&st, "status", "--json")
	var history []historyRecord
	e.okJSON(&history, "entry", "history", "u6", "--json")
	if st.Entries.Quarantined != 0 || len(history) != 2 || !history[1].FailPause {
		t.Errorf("after the upgrade: %d quarantined, u6 history %+v", st.Entries.Quarantined, history)
	}
	for _, id := range append(entries, "u5") {
		ts := ticks[id]
		slices.SortFunc(ts, time.Time.Compare)
		for i := 1; i < len(ts); i++ {
			switch d := ts[i].Sub(ts[i-1]); {
			case d == 0:
				t.Errorf("%s: tick %s fired twice", id, ts[i].Format(time.TimeOnly))
			case d > time.Second:
				t.Errorf("%s: no tick fired between %s and %s", id, ts[i-1].Format(time.TimeOnly), ts[i].Format(time.TimeOnly))
			}
		}
		t.Logf("%s: %d ticks fired once each, none missed", id, len(ts))
	}
}

// lazyMap formats a map when a failure message is printed.
func lazyMap(m map[string]int) string {
	b, _ := json.Marshal(m)
	return string(b)
}
