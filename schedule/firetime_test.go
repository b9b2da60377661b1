package schedule_test

import (
	"sync"
	"testing"
	"time"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/firetest"
	"github.com/cronstream/cronstream/schedule"
)

func TestScheduleNext(t *testing.T) {
	cases := []struct {
		name, spec, tz, from string
		want                 []string
	}{
		{"seconds field", "*/20 * * * * *", "", "2026-01-01T00:00:05Z",
			[]string{"2026-01-01T00:00:20Z", "2026-01-01T00:00:40Z", "2026-01-01T00:01:00Z"}},
		{"five fields", "15 * * * *", "", "2026-01-01T00:15:00Z",
			[]string{"2026-01-01T01:15:00Z", "2026-01-01T02:15:00Z"}},
		{"hourly descriptor", "@hourly", "", "2026-01-01T00:00:00Z",
			[]string{"2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z"}},
		{"daily in Berlin winter", "0 9 * * *", "Europe/Berlin", "2026-01-01T00:00:00Z",
			[]string{"2026-01-01T08:00:00Z", "2026-01-02T08:00:00Z"}},
		{"daily in Berlin summer", "@daily", "Europe/Berlin", "2026-07-01T00:00:00Z",
			[]string{"2026-07-01T22:00:00Z", "2026-07-02T22:00:00Z"}},
		{"CRON_TZ overrides entry zone", "CRON_TZ=Asia/Tokyo 0 9 * * *", "Europe/Berlin", "2026-01-01T00:00:00Z",
			[]string{"2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"}},
		{"every aligned to epoch", "@every 7s", "", "2026-01-01T00:00:00Z",
			// 1767225600 (2026-01-01T00:00:00Z) happens to be a multiple of 7.
			[]string{"2026-01-01T00:00:07Z", "2026-01-01T00:00:14Z", "2026-01-01T00:00:21Z"}},
		{"every 11s off the minute grid", "@every 11s", "", "2026-01-01T00:00:00Z",
			// 1767225600 mod 11 = 8, so the grid is at :03, :14, :25.
			[]string{"2026-01-01T00:00:03Z", "2026-01-01T00:00:14Z", "2026-01-01T00:00:25Z"}},
		{"every ignores the zone", "@every 1h", "America/New_York", "2026-01-01T00:30:00Z",
			[]string{"2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z"}},
		{"weekdays at 9 in New York", "0 9 * * MON-FRI", "America/New_York", "2026-01-02T15:00:00Z", // a Friday
			[]string{"2026-01-05T14:00:00Z", "2026-01-06T14:00:00Z"}},
		// Spring forward, New York 2026-03-08: 02:00 EST jumps to 03:00 EDT.
		{"gap time fires when the gap ends", "30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z",
			[]string{"2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"}},
		{"hourly keeps its rhythm over the gap", "30 * * * *", "America/New_York", "2026-03-08T06:00:00Z",
			[]string{"2026-03-08T06:30:00Z", "2026-03-08T07:30:00Z", "2026-03-08T08:30:00Z"}},
		{"fixed time outside the gap is unaffected", "0 9 * * *", "America/New_York", "2026-03-07T15:00:00Z",
			[]string{"2026-03-08T13:00:00Z", "2026-03-09T13:00:00Z"}},
		// Fall back, New York 2026-11-01: 02:00 EDT goes back to 01:00 EST.
		{"repeated time fires once", "30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z",
			[]string{"2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"}},
		{"hourly fires in both repeated hours", "0 * * * *", "America/New_York", "2026-11-01T04:30:00Z",
			[]string{"2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"}},
		{"Feb 29 only in leap years", "0 0 29 2 *", "", "2026-01-01T00:00:00Z",
			[]string{"2028-02-29T00:00:00Z"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := firetest.Schedule(t, c.spec, c.tz, 0)
			at := firetest.UTC(c.from)
			for i, w := range c.want {
				at = s.Next(at)
				if !at.Equal(firetest.UTC(w)) {
					t.Fatalf("tick %d: got %s, want %s", i, at.Format(time.RFC3339), w)
				}
			}
		})
	}
}

