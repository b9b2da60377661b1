package forecast

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/schedule"
)

// bruteForce lists every tick of every entry (jitter included) and counts
// them per minute: the reference the arithmetic must match.
func bruteForce(t *testing.T, entries []contract.Entry, from time.Time, minutes int) []int64 {
	t.Helper()
	counts := make([]int64, minutes)
	end := from.Add(time.Duration(minutes) * time.Minute)
	for _, e := range entries {
		if e.Paused || e.Removed {
			continue
		}
		s, err := schedule.NewSchedule(e)
		if err != nil {
			t.Fatal(err)
		}
		for tick := s.Next(from.Add(-e.Jitter.D() - time.Second)); !tick.IsZero() && tick.Before(end); tick = s.Next(tick) {
			at := tick.Add(s.Jitter(tick))
			if at.Before(from) || !at.Before(end) {
				continue
			}
			counts[at.Sub(from)/time.Minute]++
		}
	}
	return counts
}

var specs = []string{
	"@every 1s", "@every 7s", "@every 45s", "@every 60s", "@every 90s", "@every 1h", "@every 13m",
	"* * * * *", "*/5 * * * *", "0 * * * *", "30 2 * * *", "0 0 * * *", "@daily", "@hourly",
	"*/10 * * * * *", "15,45 */2 * * * *", "0 30 9 * * 1-5", "0 0 1 * *",
}

var zones = []string{"", "UTC", "Asia/Kolkata", "Europe/Berlin"}

// TestComputeMatchesBruteForce: for entries without jitter, and jittered
// entries with at most one tick a minute, every minute's count is exact.
func TestComputeMatchesBruteForce(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 40 {
		from := time.Date(2026, time.Month(1+r.IntN(12)), 1+r.IntN(28), r.IntN(24), r.IntN(60), 0, 0, time.UTC)
		minutes := 30 + r.IntN(200)
		var entries []contract.Entry
		for i := range 1 + r.IntN(8) {
			e := contract.Entry{ID: fmt.Sprintf("e%d-%d", round, i), Cron: specs[r.IntN(len(specs))], Timezone: zones[r.IntN(len(zones))]}
			e.Options.Queue = []string{"", "critical", "low"}[r.IntN(3)]
			if oneTickPerMinute(e.Cron) && r.IntN(2) == 0 {
				e.Jitter = contract.Duration(time.Duration(1+r.IntN(600)) * time.Second)
			}
			e.Paused = r.IntN(6) == 0
			entries = append(entries, e)
		}
		f := Compute(entries, Params{From: from, Window: time.Duration(minutes) * time.Minute, By: ByQueue})
		want := bruteForce(t, entries, from, minutes)
		for m := range minutes {
			if f.Totals[m] != want[m] {
				t.Fatalf("round %d minute %d (%s): got %d fires, brute force %d; entries %+v", round, m, from.Add(time.Duration(m)*time.Minute), f.Totals[m], want[m], entries)
			}
		}
		var sum int64
		for _, g := range f.Groups {
			for m, n := range g.Counts {
				sum += n
				_ = m
			}
		}
		if sum != f.Total {
			t.Fatalf("round %d: groups sum to %d, total %d", round, sum, f.Total)
		}
	}
}

func oneTickPerMinute(spec string) bool {
	switch spec {
	case "@every 1s", "@every 7s", "@every 45s", "*/10 * * * * *", "15,45 */2 * * * *":
		return false
	}
	return true
}

// TestComputeSubMinuteJitterKeepsTotal: a sub-minute rate with jitter is
// shifted by its mean offset, so its total over a window differs from the
// exact one only at the window's edges.
func TestComputeSubMinuteJitterKeepsTotal(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	for _, spec := range []string{"@every 1s", "@every 7s", "*/10 * * * * *"} {
		e := contract.Entry{ID: "j", Cron: spec, Jitter: contract.Duration(40 * time.Second)}
		f := Compute([]contract.Entry{e}, Params{From: from, Window: time.Hour})
		want := bruteForce(t, []contract.Entry{e}, from, 60)
		var exact int64
		for _, n := range want {
			exact += n
		}
		if d := f.Total - exact; d < -60 || d > 60 {
			t.Errorf("%s: total %d, exact %d", spec, f.Total, exact)
		}
	}
}

func TestComputeEverySecondIsArithmetic(t *testing.T) {
	t.Parallel()
	var entries []contract.Entry
	for i := range 1000 {
		entries = append(entries, contract.Entry{ID: fmt.Sprint("s", i), Cron: "@every 1s", Jitter: contract.Duration(time.Duration(i%5) * time.Second)})
	}
	start := time.Now()
	f := Compute(entries, Params{Window: 7 * 24 * time.Hour})
	if f.Total < 1000*86400*7-1000*5 {
		t.Fatalf("total %d", f.Total)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("a week of 1,000 @every 1s entries took %s", el)
	}
}

