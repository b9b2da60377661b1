package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestMaxFiresCLI: --max-fires is validated, a replica fires exactly that
// many ticks (a trigger does not count), and describe, ls, ls -o wide,
// status and audit show the limit, what is left of it and the completed
// state.
func TestMaxFiresCLI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	for _, bad := range []string{"0", "-3", "x"} {
		out := e.fail("entry", "put", "bad", "--cron", "@every 1s", "--type", "b", "--max-fires", bad)
		if !strings.Contains(out, "--max-fires") || !strings.Contains(out, "at least 1") {
			t.Errorf("--max-fires %s: %q", bad, out)
		}
	}
	e.ok("entry", "put", "lim", "--cron", "@every 1s", "--type", "l", "--max-fires", "3")
	p, base := startMetricsReplica(t, e, "m1")
	type view struct {
		Entry struct {
			State     string `json:"state"`
			MaxFires  int    `json:"max_fires"`
			Remaining *int   `json:"max_fires_remaining"`
		} `json:"entry"`
	}
	var v view
	testenv.Eventually(t, 30*time.Second, func() bool {
		e.okJSON(&v, "entry", "describe", "lim", "--json")
		return v.Entry.State == "completed"
	}, "lim to complete (last state %q):\n%s", v.Entry.State, p.Stderr())
	e.ok("entry", "trigger", "lim")
	ins := inspector(t, e.redis.URL)
	waitUntil := time.Now().Add(2 * time.Second)
	testenv.Eventually(t, 5*time.Second, func() bool { return time.Now().After(waitUntil) }, "time to pass")
	if n := len(pendingTasks(t, ins, "default")); n != 4 {
		t.Errorf("%d tasks pending, want the 3 fires and the trigger", n)
	}
	if v.Entry.MaxFires != 3 || v.Entry.Remaining == nil || *v.Entry.Remaining != 0 {
		t.Errorf("describe: %+v", v.Entry)
	}
	if d := e.ok("entry", "describe", "lim"); !strings.Contains(d, "max_fires remaining:") || !strings.Contains(d, "completed its 3 fires") {
		t.Errorf("describe:\n%s", d)
	}
	if wide := e.ok("entry", "ls", "-o", "wide"); !strings.Contains(wide, "FIRES LEFT") || !strings.Contains(wide, "0/3") || !strings.Contains(wide, "completed") {
		t.Errorf("ls -o wide:\n%s", wide)
	}
	if ids := e.ok("entry", "ls", "--state", "completed"); !strings.Contains(ids, "lim") {
		t.Errorf("ls --state completed:\n%s", ids)
	}
	if st := e.ok("status"); !strings.Contains(st, "1 completed") || !strings.Contains(st, "completed lim: fired its max_fires") {
		t.Errorf("status:\n%s", st)
	}
	var st struct {
		Entries struct {
			Completed []string `json:"completed_entries"`
		} `json:"entries"`
		NextFires []struct {
			Entry string `json:"entry"`
		} `json:"next_fires"`
	}
	e.okJSON(&st, "status", "--json")
	if len(st.Entries.Completed) != 1 || st.Entries.Completed[0] != "lim" {
		t.Errorf("status --json completed_entries: %v", st.Entries.Completed)
	}
	for _, f := range st.NextFires {
		if f.Entry == "lim" {
			t.Error("status lists a next fire of the completed entry")
		}
	}
	if n := metricValue(base, "cronstream_max_fires_reached_total"); n < 1 {
		t.Errorf("cronstream_max_fires_reached_total = %v, want at least 1", n)
	}
	if aud := e.ok("audit", "--json"); !strings.Contains(aud, `"max_fires":3`) {
		t.Errorf("audit lacks max_fires:\n%s", aud)
	}
	// A new limit counts afresh.
	e.ok("entry", "put", "lim", "--max-fires", "4")
	testenv.Eventually(t, 30*time.Second, func() bool {
		e.okJSON(&v, "entry", "describe", "lim", "--json")
		return v.Entry.Remaining != nil && *v.Entry.Remaining < 4
	}, "lim to fire under its new limit:\n%s", p.Stderr())
	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d", code)
	}
}

// TestMaxFiresForecast: describe's next fires and the forecast stop after
// the fires a limited entry has left, read from its counter in Redis.
func TestMaxFiresForecast(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "lim", "--cron", "@every 1h", "--type", "l", "--max-fires", "3")
	e.ok("entry", "put", "free", "--cron", "@every 1h", "--type", "f")
	var d struct {
		Entry struct {
			Revision  uint64 `json:"revision"`
			Remaining *int   `json:"max_fires_remaining"`
		} `json:"entry"`
		NextFires []time.Time `json:"next_fires"`
	}
	e.okJSON(&d, "entry", "describe", "lim", "--json", "--next", "10")
	if len(d.NextFires) != 3 {
		t.Errorf("describe lists %d next fires, want the 3 left", len(d.NextFires))
	}
	// Two of the three fired (the counter counts from the revision that
	// set the limit).
	store := taskstate.New(e.redis.Client(t))
	if _, err := store.SeedFireCount(context.Background(), events.DefaultPrefix, "default", "lim", taskstate.FireCount{Since: d.Entry.Revision, Count: 2}); err != nil {
		t.Fatal(err)
	}
	e.okJSON(&d, "entry", "describe", "lim", "--json", "--next", "10")
	if d.Entry.Remaining == nil || *d.Entry.Remaining != 1 || len(d.NextFires) != 1 {
		t.Errorf("describe: remaining %v, %d next fires; want 1 and 1", d.Entry.Remaining, len(d.NextFires))
	}
	if out := e.ok("entry", "describe", "lim", "--next", "10"); !strings.Contains(out, "then none: the last of its max_fires 3") {
		t.Errorf("describe:\n%s", out)
	}
	var f struct {
		Groups []struct {
			Name  string `json:"name"`
			Total int64  `json:"total"`
		} `json:"groups"`
	}
	e.okJSON(&f, "forecast", "--window", "24h", "--by", "entry", "--json")
	got := map[string]int64{}
	for _, g := range f.Groups {
		got[g.Name] = g.Total
	}
	if got["lim"] != 1 || got["free"] != 24 {
		t.Errorf("forecast by entry: %v, want lim 1 and free 24", got)
	}

	// A count a replica could not rebuild after Redis lost data: completed,
	// and describe and status say why and what undoes it.
	if _, err := store.SeedFireCount(context.Background(), events.DefaultPrefix, "default", "lim", taskstate.FireCount{Since: d.Entry.Revision, Count: taskstate.FireCountUnknown}); err != nil {
		t.Fatal(err)
	}
	if out := e.ok("entry", "describe", "lim"); !strings.Contains(out, "count unknown after Redis lost data") || !strings.Contains(out, "max_fires count is unknown") {
		t.Errorf("describe of an unknown count:\n%s", out)
	}
	if out := e.ok("status"); !strings.Contains(out, "1 completed") || !strings.Contains(out, "completed lim: its max_fires count is unknown") {
		t.Errorf("status of an unknown count:\n%s", out)
	}
}
