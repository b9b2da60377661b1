package scheduler

import (
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/schedule"
)

// tickRange is a run of consecutive ticks of one entry: the first and last
// tick and how many there are. Exact is false when counting stopped at
// maxCount (the count is then a lower bound).
type tickRange struct {
	First, Last time.Time
	Count       int
	Exact       bool
}

func (r tickRange) empty() bool { return r.Count == 0 }

// maxCount bounds how far countTicks walks a cron spec; @every is counted
// arithmetically and never needs the bound.
const maxCount = 200_000

// countTicks describes the ticks in (after, before).
func countTicks(s *schedule.Schedule, after, before time.Time) tickRange {
	if !after.Before(before) {
		return tickRange{Exact: true}
	}
	if s.Every() > 0 && s.EndAt().IsZero() { // an end bounds the ticks: walk them
		first := s.Next(after)
		if !first.Before(before) {
			return tickRange{Exact: true}
		}
		step := int64(s.Every() / time.Second)
		n := (before.Unix()-1-first.Unix())/step + 1
		// A before with a fraction of a second can admit one more tick.
		if time.Unix(first.Unix()+n*step, 0).Before(before) {
			n++
		}
		last := time.Unix(first.Unix()+(n-1)*step, 0).UTC()
		return tickRange{First: first, Last: last, Count: int(n), Exact: true}
	}
	var r tickRange
	r.Exact = true
	for t := s.Next(after); !t.IsZero() && t.Before(before); t = s.Next(t) {
		if r.Count == 0 {
			r.First = t
		}
		r.Last = t
		r.Count++
		if r.Count == maxCount {
			r.Exact = false
			break
		}
	}
	return r
}

// catchupPlan is what to do with an entry's missed ticks: the ticks no
// replica fired while they were due and that are now older than the grace.
type catchupPlan struct {
	// Fire are the missed ticks to fire now, oldest first.
	Fire []time.Time
	// Skipped are the missed ticks the policy drops. They are recorded
	// (one skipped event for the range) in the same atomic step as the
	// first fire, or on their own when nothing fires.
	Skipped tickRange
	// More says the policy wants more ticks fired than one pass allows;
	// the next pass continues after the last of Fire.
	More bool
}

// planCatchup applies the entry's catch-up policy to the ticks in
// (start, now-grace): none skips them all, latest fires the most recent one
// if it lies within the window, all fires every one within the window,
// oldest first, at most maxFire per pass. Ticks older than the window are
// always skipped.
func planCatchup(s *schedule.Schedule, c events.Catchup, start, now time.Time, grace time.Duration, maxFire int) catchupPlan {
	boundary := now.Add(-grace)
	windowStart := now.Add(-c.Window.D())
	switch c.Policy {
	case events.CatchupLatest:
		missed := countTicks(s, start, boundary)
		if missed.empty() {
			return catchupPlan{}
		}
		if missed.Last.Before(windowStart) {
			return catchupPlan{Skipped: missed}
		}
		// Everything before the latest missed tick is skipped.
		return catchupPlan{Fire: []time.Time{missed.Last}, Skipped: countTicks(s, start, missed.Last)}
	case events.CatchupAll:
		// Ticks at or after windowStart are in the window.
		old := countTicks(s, start, windowStart)
		from := start
		if !old.empty() {
			from = old.Last
		}
		fire, more := ticksBefore(s, from, boundary, maxFire)
		return catchupPlan{Fire: fire, Skipped: old, More: more}
	default:
		return catchupPlan{Skipped: countTicks(s, start, boundary)}
	}
}

// ticksBefore returns the ticks in (after, before), at most max.
func ticksBefore(s *schedule.Schedule, after, before time.Time, max int) ([]time.Time, bool) {
	var out []time.Time
	for t := s.Next(after); !t.IsZero() && t.Before(before); t = s.Next(t) {
		if len(out) == max {
			return out, true
		}
		out = append(out, t)
	}
	return out, false
}