func TestPeakAndHint(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 3, 1, 23, 0, 0, 0, time.UTC)
	var entries []contract.Entry
	for i := range 500 {
		entries = append(entries, contract.Entry{ID: fmt.Sprintf("nightly-%03d", i), Cron: "0 0 * * *", Options: contract.Options{Queue: "reports"}})
	}
	entries = append(entries, contract.Entry{ID: "tick", Cron: "@every 1m"})
	entries = append(entries, contract.Entry{ID: "paused", Cron: "* * * * *", Paused: true})
	f := Compute(entries, Params{From: from, Window: 2 * time.Hour})
	if f.Entries != 501 {
		t.Fatalf("entries %d, want 501 (paused left out)", f.Entries)
	}
	if len(f.Peaks) == 0 {
		t.Fatal("no peak")
	}
	pk := f.Peaks[0]
	if !pk.At.Equal(time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)) || pk.Fires != 501 || pk.Entries != 501 {
		t.Fatalf("peak %+v", pk)
	}
	if got := pk.Specs[0].Describe(pk.At); got != "500 entries fire at 00:00:00 UTC (0 0 * * *)" {
		t.Fatalf("describe: %q", got)
	}
	if !strings.Contains(pk.Hint, "jitter 1h") || !strings.Contains(pk.Hint, "500 entries") {
		t.Fatalf("hint %q", pk.Hint)
	}
	if f.Groups[0].Name != "reports" || f.Groups[0].Total != 500 {
		t.Fatalf("groups %+v", f.Groups[0].Name)
	}

	// Entries every five minutes: a jitter over five minutes would push a
	// tick past the next one, so the hint never suggests one.
	var fives []contract.Entry
	for i := range 500 {
		fives = append(fives, contract.Entry{ID: fmt.Sprintf("five-%03d", i), Cron: "*/5 * * * *"})
	}
	fives = append(fives, contract.Entry{ID: "steady", Cron: "@every 1s"})
	f = Compute(fives, Params{From: from, Window: 2 * time.Hour})
	if len(f.Peaks) == 0 {
		t.Fatal("no peak for 500 entries every five minutes")
	}
	for _, pk := range f.Peaks {
		if !strings.Contains(pk.Hint, "jitter 5m") {
			t.Errorf("hint for */5: %q, want jitter 5m at most", pk.Hint)
		}
	}
}

func TestThousands(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 12400: "12,400", 1234567: "1,234,567", -1000: "-1,000"} {
		if got := Thousands(n); got != want {
			t.Errorf("Thousands(%d) = %q", n, got)
		}
	}
}

func TestJittererMatchesScheduler(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 2000 {
		id := fmt.Sprintf("entry-%d-%x", i, r.Uint64())
		jitter := time.Duration(1+r.IntN(86400)) * time.Second
		e := contract.Entry{ID: id, Cron: "* * * * *", Jitter: contract.Duration(jitter)}
		s, err := schedule.NewSchedule(e)
		if err != nil {
			t.Fatal(err)
		}
		tick := time.Unix(r.Int64N(1<<33)-(1<<32), 0).Truncate(time.Minute)
		if got, want := newJitterer(id, jitter).offset(tick.Unix()), int64(s.Jitter(tick)/time.Second); got != want {
			t.Fatalf("%s at %s: offset %d, scheduler %d", id, tick, got, want)
		}
	}
}

// TestComputeWindowAndExclusions: an entry's window and exclusions count
// as the scheduler applies them: no fire before the start, after the end or
// on an excluded tick.
func TestComputeWindowAndExclusions(t *testing.T) {
	t.Parallel()
	from := time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)
	entries := []contract.Entry{
		{ID: "sub", Cron: "@every 10s", StartAt: from.Add(10 * time.Minute), EndAt: from.Add(20 * time.Minute)},
		{ID: "min", Cron: "* * * * *", Exclude: []string{"0-29 * * * *"}},
		{ID: "same", Cron: "* * * * *"}, // shares no walk with "min"
	}
	f := Compute(entries, Params{From: from, Window: time.Hour})
	// sub: 10:00..20:00 inclusive every 10 s = 61; min: 30 a hour; same: 60.
	if want := int64(61 + 30 + 60); f.Total != want {
		t.Errorf("total %d, want %d", f.Total, want)
	}
	var got []int64
	for _, e := range entries {
		got = append(got, bruteForceFires(t, e, from, 60))
	}
	if got[0] != 61 || got[1] != 30 || got[2] != 60 {
		t.Errorf("brute force %v", got)
	}
}

// bruteForceFires counts the fires of e (NextFire: window and exclusions)
// in the minutes from from.
func bruteForceFires(t *testing.T, e contract.Entry, from time.Time, minutes int) int64 {
	s, err := schedule.NewSchedule(e)
	if err != nil {
		t.Fatal(err)
	}
	end := from.Add(time.Duration(minutes) * time.Minute)
	var n int64
	for tick := s.NextFire(from.Add(-time.Second)); !tick.IsZero() && tick.Before(end); tick = s.NextFire(tick) {
		n++
	}
	return n
}

