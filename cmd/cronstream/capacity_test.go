package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/forecast"
	"github.com/cronstream/cronstream/internal/testenv"
)

// scheduleFile writes a schedules file of n entries named prefix-NNNN
// with spec, alternating over two queues; startAt, when set, is each
// entry's start_at.
func scheduleFile(t *testing.T, name, prefix string, n int, spec string, startAt time.Time) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("entries:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {id: %s-%04d, cron: %q, task: {type: capacity}, options: {queue: q%d}", prefix, i, spec, i%2)
		if !startAt.IsZero() {
			fmt.Fprintf(&b, ", start_at: %q", startAt.Format(time.RFC3339))
		}
		b.WriteString("}\n")
	}
	return writeFile(t, name, b.String())
}

// capacityJSON is what the tests read of sync --json and entry put --json.
type capacityJSON struct {
	Capacity *capacityReport `json:"capacity"`
	Warnings []string        `json:"warnings"`
}

// TestCapacityWarnings runs two replicas whose link to Redis takes 50 ms
// each way, so each pass of fires takes at least 100 ms: what they show
// they can fire is a few hundred fires a second each, whatever the
// machine. Once both have shown it (status), sync -f (with --dry-run and
// without) and entry put warn, on stderr and in --json, when the schedule
// after the change has a busier second than the live replicas' capacity
// together, naming the peak, when it is and the capacity; a change that
// stays under it gets the figures and no warning, and a put that does not
// change when its entry fires is not checked.
func TestCapacityWarnings(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	px := testenv.StartProxy(t, e.redis.Addr)
	px.SetDelay(50 * time.Millisecond)
	slow := append(baseEnv(), "CRONSTREAM_NATS="+e.nats.URL(), "CRONSTREAM_REDIS=redis://"+px.Addr())
	for _, id := range []string{"cap-a", "cap-b"} {
		start(t, slow, "run", "--http", "", "--log-format", "json", "--replica-id", id)
	}
	// 100 entries fire every second: each replica fires some 50 a second
	// in one pass.
	e.ok("sync", "-f", scheduleFile(t, "base.yaml", "steady", 100, "* * * * * *", time.Time{}))

	// shownTotal waits for both replicas to show a capacity in status and
	// returns their sum. A replica's figure moves as it fires (its first
	// passes also loaded entries), so each check below compares with what
	// status shows at that time.
	shownTotal := func() float64 {
		t.Helper()
		var shown []float64
		testenv.Eventually(t, 90*time.Second, func() bool {
			r := e.run("status", "--json")
			var st struct {
				Replicas []struct {
					ID           string  `json:"id"`
					FireCapacity float64 `json:"fire_capacity"`
				} `json:"replicas"`
			}
			if json.Unmarshal([]byte(r.stdout), &st) != nil || len(st.Replicas) != 2 {
				return false
			}
			shown = shown[:0]
			for _, x := range st.Replicas {
				if x.FireCapacity <= 0 {
					return false
				}
				shown = append(shown, x.FireCapacity)
			}
			return true
		}, "both replicas to show a capacity in status (have %v)", shown)
		t.Logf("capacity shown: %.0f and %.0f fires a second", shown[0], shown[1])
		return shown[0] + shown[1]
	}
	total := shownTotal()
	if total > 2500 {
		t.Fatalf("replicas 100 ms from Redis show %.0f fires a second together: more than their passes of 50 fires could make", total)
	}
	if out := e.ok("status"); !strings.Contains(out, "FIRES/S SHOWN") {
		t.Errorf("status has no column for the capacity shown:\n%s", out)
	}

	// Under the capacity: figures, no warning.
	var under capacityJSON
	r := e.run("sync", "-f", scheduleFile(t, "small.yaml", "small", 10, "0 * * * * *", time.Time{}), "--owner", "small", "--json")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &under) != nil {
		t.Fatalf("sync of 10 entries:\n%s", r)
	}
	if c := under.Capacity; c == nil || c.PeakPerSecond != 110 || c.Exceeds || c.Replicas != 2 || c.Shown != 2 || len(under.Warnings) > 0 || strings.Contains(r.stderr, "warning") {
		t.Errorf("sync under the capacity: %+v, warnings %v, stderr %q; want a peak of 110 a second, not exceeding", c, under.Warnings, r.stderr)
	}

	// A burst of 3,000 at the top of the minute: the dry run warns.
	burst := scheduleFile(t, "burst.yaml", "burst", 3000, "0 * * * * *", time.Time{})
	var over capacityJSON
	total = shownTotal()
	r = e.run("sync", "-f", burst, "--owner", "burst", "--dry-run", "--json")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &over) != nil {
		t.Fatalf("dry run of the burst:\n%s", r)
	}
	checkWarned(t, "sync --dry-run", over, r.stderr, 3110, total, shownTotal())
	if c := over.Capacity; c != nil && (c.PeakAt.Second() != 0 || c.PeakAt.Before(time.Now().Add(-time.Minute))) {
		t.Errorf("peak at %s, want the top of a coming minute", c.PeakAt)
	}
	if out := e.run("sync", "-f", burst, "--owner", "burst", "--dry-run"); !strings.Contains(out.stderr, "warning: the schedule fires up to 3,110 ticks in one second") {
		t.Errorf("dry run without --json: no warning on stderr:\n%s", out)
	}

	// Applied: 3,000 entries every hour from an hour or two on (they do
	// not fire during the test, but the next 24 hours hold their peak,
	// with the 110 of every top of a minute).
	at := time.Now().Add(2 * time.Hour).Truncate(time.Hour)
	total = shownTotal()
	r = e.run("sync", "-f", scheduleFile(t, "hourly.yaml", "hourly", 3000, "0 0 * * * *", at), "--owner", "hourly", "--json")
	var applied capacityJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &applied) != nil {
		t.Fatalf("sync of the hourly entries:\n%s", r)
	}
	checkWarned(t, "sync", applied, r.stderr, 3110, total, shownTotal())

	// entry put of one more: the schedule after it is over the capacity.
	var put capacityJSON
	total = shownTotal()
	r = e.run("entry", "put", "one-more", "--cron", "0 0 * * * *", "--type", "capacity", "--start-at", at.Format(time.RFC3339), "--json")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &put) != nil {
		t.Fatalf("entry put:\n%s", r)
	}
	checkWarned(t, "entry put", put, r.stderr, 3111, total, shownTotal())
	if !put.Capacity.PeakAt.Equal(at) {
		t.Errorf("entry put: peak at %s, want %s", put.Capacity.PeakAt, at)
	}
	// A change that does not move a tick is not checked.
	var same capacityJSON
	r = e.run("entry", "put", "one-more", "--payload", "x", "--json")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &same) != nil {
		t.Fatalf("entry put of a payload:\n%s", r)
	}
	if same.Capacity != nil || len(same.Warnings) > 0 {
		t.Errorf("a payload change was checked: %+v %v", same.Capacity, same.Warnings)
	}
}

