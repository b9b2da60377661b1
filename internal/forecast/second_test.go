package forecast

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/schedule"
)

// bruteSeconds lists every tick of every entry (jitter included) and
// counts them per second.
func bruteSeconds(t *testing.T, entries []events.Entry, from time.Time, secs int) []int64 {
	t.Helper()
	counts := make([]int64, secs)
	end := from.Add(time.Duration(secs) * time.Second)
	for _, e := range entries {
		s, err := schedule.NewSchedule(e)
		if err != nil {
			t.Fatal(err)
		}
		for tick := s.NextFire(from.Add(-e.Jitter.D() - time.Second)); !tick.IsZero() && tick.Before(end); tick = s.NextFire(tick) {
			at := tick.Add(s.Jitter(tick))
			if !at.Before(from) && at.Before(end) {
				counts[at.Sub(from)/time.Second]++
			}
		}
	}
	return counts
}

// PeakSecond finds the busiest second exactly wherever ticks are exact:
// entries without jitter, and jittered ones that fire at most once a
// minute or are alone with their spec.
func TestPeakSecondMatchesBruteForce(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 30 {
		from := time.Date(2026, time.Month(1+r.IntN(12)), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), 0, time.UTC)
		window := time.Duration(10+r.IntN(120)) * time.Minute
		var entries []events.Entry
		for i := range 1 + r.IntN(12) {
			e := events.Entry{ID: fmt.Sprintf("e%d-%d", round, i), Cron: specs[r.IntN(len(specs))], Timezone: zones[r.IntN(len(zones))]}
			if oneTickPerMinute(e.Cron) && r.IntN(2) == 0 {
				e.Jitter = events.Duration(time.Duration(1+r.IntN(600)) * time.Second)
			}
			if r.IntN(8) == 0 {
				e.Exclude = []string{"*/3 * * * *"}
			}
			entries = append(entries, e)
		}
		want := bruteSeconds(t, entries, from, int(window/time.Second))
		got := PeakSecond(slices.Values(ptrs(entries)), Params{From: from, Window: window})
		peak := slices.Max(want)
		if got.Fires != peak {
			t.Fatalf("round %d: peak %d fires at %s, brute force %d", round, got.Fires, got.At, peak)
		}
		if peak > 0 && want[got.At.Sub(from)/time.Second] != peak {
			t.Fatalf("round %d: peak at %s holds %d fires, not the peak %d", round, got.At, want[got.At.Sub(from)/time.Second], peak)
		}
		if got.Entries != len(entries) {
			t.Errorf("round %d: %d entries counted, want %d", round, got.Entries, len(entries))
		}
	}
}

func ptrs(entries []events.Entry) []*events.Entry {
	out := make([]*events.Entry, len(entries))
	for i := range entries {
		out[i] = &entries[i]
	}
	return out
}

// The cases that decide a capacity warning: a burst at the top of the
// minute over a steady rate, a sub-minute rate spread by its jitter, and
// what is left out.
func TestPeakSecond(t *testing.T) {
	t.Parallel()
	from := time.Date(2030, 1, 1, 10, 0, 30, 0, time.UTC)
	many := func(n int, cron string, mod func(*events.Entry)) []events.Entry {
		var out []events.Entry
		for i := range n {
			e := events.Entry{ID: fmt.Sprintf("%s-%d", cron, i), Cron: cron}
			if mod != nil {
				mod(&e)
			}
			out = append(out, e)
		}
		return out
	}
	jitter := func(d time.Duration) func(*events.Entry) {
		return func(e *events.Entry) { e.Jitter = events.Duration(d) }
	}
	for _, tc := range []struct {
		name    string
		entries []events.Entry
		fires   int64
		at      time.Time
	}{
		{"burst over a steady rate", append(many(1000, "@every 1s", nil), many(100, "0 * * * * *", nil)...), 1100, from.Add(30 * time.Second)},
		{"a minute's fires spread over it", many(600, "@every 60s", jitter(60*time.Second)), 0, time.Time{}},
		{"sub-minute rate spread by its jitter", many(600, "@every 10s", jitter(10*time.Second)), 60, time.Time{}},
		{"paused entries fire nothing", many(50, "@every 1s", func(e *events.Entry) { e.Paused = true }), 0, time.Time{}},
		{"six-field spec every second", many(7, "* * * * * *", nil), 7, from},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PeakSecond(slices.Values(ptrs(tc.entries)), Params{From: from, Window: time.Hour})
			switch {
			case tc.fires > 0 && got.Fires != tc.fires:
				t.Errorf("peak %d fires, want %d", got.Fires, tc.fires)
			case tc.fires > 0 && !tc.at.IsZero() && !got.At.Equal(tc.at):
				t.Errorf("peak at %s, want %s", got.At, tc.at)
			case tc.fires == 0 && len(tc.entries) > 0 && !tc.entries[0].Paused && got.Fires > 30:
				// 600 jittered once-a-minute entries: their offsets are
				// hashed, so a second holds a handful, never all.
				t.Errorf("peak %d fires in a second from 600 entries spread over a minute", got.Fires)
			case tc.entries[0].Paused && (got.Fires != 0 || got.Entries != 0):
				t.Errorf("paused entries counted: %+v", got)
			}
		})
	}
}