// TestComputeMaxFires: a limited entry counts no more ticks than its fires
// left (its whole max_fires when the count is unknown), in time order; a
// completed one counts none and is left out of the entries.
func TestComputeMaxFires(t *testing.T) {
	t.Parallel()
	from := time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)
	entries := []contract.Entry{
		{ID: "left3", Cron: "@every 10s", MaxFires: 100},
		{ID: "unknown", Cron: "* * * * *", MaxFires: 5, Options: contract.Options{Queue: "q2"}},
		{ID: "done", Cron: "@every 1s", MaxFires: 2},
		{ID: "wide", Cron: "0 * * * *", MaxFires: 50}, // fewer ticks than fires left
		{ID: "free", Cron: "@every 1m"},
	}
	f := Compute(entries, Params{From: from, Window: time.Hour, By: ByEntry,
		Remaining: map[string]int{"left3": 3, "done": 0, "wide": 40}})
	want := map[string]int64{"left3": 3, "unknown": 5, "wide": 1, "free": 60}
	got := map[string]int64{}
	for _, g := range f.Groups {
		got[g.Name] = g.Total
	}
	for id, n := range want {
		if got[id] != n {
			t.Errorf("%s: %d fires, want %d (groups %v)", id, got[id], n, got)
		}
	}
	if _, ok := got["done"]; ok || f.Entries != 4 {
		t.Errorf("the completed entry is counted: %d entries, groups %v", f.Entries, got)
	}
	if f.Total != 3+5+1+60 {
		t.Errorf("total %d", f.Total)
	}
	// The fires left are the first ticks: left3's three in the first minute.
	for _, g := range f.Groups {
		if g.Name == "left3" && g.Counts[0] != 3 {
			t.Errorf("left3 per minute starts %v", g.Counts[:3])
		}
		if g.Name == "unknown" && (g.Counts[4] != 1 || g.Counts[5] != 0) {
			t.Errorf("unknown per minute starts %v", g.Counts[:7])
		}
	}
}

// TestComputeCalendarSpecs: entries with calendar specs count as the
// scheduler fires them, across month ends and a daylight-saving change,
// and add up to the ticks their dates give.
func TestComputeCalendarSpecs(t *testing.T) {
	t.Parallel()
	// Thursday 2026-03-26 to Thursday 2026-04-02: March 31st is the last
	// day and the last weekday, Friday the 27th the last Friday, Sunday
	// the 29th the last Sunday, when Berlin skips 02:00-03:00.
	from := time.Date(2026, 3, 26, 0, 0, 0, 0, time.UTC)
	entries := []contract.Entry{
		{ID: "last", Cron: "0 */15 * L * *"},                                            // 96 on the 31st
		{ID: "lastfri", Cron: "30 9 ? * 5L", Timezone: "Europe/Berlin"},                 // 1
		{ID: "lastsun", Cron: "0 0 * ? * SUNL", Timezone: "Europe/Berlin"},              // 23: the day has 23 hours
		{ID: "gap", Cron: "0 30 2 ? 3 0L", Timezone: "Europe/Berlin"},                   // 1, at 03:00 CEST
		{ID: "lw", Cron: "*/20 * 12 LW * *", Timezone: "Asia/Kolkata"},                  // 3 a minute for 60 minutes
		{ID: "first", Cron: "0 0 8 1W,15W * *", Timezone: "America/New_York"},           // April 1st, a Wednesday
		{ID: "jit", Cron: "0 0 6 ? * 5#4", Jitter: contract.Duration(10 * time.Minute)}, // Friday the 27th
	}
	minutes := 7 * 24 * 60
	f := Compute(entries, Params{From: from, Window: time.Duration(minutes) * time.Minute, By: ByEntry})
	if want := int64(96 + 1 + 23 + 1 + 180 + 1 + 1); f.Total != want {
		t.Errorf("total %d, want %d", f.Total, want)
	}
	want := bruteForce(t, entries, from, minutes)
	for m := range minutes {
		if f.Totals[m] != want[m] {
			t.Fatalf("minute %s: %d fires, the scheduler's ticks make %d", from.Add(time.Duration(m)*time.Minute), f.Totals[m], want[m])
		}
	}
}

// TestComputeLeavesOutEnded: an entry past its end_at fires nothing and is
// not counted among the entries; one that ends inside the window is.
func TestComputeLeavesOutEnded(t *testing.T) {
	t.Parallel()
	from := time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)
	entries := []contract.Entry{
		{ID: "over", Cron: "* * * * *", EndAt: from.Add(-time.Hour)},
		{ID: "ending", Cron: "* * * * *", EndAt: from.Add(9*time.Minute + 30*time.Second)},
	}
	f := Compute(entries, Params{From: from, Window: time.Hour})
	if f.Entries != 1 || f.Total != 10 {
		t.Errorf("%d entries, %d fires: want the ending entry's 10 fires alone", f.Entries, f.Total)
	}
}
