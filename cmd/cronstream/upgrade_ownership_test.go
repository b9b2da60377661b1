package main

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// lastPrimaryLateRelease is the last build before shard ownership: its
// replicas fire every entry, each on time where it is the entry's primary
// and 2 s late elsewhere.
const lastPrimaryLateRelease = "36c8c6b"

// TestRollingUpgradeToOwnership: replicas of the last build before shard
// ownership (primary/late) are replaced one by one by replicas of this
// build (shard owners) while entries in two queues fire every second: the
// new replicas own every shard as soon as they run (the old ones are no
// candidates), an old replica and a new owner are killed on the way, and
// no tick fires twice or is missed, every task has its fired event.
func TestRollingUpgradeToOwnership(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: builds the last primary/late release and runs five replicas (runs without -short, as in CI)")
	}
	old := buildRelease(t, lastPrimaryLateRelease)
	e := newEnv(t, true)
	rc := e.redis.Client(t)
	replica := func(path, id string) *proc {
		t.Helper()
		p := startBin(t, path, e.vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", id)
		testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(p.Stderr(), "replica running") },
			"replica %s did not start:\n%v", id, lazyStderr{p})
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
	// The previous release writes the entries, so the streams are the
	// ones it made (without the fail-pause subjects, which it refuses).
	oldCLI := func(args ...string) {
		t.Helper()
		c := exec.Command(old, args...)
		c.Env = e.vars
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", lastPrimaryLateRelease, strings.Join(args, " "), err, out)
		}
	}
	entries := []string{"v1", "v2", "v3", "v4", "v5", "v6"}
	for i, id := range entries {
		oldCLI("entry", "put", id, "--cron", "@every 1s", "--type", "t"+id, "--queue", []string{"q1", "q2"}[i%2])
	}
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
	// holders are the replicas holding the shard leases of both queues,
	// and how many shards have none.
	holders := func() (map[string]int, int) {
		held := map[string]int{}
		free := 0
		for _, q := range []string{"q1", "q2"} {
			for _, s := range events.QueueShards(q) {
				if h := shardHolder(t, e, s); h != "" {
					held[h]++
				} else {
					free++
				}
			}
		}
		return held, free
	}
	ownedBy := func(when string, ids ...string) {
		t.Helper()
		var held map[string]int
		var free int
		testenv.Eventually(t, 30*time.Second, func() bool {
			held, free = holders()
			if free != 0 || len(held) != len(ids) {
				return false
			}
			for _, id := range ids {
				if held[id] == 0 {
					return false
				}
			}
			return true
		}, "%s: shards not owned by %v (holders %v, %d free)", when, ids, lazy(func() string { return lazyMap(held) }), free)
	}

	o1, o2 := replica(old, "o1"), replica(old, "o2")
	progress("old replicas alone", 3)
	if held, _ := holders(); len(held) != 0 {
		t.Errorf("old replicas hold shard leases: %v", held)
	}
	n1, n2 := replica(bin, "n1"), replica(bin, "n2")
	ownedBy("new replicas beside old ones", "n1", "n2")
	// Tasks whose worker died, in both queues: the old replicas' recoverers
	// try every queue, the new ones' only the queues whose duties they
	// hold; the recover script re-checks each task, so each is moved once
	// and has one event.
	for _, q := range []string{"q1", "q2"} {
		seedExpiredTask(t, rc, q, "dead-"+q, time.Now().Add(-time.Minute))
	}
	progress("old and new side by side", 4)
	o1.stop(syscall.SIGKILL, 10*time.Second)
	progress("after an old replica's kill", 3)
	n1.stop(syscall.SIGKILL, 10*time.Second)
	ownedBy("after a new owner's kill", "n2")
	progress("after a new owner's kill", 3)
	if code := o2.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("o2 exited %d", code)
	}
	// No replica of the previous release left: the upgrade's last step
	// (operations.md, Upgrades).
	e.ok("streams", "apply")
	n3 := replica(bin, "n3")
	ownedBy("the new build alone", "n2", "n3")
	progress("the new build alone", 3)
	// status shows who owns what, from Redis and the replicas' reports.
	var st struct {
		Shards shardsStatus `json:"shards"`
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		if err := json.Unmarshal([]byte(e.ok("status", "--json")), &st); err != nil {
			t.Fatal(err)
		}
		owned := 0
		for _, r := range st.Shards.ByReplica {
			if (r.Replica == "n2" || r.Replica == "n3") && r.Live && r.Owned > 0 && r.Owned == r.Desired {
				owned += r.Owned
			}
		}
		return st.Shards.Total == 2*events.ShardsPerQueue && st.Shards.UnownedCount == 0 && owned == st.Shards.Total
	}, "status to show n2 and n3 owning every shard: %s", lazy(func() string { b, _ := json.Marshal(st.Shards); return string(b) }))
	if out := e.ok("status"); !strings.Contains(out, "Shards: 128 (2 queues × 64), 0 without an owner") {
		t.Errorf("status text has no Shards section:\n%s", out)
	}
	for _, p := range []*proc{n2, n3} {
		if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
			t.Errorf("run exited %d:\n%s", code, p.Stderr())
		}
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		n := int64(0)
		for _, q := range []string{"q1", "q2"} {
			n += rc.XLen(t.Context(), taskstate.Own(events.DefaultPrefix, q).Outbox()).Val()
		}
		return n == 0
	}, "records left in the outbox\nn2:\n%v\nn3:\n%v", lazyStderr{n2}, lazyStderr{n3})

	// Each dead task recovered once, with one event.
	recovered := map[string]int{}
	for _, l := range strings.Split(e.ok("audit", "--json", "--type", "cronstream.task.*"), "\n") {
		var ev struct {
			Data events.TaskRecovered `json:"data"`
		}
		if json.Unmarshal([]byte(l), &ev) == nil && ev.Data.TaskID != "" {
			recovered[ev.Data.TaskID]++
		}
	}
	for _, q := range []string{"q1", "q2"} {
		if n := recovered["dead-"+q]; n != 1 {
			t.Errorf("task dead-%s: %d recovery events, want 1 (%v)", q, n, recovered)
		}
		if n := rc.ZCard(t.Context(), taskstate.Keys(q).Retry()).Val(); n != 1 {
			t.Errorf("queue %s: %d tasks in retry, want the dead one", q, n)
		}
	}

	all := fired()
	byTask := map[string]events.Fired{}
	ticks := map[string][]time.Time{}
	by := map[string]int{}
	for _, f := range all {
		if _, dup := byTask[f.TaskID]; dup {
			t.Errorf("task %s has two fired events", f.TaskID)
		}
		byTask[f.TaskID] = f
		ticks[f.Entry] = append(ticks[f.Entry], f.ScheduledAt)
		by[f.Replica]++
	}
	inRedis := 0
	for _, q := range []string{"q1", "q2"} {
		ids := rc.LRange(t.Context(), taskstate.Keys(q).Pending(), 0, -1).Val()
		for _, id := range ids {
			if f, ok := byTask[id]; !ok || f.Queue != q {
				t.Errorf("task %s in queue %s has no fired event in that queue", id, q)
			}
		}
		inRedis += len(ids)
	}
	if inRedis != len(byTask) {
		t.Errorf("%d tasks in Redis, %d fired events", inRedis, len(byTask))
	}
	gaps := false
	for _, id := range entries {
		ts := ticks[id]
		slices.SortFunc(ts, time.Time.Compare)
		for i := 1; i < len(ts); i++ {
			switch d := ts[i].Sub(ts[i-1]); {
			case d == 0:
				t.Errorf("%s: tick %s fired twice", id, ts[i].Format(time.TimeOnly))
			case d > time.Second:
				gaps = true
				t.Errorf("%s: no tick fired between %s and %s", id, ts[i-1].Format(time.TimeOnly), ts[i].Format(time.TimeOnly))
			}
		}
	}
	if gaps {
		for name, p := range map[string]*proc{"n1": n1, "n2": n2, "n3": n3} {
			t.Logf("%s's warnings and shard moves:\n%s", name, linesWith(p.Stderr(), `"WARN"`, "shards", "skipped"))
		}
	}
	if by["n1"]+by["n2"]+by["n3"] == 0 || by["o1"]+by["o2"] == 0 {
		t.Errorf("fires by replica %v: both builds should have fired", by)
	}
	t.Logf("fires by replica: %v", by)
}

// linesWith returns the lines of text that contain any of subs.
func linesWith(text string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		for _, sub := range subs {
			if strings.Contains(l, sub) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
