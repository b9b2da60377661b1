package main

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestWindowAndExclusionThroughRun: three `cronstream run` replicas, the
// owner of the entry's shard killed with SIGKILL mid-window, fire an entry every second with an
// active window a few seconds ahead and an exclusion of every third
// second. From Redis's tasks and the activity stream: no tick before the
// start or after the end, none excluded, each other tick in the window
// exactly once, each excluded one recorded once as skipped with reason
// excluded; afterwards the entry shows as ended.
func TestWindowAndExclusionThroughRun(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: a 25 s run of three replicas (runs without -short, as in CI)")
	}
	e := newEnv(t, true)
	ids := []string{"w1", "w2", "w3"}
	ps := map[string]*proc{}
	for _, id := range ids {
		ps[id], _ = startMetricsReplica(t, e, id)
	}
	// The window starts a few seconds ahead and ends on a second that is
	// not excluded (so the last tick is a fire).
	winStart := time.Now().Truncate(time.Second).Add(4 * time.Second)
	winEnd := winStart.Add(12 * time.Second)
	if winEnd.Unix()%3 == 0 {
		winEnd = winEnd.Add(time.Second)
	}
	e.ok("entry", "put", "win", "--cron", "@every 1s", "--type", "w",
		"--start-at", winStart.Format(time.RFC3339), "--end-at", winEnd.Format(time.RFC3339), "--exclude", "*/3 * * * * *")

	waitFor := func(at time.Time) {
		testenv.Eventually(t, time.Until(at)+time.Minute, func() bool { return !time.Now().Before(at) }, "clock to pass %s", at)
	}
	waitFor(winStart.Add(5 * time.Second))
	// The replica killed is the one firing the entry: the holder of its
	// shard's lease.
	killed := shardHolder(t, e, events.ShardOfEntry("default", "win"))
	if ps[killed] == nil {
		t.Fatalf("the entry's shard is held by %q, not one of the replicas %v", killed, ids)
	}
	ps[killed].stop(syscall.SIGKILL, 10*time.Second)
	waitFor(winEnd.Add(3 * time.Second))
	for id, p := range ps {
		if id == killed {
			continue
		}
		if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
			t.Errorf("replica %s exited %d:\n%s", id, code, p.Stderr())
		}
	}

	want := map[int64]bool{} // fired ticks
	excl := map[int64]bool{} // excluded ticks
	for s := winStart.Unix(); s <= winEnd.Unix(); s++ {
		if s%3 == 0 {
			excl[s] = true
		} else {
			want[s] = true
		}
	}
	// Redis: one task for each tick that fires, none other.
	tasks := map[int64]int{}
	for _, ti := range pendingTasks(t, inspector(t, e.redis.URL), "default") {
		f, ok := events.ParseTaskID(ti.ID)
		if !ok || f.Entry != "win" || f.Tick.IsZero() {
			t.Errorf("unexpected task %s", ti.ID)
			continue
		}
		tasks[f.Tick.Unix()]++
	}
	for s, n := range tasks {
		if !want[s] {
			t.Errorf("task for tick %s: outside the window or excluded", time.Unix(s, 0).UTC().Format(time.TimeOnly))
		} else if n != 1 {
			t.Errorf("%d tasks for tick %s", n, time.Unix(s, 0).UTC().Format(time.TimeOnly))
		}
	}
	for s := range want {
		if tasks[s] == 0 {
			t.Errorf("no task for in-window tick %s", time.Unix(s, 0).UTC().Format(time.TimeOnly))
		}
	}

	// The activity stream: each fire once, each excluded tick skipped once.
	fired, skipped := map[int64]int{}, map[int64]int{}
	for _, l := range strings.Split(e.ok("audit", "--json", "--type", "fired,skipped", "--entry", "win"), "\n") {
		var ev struct {
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
		}
		if json.Unmarshal([]byte(l), &ev) != nil {
			continue
		}
		switch ev.Type {
		case events.TypeEntryFired:
			var f events.Fired
			if json.Unmarshal(ev.Data, &f) == nil && f.Entry == "win" {
				fired[f.ScheduledAt.Unix()]++
			}
		case events.TypeEntrySkipped:
			var sk events.Skipped
			if json.Unmarshal(ev.Data, &sk) != nil || sk.Entry != "win" {
				continue
			}
			if sk.Reason != events.SkipExcluded || sk.Until != nil {
				t.Errorf("skipped %+v: want one tick excluded", sk)
				continue
			}
			skipped[sk.ScheduledAt.Unix()]++
		}
	}
	for s := winStart.Unix() - 5; s <= winEnd.Unix()+3; s++ {
		at := time.Unix(s, 0).UTC().Format(time.TimeOnly)
		switch {
		case want[s] && fired[s] != 1:
			t.Errorf("tick %s fired %d times, want once", at, fired[s])
		case !want[s] && fired[s] != 0:
			t.Errorf("tick %s fired %d times outside the window or excluded", at, fired[s])
		}
		switch {
		case excl[s] && skipped[s] != 1:
			t.Errorf("excluded tick %s recorded skipped %d times, want once", at, skipped[s])
		case !excl[s] && skipped[s] != 0:
			t.Errorf("tick %s recorded skipped", at)
		}
	}

	var d struct {
		Entry struct {
			State string `json:"state"`
		} `json:"entry"`
	}
	e.okJSON(&d, "entry", "describe", "win", "--json")
	if d.Entry.State != "ended" {
		t.Errorf("win is %q after its end, want ended", d.Entry.State)
	}
	if ls := e.ok("entry", "ls", "--state", "ended"); !strings.Contains(ls, "win") {
		t.Errorf("entry ls --state ended:\n%s", ls)
	}
}

// shardHolder returns the replica that holds shard's lease now ("" when
// none).
func shardHolder(t *testing.T, e *cliEnv, shard events.Shard) string {
	t.Helper()
	opts, err := redis.ParseURL(e.redis.URL)
	if err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(opts)
	defer rc.Close()
	v, err := taskstate.New(rc).ShardLeases(context.Background(), events.DefaultPrefix, []string{shard.Queue}, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range v.Leases {
		if l.Shard == shard {
			return l.Holder
		}
	}
	return ""
}
