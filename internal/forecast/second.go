package forecast

import (
	"cmp"
	"iter"
	"math"
	"strings"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/schedule"
)

// SecondPeak is the busiest second of a schedule: what a deployment must
// fire in one second to keep every tick on time. Per second, not per
// minute: a minute of 60,000 fires is 1,000 a second spread evenly, or
// 60,000 in its first second.
type SecondPeak struct {
	// At is the busiest second (the first, when several tie); Fires its
	// fires, rounded up (a jittered entry that fires many times a minute
	// is counted spread over its jitter).
	At    time.Time `json:"at"`
	Fires int64     `json:"fires"`
	// From and Window are the stretch looked at; Entries the entries
	// counted (paused, removed, ended and completed ones are not).
	From    time.Time     `json:"from"`
	Window  time.Duration `json:"window"`
	Entries int           `json:"entries"`
	// Skipped lists the entries whose schedule does not build.
	Skipped []string `json:"skipped,omitempty"`
}

// PeakSecond finds the busiest second of entries over the window of p
// (From, truncated to the second; Window, default 24 hours, at most a
// week; Remaining as in Compute; By, MaxGroups and MaxPeaks do not
// apply).
//
// Ticks are counted as Compute counts them, at one-second resolution:
// "@every D" under a minute by its multiples, other schedules one step
// per minute that holds a tick, entries sharing a spec and zone once. A
// tick's jitter is the scheduler's own offset for entries that fire at
// most once a minute; entries that fire several times a minute and share
// a spec, zone and jitter are counted spread evenly over the jitter, as
// their many offsets spread them (rather than all at their mean, which
// would make a peak of what is a steady rate).
func PeakSecond(entries iter.Seq[*events.Entry], p Params) SecondPeak {
	from := cmp.Or(p.From, time.Now()).UTC().Truncate(time.Second)
	window := min(cmp.Or(p.Window, 24*time.Hour), MaxWindow).Truncate(time.Second)
	pk := SecondPeak{From: from, Window: window}
	counts := make([]float64, int(window/time.Second))
	type unit struct {
		e    *events.Entry
		n    float64
		left int
	}
	shared := map[string]*unit{}
	var units []*unit
	for e := range entries {
		if e.Paused || e.Removed || e.Ended(from) {
			continue
		}
		left := -1
		if e.Limited() {
			left = e.MaxFires
			if n, ok := p.Remaining[e.ID]; ok {
				left = n
			}
			if left <= 0 {
				continue
			}
		}
		pk.Entries++
		if k, ok := shareKey(*e); ok {
			if u := shared[k]; u != nil {
				u.n++
				continue
			}
			u := &unit{e: e, n: 1, left: left}
			shared[k] = u
			units = append(units, u)
			continue
		}
		units = append(units, &unit{e: e, n: 1, left: left})
	}
	walks := map[walkKey][]tickMinute{}
	for _, u := range units {
		if err := secondSeries(*u.e, u.n, u.left, from, counts, walks); err != nil {
			pk.Skipped = append(pk.Skipped, u.e.ID)
		}
	}
	best := -1
	for i, c := range counts {
		if best < 0 || c > counts[best]+1e-9 {
			best = i
		}
	}
	if best >= 0 && counts[best] > 0 {
		pk.At = from.Add(time.Duration(best) * time.Second)
		pk.Fires = int64(math.Ceil(counts[best] - 1e-9))
	}
	return pk
}

// secondSeries adds n entries like e to counts, one per second from
// from, at most left ticks each (negative: no limit).
func secondSeries(e events.Entry, n float64, left int, from time.Time, counts []float64, walks map[walkKey][]tickMinute) error {
	s, err := schedule.NewSchedule(e)
	if err != nil {
		return err
	}
	base, size := from.Unix(), int64(len(counts))
	add := func(at int64, v float64) {
		if off := at - base; off >= 0 && off < size {
			counts[off] += v
		}
	}
	jitter := e.Jitter.D().Truncate(time.Second)
	jsecs := int64(jitter / time.Second)
	jit := newJitterer(e.ID, jitter)
	end := from.Add(time.Duration(size) * time.Second)
	if bounded(e) {
		for t := s.NextFire(from.Add(-jitter - time.Second)); !t.IsZero() && t.Before(end) && left != 0; t = s.NextFire(t) {
			add(t.Unix()+jit.offset(t.Unix()), n)
			left--
		}
		return nil
	}
	if every, ok := strings.CutPrefix(e.Cron, "@every "); ok {
		d, _ := time.ParseDuration(every) // NewSchedule checked it
		if step := int64(d / time.Second); step < 60 {
			for t := floorDiv(base-jsecs, step) * step; t < base+size; t += step {
				if jsecs <= 1 {
					add(t, n)
					continue
				}
				for k := range jsecs {
					add(t+k, n/float64(jsecs))
				}
			}
			return nil
		}
	}
	key := walkKey{e.Cron, e.Timezone, jitter}
	walk, ok := walks[key]
	if !ok {
		walk = walkMinutes(e, s, from.Add(-jitter-time.Second), end)
		walks[key] = walk
	}
	for _, tm := range walk {
		m := tm.unix - tm.unix%60
		for i, sec := 0, int(tm.unix%60); i < int(tm.n); i, sec = i+1, nextBit(tm.mask, sec) {
			at := m + int64(sec)
			add(at+jit.offset(at), n)
		}
	}
	return nil
}