func TestEveryAgreesAcrossStarts(t *testing.T) {
	s := firetest.Schedule(t, "@every 1m30s", "", 0)
	base := firetest.UTC("2026-05-05T10:00:00Z")
	want := s.Next(base)
	for off := time.Duration(0); off < 90*time.Second; off += 7 * time.Second {
		// A replica that started later sees the same grid.
		got := s.Next(base.Add(off))
		if got.Unix()%90 != 0 {
			t.Fatalf("Next(%s) = %s, not on the 90 s epoch grid", base.Add(off), got)
		}
		if !got.After(base.Add(off)) {
			t.Fatalf("Next not after its argument")
		}
	}
	if want.Unix()%90 != 0 {
		t.Fatalf("first tick %s not aligned", want)
	}
}

func TestJitter(t *testing.T) {
	s := firetest.Schedule(t, "@every 1s", "", 10*time.Second)
	s2 := firetest.Schedule(t, "@every 1s", "", 10*time.Second)
	seen := map[time.Duration]bool{}
	tick := firetest.UTC("2026-01-01T00:00:00Z")
	for i := 0; i < 500; i++ {
		tick = s.Next(tick)
		j := s.Jitter(tick)
		if j < 0 || j >= 10*time.Second || j%time.Second != 0 {
			t.Fatalf("jitter %s out of [0,10s) or not whole seconds", j)
		}
		if s2.Jitter(tick) != j {
			t.Fatalf("jitter not deterministic for %s", tick)
		}
		seen[j] = true
	}
	if len(seen) < 8 {
		t.Fatalf("jitter does not spread: only %d distinct offsets in 500 ticks", len(seen))
	}
	if d := firetest.Schedule(t, "@every 1s", "", 0).Jitter(tick); d != 0 {
		t.Fatalf("no jitter configured but got %s", d)
	}
	// The same spec and jitter, another entry.
	other, err := schedule.NewSchedule(contract.Entry{ID: "e2", Cron: "@every 1s", Task: contract.Task{Type: "t"}, Jitter: contract.Duration(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	same := 0
	for i, tk := 0, firetest.UTC("2026-01-01T00:00:00Z"); i < 100; i++ {
		tk = tk.Add(time.Second)
		if other.Jitter(tk) == s.Jitter(tk) {
			same++
		}
	}
	if same > 40 {
		t.Fatalf("two entries share %d of 100 offsets: jitter ignores the entry id", same)
	}
}

func TestTicksAndPrev(t *testing.T) {
	s := firetest.Schedule(t, "*/10 * * * * *", "", 0)
	from, until := firetest.UTC("2026-01-01T00:00:00Z"), firetest.UTC("2026-01-01T00:01:00Z")
	ticks, more := s.Ticks(from, until, 0)
	if len(ticks) != 6 || more || !ticks[5].Equal(until) {
		t.Fatalf("Ticks = %v more=%v, want 6 ending at %s", ticks, more, until)
	}
	ticks, more = s.Ticks(from, until, 4)
	if len(ticks) != 4 || !more {
		t.Fatalf("bounded Ticks = %d more=%v", len(ticks), more)
	}
	if p := s.Prev(firetest.UTC("2026-01-01T00:00:35Z"), from); !p.Equal(firetest.UTC("2026-01-01T00:00:30Z")) {
		t.Fatalf("Prev = %s", p)
	}
	if p := s.Prev(firetest.UTC("2026-01-01T00:00:05Z"), from); !p.IsZero() {
		t.Fatalf("Prev before the floor = %s, want zero", p)
	}
	e := firetest.Schedule(t, "@every 10s", "", 0)
	if p := e.Prev(firetest.UTC("2026-01-01T00:00:35Z"), from); !p.Equal(firetest.UTC("2026-01-01T00:00:30Z")) {
		t.Fatalf("@every Prev = %s", p)
	}
}

func TestTaskID(t *testing.T) {
	got := schedule.TaskID("cronstream", "daily-report", time.Date(2026, 11, 30, 9, 0, 0, 0, time.FixedZone("x", 3600)))
	if want := "cronstream:daily-report:2026-11-30T08:00:00Z"; got != want {
		t.Fatalf("TaskID = %q, want %q", got, want)
	}
}

func TestShortestGap(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		cron, tz string
		exclude  []string
		want     time.Duration
	}{
		{"*/5 * * * *", "UTC", nil, 5 * time.Minute},
		{"@every 90s", "UTC", nil, 90 * time.Second},
		{"0 9,17 * * 1-5", "UTC", nil, 8 * time.Hour},
		{"0 0 1 * *", "UTC", nil, 28 * 24 * time.Hour},
		// New York's spring-forward night: 01:30 and then 03:30 of the same
		// night are an hour apart, not two.
		{"30 1,3 * * *", "America/New_York", nil, time.Hour},
		{"*/10 * * * *", "UTC", []string{"10-59/10 * * * *"}, time.Hour},
	}
	for _, c := range cases {
		s, err := schedule.NewSchedule(contract.Entry{ID: "g", Cron: c.cron, Timezone: c.tz, Exclude: c.exclude})
		if err != nil {
			t.Fatalf("%s: %v", c.cron, err)
		}
		if got := s.ShortestGap(from); got != c.want {
			t.Errorf("%s in %s (exclude %v): shortest gap %s, want %s", c.cron, c.tz, c.exclude, got, c.want)
		}
	}
}

// TestMinGap: the bound read from the spec, and never above the gaps the
// ticks really have (the fall-back night of New York included, where one
// wall-clock hour comes twice).
func TestMinGap(t *testing.T) {
	t.Parallel()
	cases := []struct {
		cron, tz string
		want     time.Duration
	}{
		{"@every 90s", "UTC", 90 * time.Second},
		{"* * * * *", "UTC", time.Minute},
		{"30 1 * * *", "America/New_York", time.Minute},
		{"0 0 L * *", "UTC", time.Minute},
		{"0 0 0 * * *", "UTC", time.Minute},
		{"*/5 * * * * *", "UTC", time.Second},
		{"0,30 * * * * *", "UTC", time.Second},
		{"* * * * * *", "UTC", time.Second},
	}
	for _, c := range cases {
		s, err := schedule.NewSchedule(contract.Entry{ID: "g", Cron: c.cron, Timezone: c.tz})
		if err != nil {
			t.Fatalf("%s: %v", c.cron, err)
		}
		if got := s.MinGap(); got != c.want {
			t.Errorf("%s: MinGap %s, want %s", c.cron, got, c.want)
		}
		for _, from := range []time.Time{time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 1, 4, 0, 0, 0, time.UTC)} {
			if gap := s.ShortestGap(from); gap != 0 && gap < s.MinGap() {
				t.Errorf("%s in %s from %s: a gap of %s is under MinGap %s", c.cron, c.tz, from, gap, s.MinGap())
			}
		}
	}
}

// TestNextWithSharedSpecs: entries with one spec and zone share its parsed
// form and the last tick computed for it; entries with another spec, or
// asking after another instant, in any order and from several goroutines,
// still get their own ticks.
func TestNextWithSharedSpecs(t *testing.T) {
	mk := func(id, spec, tz string) *schedule.Schedule {
		t.Helper()
		s, err := schedule.NewSchedule(contract.Entry{ID: id, Cron: spec, Timezone: tz, Task: contract.Task{Type: "t"}}.Normalize())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	daily1, daily2 := mk("a", "0 0 0 * * *", ""), mk("b", "0 0 0 * * *", "")
	berlin := mk("c", "30 2 * * *", "Europe/Berlin") // 02:30 falls in the spring gap
	from := time.Date(2026, 3, 28, 12, 0, 0, 0, time.UTC)
	type ask struct {
		s    *schedule.Schedule
		from time.Time
		want time.Time
	}
	asks := []ask{
		{daily1, from, time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC)},
		{berlin, from, time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC)}, // the gap's end, 03:00 CEST
		{daily2, from, time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC)},
		{daily2, from.Add(24 * time.Hour), time.Date(2026, 3, 30, 0, 0, 0, 0, time.UTC)},
		{daily1, from, time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC)},
		{berlin, from.Add(24 * time.Hour), time.Date(2026, 3, 30, 0, 30, 0, 0, time.UTC)},
	}
	for i, a := range asks {
		if got := a.s.Next(a.from); !got.Equal(a.want) {
			t.Fatalf("ask %d: Next(%s) = %s, want %s", i, a.from, got, a.want)
		}
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				a := asks[(g+i)%len(asks)]
				if got := a.s.Next(a.from); !got.Equal(a.want) {
					t.Errorf("goroutine %d: Next(%s) = %s, want %s", g, a.from, got, a.want)
					return
				}
			}
		}()
	}
	wg.Wait()
}
