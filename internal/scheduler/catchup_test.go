package scheduler

import (
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/firetest"
	"github.com/cronstream/cronstream/schedule"
)

func TestCountTicks(t *testing.T) {
	every := firetest.Schedule(t, "@every 10s", "", 0)
	cronSec := firetest.Schedule(t, "*/10 * * * * *", "", 0)
	from := firetest.UTC("2026-01-01T00:00:00Z")
	for _, s := range []*schedule.Schedule{every, cronSec} {
		r := countTicks(s, from, from.Add(time.Minute))
		// (00:00, 01:00) holds :10 :20 :30 :40 :50.
		if r.Count != 5 || !r.Exact || !r.First.Equal(from.Add(10*time.Second)) || !r.Last.Equal(from.Add(50*time.Second)) {
			t.Fatalf("countTicks = %+v", r)
		}
		r = countTicks(s, from, from.Add(time.Minute+500*time.Millisecond))
		if r.Count != 6 || !r.Last.Equal(from.Add(time.Minute)) {
			t.Fatalf("countTicks with fractional bound = %+v", r)
		}
		if r := countTicks(s, from, from.Add(5*time.Second)); !r.empty() {
			t.Fatalf("no ticks expected, got %+v", r)
		}
	}
	// A month of @every 1s is counted without walking it.
	r := countTicks(firetest.Schedule(t, "@every 1s", "", 0), from, from.Add(30*24*time.Hour))
	if r.Count != 30*24*3600-1 || !r.Exact {
		t.Fatalf("month of seconds = %+v", r)
	}
}

func TestPlanCatchup(t *testing.T) {
	s := firetest.Schedule(t, "@every 1m", "", 0)
	start := firetest.UTC("2026-01-01T00:00:00Z") // last handled tick
	now := firetest.UTC("2026-01-01T00:10:03Z")   // ticks 00:01..00:10 are due; 00:10 is within the grace
	grace := 5 * time.Second
	at := func(m int) time.Time { return start.Add(time.Duration(m) * time.Minute) }
	cases := []struct {
		name     string
		c        events.Catchup
		max      int
		fire     []time.Time
		skipped  int
		skipLast time.Time
		more     bool
	}{
		{"none skips every missed tick", events.Catchup{Policy: events.CatchupNone}, 100, nil, 9, at(9), false},
		{"latest fires the most recent missed", events.Catchup{Policy: events.CatchupLatest, Window: events.Duration(time.Hour)}, 100, []time.Time{at(9)}, 8, at(8), false},
		{"latest outside the window skips all", events.Catchup{Policy: events.CatchupLatest, Window: events.Duration(30 * time.Second)}, 100, nil, 9, at(9), false},
		{"all fires every missed tick", events.Catchup{Policy: events.CatchupAll, Window: events.Duration(time.Hour)}, 100,
			[]time.Time{at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8), at(9)}, 0, time.Time{}, false},
		{"all skips ticks older than the window", events.Catchup{Policy: events.CatchupAll, Window: events.Duration(4*time.Minute + 30*time.Second)}, 100,
			[]time.Time{at(6), at(7), at(8), at(9)}, 5, at(5), false},
		{"all is bounded per pass", events.Catchup{Policy: events.CatchupAll, Window: events.Duration(time.Hour)}, 3,
			[]time.Time{at(1), at(2), at(3)}, 0, time.Time{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := planCatchup(s, c.c, start, now, grace, c.max)
			if len(p.Fire) != len(c.fire) {
				t.Fatalf("fire %v, want %v", p.Fire, c.fire)
			}
			for i := range c.fire {
				if !p.Fire[i].Equal(c.fire[i]) {
					t.Fatalf("fire %v, want %v", p.Fire, c.fire)
				}
			}
			if p.Skipped.Count != c.skipped || (c.skipped > 0 && !p.Skipped.Last.Equal(c.skipLast)) {
				t.Fatalf("skipped %+v, want %d ending %s", p.Skipped, c.skipped, c.skipLast)
			}
			if p.More != c.more {
				t.Fatalf("more = %v", p.More)
			}
		})
	}
	if p := planCatchup(s, events.Catchup{Policy: events.CatchupAll, Window: events.Duration(time.Hour)}, at(9), now, grace, 10); len(p.Fire) != 0 || !p.Skipped.empty() {
		t.Fatalf("nothing missed, got %+v", p)
	}
}