// checkWarned checks a warning of a peak of peak fires a second over a
// capacity of about total.
// before and after are what status showed in all just before and just
// after the command: a replica's figure may move between its heartbeats.
func checkWarned(t *testing.T, what string, got capacityJSON, stderr string, peak int64, before, after float64) {
	t.Helper()
	c := got.Capacity
	if c == nil || c.PeakPerSecond != peak || !c.Exceeds || c.Shown != 2 {
		t.Errorf("%s: capacity %+v, want a peak of %d exceeding", what, c, peak)
		return
	}
	if c.CapacityPerSecond < min(before, after)/2 || c.CapacityPerSecond > 2*max(before, after) {
		t.Errorf("%s: capacity %.0f, status showed %.0f before and %.0f after", what, c.CapacityPerSecond, before, after)
	}
	want := fmt.Sprintf("up to %s ticks in one second (%s UTC", forecast.Thousands(peak), c.PeakAt.UTC().Format("2006-01-02 15:04:05"))
	if len(got.Warnings) != 1 || !strings.Contains(got.Warnings[0], want) || !strings.Contains(got.Warnings[0], "2 live replicas") {
		t.Errorf("%s: warnings %q, want one naming %q and the replicas", what, got.Warnings, want)
	}
	if !strings.Contains(stderr, "cronstream: warning: the schedule fires "+want[:len("up to ")]) || !strings.Contains(stderr, forecast.Thousands(peak)) {
		t.Errorf("%s: stderr does not carry the warning:\n%s", what, stderr)
	}
}
