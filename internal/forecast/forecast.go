// Package forecast counts the fires the registered entries will make in
// each minute of a window, per queue or per entry, and finds the peaks.
//
// Counts are computed without listing ticks one by one (an "@every 1s"
// entry has 86,400 a day):
//
//   - "@every D" with D under a minute: the multiples of D in each minute,
//     counted arithmetically.
//   - "@every D" of a minute or more, and cron specs: one step per minute
//     that holds a tick (the scheduler's own Next, so time zones and
//     daylight saving are those of the scheduler), the ticks within that
//     minute counted from the spec's seconds field.
//   - Jitter is the scheduler's deterministic offset, applied to each tick
//     when a minute holds one tick. When a minute holds several ticks of one
//     entry (sub-minute rates), the entry fires at a steady rate that jitter
//     only shifts, so its counts are shifted by the mean offset instead of
//     hashing every tick; the total over the window is unchanged but for
//     the edges.
//
// Entries without jitter that share a spec and zone share one computation,
// so 100,000 entries of a few specs cost a few series.
package forecast

import (
	"cmp"
	"fmt"
	"iter"
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/schedule"
)

// By says how fires are grouped.
type By string

// Groupings.
const (
	ByQueue By = "queue"
	ByEntry By = "entry"
)

// ParseBy checks a --by value.
func ParseBy(s string) (By, error) {
	switch By(s) {
	case "", ByQueue:
		return ByQueue, nil
	case ByEntry:
		return ByEntry, nil
	}
	return "", fmt.Errorf("by %q: want queue or entry", s)
}

// Params configure a forecast; the zero value forecasts 24 hours from the
// current minute, by queue.
type Params struct {
	From   time.Time     // truncated to the minute; zero: now
	Window time.Duration // rounded up to whole minutes; zero: 24h
	By     By            // zero: ByQueue
	// MaxGroups bounds the groups kept with their own series (the largest
	// by total); the rest are summed into OtherGroup. Zero: 12.
	MaxGroups int
	// MaxPeaks is how many peaks are reported. Zero: 3.
	MaxPeaks int
	// Remaining is the fires left of entries with max_fires, by id, as
	// read from their fires counters in Redis. A limited entry not in it
	// is bounded by its whole max_fires (nothing is known of its count).
	Remaining map[string]int
}

// OtherGroup names the sum of the groups beyond MaxGroups.
const OtherGroup = "(other)"

// MaxWindow bounds the window: a week of minutes.
const MaxWindow = 7 * 24 * time.Hour

// Group is the fires per minute of one queue or entry.
type Group struct {
	Name   string  `json:"name"`
	Total  int64   `json:"total"`
	Counts []int64 `json:"counts"` // one per minute from Forecast.From
}

// Peak is a minute whose fires stand out, with the entries behind them.
type Peak struct {
	At      time.Time `json:"at"`
	Fires   int64     `json:"fires"`
	Entries int       `json:"entries"` // entries firing in that minute
	// Specs are the schedules behind the peak, the largest first.
	Specs []PeakSpec `json:"specs"`
	// Hint says how jitter would flatten the peak; empty when the entries
	// behind it already have jitter.
	Hint string `json:"hint,omitempty"`
}

// PeakSpec is the entries of one schedule firing in a peak minute.
type PeakSpec struct {
	Cron     string   `json:"cron"`
	Timezone string   `json:"timezone,omitempty"`
	Second   int      `json:"second"` // second of the minute of the first fire
	Entries  int      `json:"entries"`
	Fires    int64    `json:"fires"`
	Jittered int      `json:"jittered"` // entries among them with jitter
	Sample   []string `json:"sample"`   // a few entry ids
}

// Forecast is the result.
type Forecast struct {
	From     time.Time     `json:"from"`
	Minutes  int           `json:"minutes"`
	By       By            `json:"by"`
	Entries  int           `json:"entries"` // entries counted (paused and removed excluded)
	Skipped  []string      `json:"skipped,omitempty"`
	Total    int64         `json:"total"`
	Max      int64         `json:"max"` // the largest per-minute total
	Groups   []Group       `json:"groups"`
	Totals   []int64       `json:"totals"` // all groups, per minute
	Peaks    []Peak        `json:"peaks"`
	Computed time.Duration `json:"-"`
}

// point is the fires of one schedule in one minute.
type point struct {
	min int32
	n   int32
	sec int8 // second of the first fire in the minute
}

// unit is one computed series and the entries that share it.
type unit struct {
	cron, tz string
	jitter   bool
	jittered int
	entries  []*contract.Entry
	points   []point
	total    int64
}

// Compute forecasts the fires of entries. Paused, removed and ended
// entries are left out, and so are limited entries with no fires left; an
// entry whose schedule does not build is listed in Skipped. A limited entry
// counts no more ticks than its fires left.
func Compute(entries []contract.Entry, p Params) *Forecast {
	return ComputeSeq(func(yield func(*contract.Entry) bool) {
		for i := range entries {
			if !yield(&entries[i]) {
				return
			}
		}
	}, p)
}

// ComputeSeq is Compute over entries it reads in place (a projection's
// snapshot), which must not change until it returns.
func ComputeSeq(entries iter.Seq[*contract.Entry], p Params) *Forecast {
	start := time.Now()
	from := cmp.Or(p.From, start).UTC().Truncate(time.Minute)
	window := min(cmp.Or(p.Window, 24*time.Hour), MaxWindow)
	minutes := int((window + time.Minute - 1) / time.Minute)
	by := cmp.Or(p.By, ByQueue)
	f := &Forecast{From: from, Minutes: minutes, By: by}

	shared := map[string]*unit{}
	walks := map[walkKey][]tickMinute{}
	acc := newAccumulator(from, minutes)
	var units []*unit
	for e := range entries {
		if e.Paused || e.Removed || e.Ended(from) {
			continue // fires nothing, so not one of the entries counted
		}
		left := -1 // no limit
		if e.Limited() {
			left = e.MaxFires
			if n, ok := p.Remaining[e.ID]; ok {
				left = n
			}
			if left <= 0 {
				continue // completed: it fires nothing more
			}
		}
		k, shareable := shareKey(*e)
		if shareable {
			if u, ok := shared[k]; ok {
				u.entries = append(u.entries, e)
				if u.jitter {
					u.jittered++
				}
				f.Entries++
				continue
			}
		}
		pts, err := series(*e, from, minutes, walks, acc, left)
		if err != nil {
			f.Skipped = append(f.Skipped, e.ID)
			continue
		}
		u := &unit{cron: e.Cron, tz: e.Timezone, jitter: e.Jitter > 0, entries: []*contract.Entry{e}, points: pts}
		if u.jitter {
			u.jittered = 1
		}
		for _, pt := range pts {
			u.total += int64(pt.n)
		}
		if shareable {
			shared[k] = u
		}
		units = append(units, u)
		f.Entries++
	}

	f.Totals = make([]int64, minutes)
	for _, u := range units {
		k := int64(len(u.entries))
		for _, pt := range u.points {
			f.Totals[pt.min] += int64(pt.n) * k
		}
		f.Total += u.total * k
	}
	f.Max = slices.Max(append([]int64{0}, f.Totals...))
	f.Groups = groups(units, by, minutes, cmp.Or(p.MaxGroups, 12))
	f.Peaks = peaks(units, f.Totals, from, cmp.Or(p.MaxPeaks, 3))
	f.Computed = time.Since(start)
	return f
}

// shareKey says which entries have the same series: those without jitter
// with the same spec and zone, and those with the same spec, zone and
// jitter when it fires more than once a minute (its jitter is a mean shift,
// the same for every entry).
func shareKey(e contract.Entry) (string, bool) {
	if bounded(e) {
		return "", false // its window and exclusions are its own
	}
	if e.Jitter <= 0 {
		return e.Cron + "\x00" + e.Timezone, true
	}
	if every, ok := strings.CutPrefix(e.Cron, "@every "); ok {
		if d, err := time.ParseDuration(every); err == nil && d < time.Minute {
			return e.Cron + "\x00" + e.Timezone + "\x00" + e.Jitter.String(), true
		}
	}
	return "", false
}

// series computes the fires of one entry per minute over [from,
// from+minutes), at most left of them (negative: no limit). walks holds
// the minute walks already done, by spec, zone and jitter: entries that
// differ only in id (and so in their jitter offsets) walk their schedule
// once.
func series(e contract.Entry, from time.Time, minutes int, walks map[walkKey][]tickMinute, acc *accumulator, left int) ([]point, error) {
	s, err := schedule.NewSchedule(e)
	if err != nil {
		return nil, err
	}
	jitter := e.Jitter.D().Truncate(time.Second)
	// meanShift is what a steady rate moves by under jitter.
	meanShift := int64(0)
	if jitter > 0 {
		meanShift = int64(jitter/time.Second-1) / 2
	}
	if bounded(e) {
		return boundedSeries(e, s, from, minutes, acc, left), nil
	}
	if every, ok := strings.CutPrefix(e.Cron, "@every "); ok {
		d, _ := time.ParseDuration(every) // NewSchedule checked it
		step := int64(d / time.Second)
		if step < 60 {
			return everySubMinute(step, from.Unix()-meanShift, minutes), nil
		}
	}
	end := from.Add(time.Duration(minutes) * time.Minute)
	key := walkKey{e.Cron, e.Timezone, jitter}
	walk, ok := walks[key]
	if !ok {
		walk = walkMinutes(e, s, from.Add(-jitter-time.Second), end)
		walks[key] = walk
	}
	acc.reset()
	jit := newJitterer(e.ID, jitter)
	for _, tm := range walk {
		if tm.n > 1 && jitter > 0 {
			// Several ticks in this minute: shift them by the mean offset.
			m := tm.unix - tm.unix%60
			for i, sec := 0, int(tm.unix%60); i < int(tm.n); i, sec = i+1, nextBit(tm.mask, sec) {
				acc.add(m+int64(sec)+meanShift, 1)
			}
			continue
		}
		acc.add(tm.unix+jit.offset(tm.unix), tm.n)
	}
	return acc.points(), nil
}

// bounded reports whether e has an active window, exclusions or a fire
// limit, which the shortcuts (arithmetic for @every, walks shared by spec)
// do not know.
func bounded(e contract.Entry) bool {
	return !e.StartAt.IsZero() || !e.EndAt.IsZero() || len(e.Exclude) > 0 || e.Limited()
}

// boundedSeries counts the ticks that fire one by one, with the
// scheduler's own NextFire (window and exclusions applied), at most left
// of them (negative: no limit).
func boundedSeries(e contract.Entry, s *schedule.Schedule, from time.Time, minutes int, acc *accumulator, left int) []point {
	jitter := e.Jitter.D().Truncate(time.Second)
	end := from.Add(time.Duration(minutes) * time.Minute)
	acc.reset()
	jit := newJitterer(e.ID, jitter)
	for t := s.NextFire(from.Add(-jitter - time.Second)); !t.IsZero() && t.Before(end) && left != 0; t = s.NextFire(t) {
		acc.add(t.Unix()+jit.offset(t.Unix()), 1)
		left--
	}
	return acc.points()
}

// accumulator collects one entry's fires by minute: sparse while few,
// dense (one counter a minute, reused from entry to entry) once many, so a
// busy entry costs no sorting and no allocation but its result.
type accumulator struct {
	from    int64 // Unix seconds
	minutes int
	sparse  []point
	isDense bool
	dense   []int32
	secs    []int8
	touched []int32 // the dense minutes counted, to clear them
}

func newAccumulator(from time.Time, minutes int) *accumulator {
	return &accumulator{from: from.Unix(), minutes: minutes}
}

func (a *accumulator) reset() {
	a.sparse = a.sparse[:0]
	for _, m := range a.touched {
		a.dense[m] = 0
	}
	a.touched = a.touched[:0]
	a.isDense = false
}

// add counts n fires at Unix second at, when it falls in the window.
func (a *accumulator) add(at int64, n int32) {
	off := at - a.from
	if off < 0 || off >= int64(a.minutes)*60 {
		return
	}
	m := int32(off / 60)
	if !a.isDense && len(a.sparse) >= 64 {
		if a.dense == nil {
			a.dense, a.secs = make([]int32, a.minutes), make([]int8, a.minutes)
		}
		a.isDense = true
		for _, p := range a.sparse {
			a.addDense(p.min, p.n, p.sec)
		}
	}
	if a.isDense {
		a.addDense(m, n, int8(off%60))
		return
	}
	a.sparse = append(a.sparse, point{min: m, n: n, sec: int8(off % 60)})
}

func (a *accumulator) addDense(m, n int32, sec int8) {
	if a.dense[m] == 0 {
		a.secs[m] = sec
		a.touched = append(a.touched, m)
	}
	a.dense[m] += n
}

// points returns the fires per minute, in minute order.
func (a *accumulator) points() []point {
	if !a.isDense {
		slices.SortStableFunc(a.sparse, func(x, y point) int { return cmp.Compare(x.min, y.min) })
		return slices.Clone(mergePoints(a.sparse))
	}
	out := make([]point, 0, len(a.touched))
	if len(a.touched) > a.minutes/16 {
		for m, n := range a.dense { // a scan costs less than a sort here
			if n > 0 {
				out = append(out, point{min: int32(m), n: n, sec: a.secs[m]})
			}
		}
		return out
	}
	slices.Sort(a.touched)
	for _, m := range a.touched {
		out = append(out, point{min: m, n: a.dense[m], sec: a.secs[m]})
	}
	return out
}

// jitterer is schedule.Schedule.Jitter for many ticks of one entry: the
// FNV-1a hash of the entry id is computed once and only the tick's eight
// bytes are hashed for each tick. TestJittererMatchesScheduler holds it
// to the scheduler's.
type jitterer struct {
	seed uint64
	secs uint64
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func newJitterer(id string, jitter time.Duration) jitterer {
	h := uint64(fnvOffset)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= fnvPrime
	}
	return jitterer{seed: h, secs: uint64(max(jitter/time.Second, 0))}
}

// offset returns the delay in seconds of the tick at Unix second tick.
func (j jitterer) offset(tick int64) int64 {
	if j.secs == 0 {
		return 0
	}
	h := j.seed
	for shift := 56; shift >= 0; shift -= 8 {
		h ^= uint64(byte(uint64(tick) >> uint(shift)))
		h *= fnvPrime
	}
	return int64(h % j.secs)
}

// walkKey identifies a minute walk.
type walkKey struct {
	cron, tz string
	jitter   time.Duration
}

// tickMinute is a minute that holds ticks: its first tick, how many there
// are, and the spec's seconds (to find the others).
type tickMinute struct {
	unix int64 // Unix second of the first tick
	n    int32
	mask uint64
}

// walkMinutes steps through the minutes in [after, end) that hold a tick of
// s, with the scheduler's own Next, counting each minute's ticks from the
// spec's seconds field.
func walkMinutes(e contract.Entry, s *schedule.Schedule, after, end time.Time) []tickMinute {
	secMask := uint64(1) // @every and constant schedules: one tick per step
	if spec, err := contract.ParseCron(e.Cron, nil); err == nil {
		switch sp := spec.(type) {
		case *cron.SpecSchedule:
			secMask = sp.Second &^ (1 << 63)
		case *contract.CalendarSchedule:
			secMask = sp.Second &^ (1 << 63)
		}
	}
	var out []tickMinute
	for t := s.Next(after); !t.IsZero() && t.Before(end); {
		n := int32(1)
		if sec := t.Second(); secMask != 1 && matchesSecond(secMask, sec) {
			n = int32(bits.OnesCount64(secMask >> uint(sec)))
		}
		out = append(out, tickMinute{unix: t.Unix(), n: n, mask: secMask})
		// The next minute that holds a tick.
		t = s.Next(t.Truncate(time.Minute).Add(59 * time.Second))
	}
	return out
}

func matchesSecond(mask uint64, sec int) bool { return mask&(1<<uint(sec)) != 0 }

// nextBit returns the next second after sec set in mask (64 when none).
func nextBit(mask uint64, sec int) int {
	rest := mask >> uint(sec+1)
	if rest == 0 {
		return 64
	}
	return sec + 1 + bits.TrailingZeros64(rest)
}

func mergePoints(pts []point) []point {
	out := pts[:0]
	for _, p := range pts {
		if len(out) > 0 && out[len(out)-1].min == p.min {
			out[len(out)-1].n += p.n
			continue
		}
		out = append(out, p)
	}
	return out
}

// everySubMinute counts the multiples of step (seconds) in each minute of
// the window that starts at Unix second start.
func everySubMinute(step, start int64, minutes int) []point {
	pts := make([]point, 0, minutes)
	// multiples in [0, x) for x > 0, floor-safe for negative x.
	below := func(x int64) int64 { return floorDiv(x-1, step) }
	for i := range minutes {
		lo := start + int64(i)*60
		n := below(lo+60) - below(lo)
		if n > 0 {
			sec := int8((step - mod(lo, step)) % step)
			pts = append(pts, point{min: int32(i), n: int32(n), sec: sec})
		}
	}
	return pts
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func mod(a, b int64) int64 { return a - floorDiv(a, b)*b }

// groups sums the units by queue or entry; the largest MaxGroups keep their
// own series.
func groups(units []*unit, by By, minutes, maxGroups int) []Group {
	type acc struct {
		name  string
		total int64
		parts []*unit // with the multiplicity of this group
		mult  []int64
	}
	accs := map[string]*acc{}
	get := func(name string) *acc {
		a, ok := accs[name]
		if !ok {
			a = &acc{name: name}
			accs[name] = a
		}
		return a
	}
	for _, u := range units {
		if by == ByEntry {
			for _, e := range u.entries {
				a := get(e.ID)
				a.parts, a.mult = append(a.parts, u), append(a.mult, 1)
				a.total += u.total
			}
			continue
		}
		counts := map[string]int64{}
		for _, e := range u.entries {
			counts[e.Options.QueueName()]++
		}
		for q, k := range counts {
			a := get(q)
			a.parts, a.mult = append(a.parts, u), append(a.mult, k)
			a.total += u.total * k
		}
	}
	all := make([]*acc, 0, len(accs))
	for _, a := range accs {
		all = append(all, a)
	}
	slices.SortFunc(all, func(a, b *acc) int {
		return cmp.Or(cmp.Compare(b.total, a.total), strings.Compare(a.name, b.name))
	})
	var out []Group
	var other *Group
	for i, a := range all {
		g := &Group{Name: a.name}
		if i >= maxGroups {
			if other == nil {
				other = &Group{Name: OtherGroup, Counts: make([]int64, minutes)}
			}
			g = other
		} else {
			g.Counts = make([]int64, minutes)
		}
		for j, u := range a.parts {
			for _, pt := range u.points {
				g.Counts[pt.min] += int64(pt.n) * a.mult[j]
			}
		}
		g.Total += a.total
		if i < maxGroups {
			out = append(out, *g)
		}
	}
	if other != nil {
		out = append(out, *other)
	}
	return out
}

// peaks picks the minutes that stand out most above the median minute (by
// at least two fires and a tenth of the median), ten minutes apart, and the
// schedules behind them. The median is the schedule's steady load: an
// "@every 1s" entry raises every minute alike and hides no peak.
func peaks(units []*unit, totals []int64, from time.Time, maxPeaks int) []Peak {
	sorted := slices.Clone(totals)
	slices.Sort(sorted)
	median := sorted[len(sorted)/2]
	idx := make([]int, len(totals))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(totals[b], totals[a]) })
	var picked []int
	for _, i := range idx {
		excess := totals[i] - median
		if len(picked) == maxPeaks || excess < 2 || excess < median/10 {
			break
		}
		near := false
		for _, j := range picked {
			if abs(i-j) < 10 {
				near = true
				break
			}
		}
		if !near {
			picked = append(picked, i)
		}
	}
	var out []Peak
	for _, i := range picked {
		pk := Peak{At: from.Add(time.Duration(i) * time.Minute), Fires: totals[i]}
		specs := map[string]*PeakSpec{}
		for _, u := range units {
			k, ok := slices.BinarySearchFunc(u.points, int32(i), func(p point, m int32) int { return cmp.Compare(p.min, m) })
			if !ok {
				continue
			}
			pt := u.points[k]
			key := fmt.Sprintf("%s\x00%s\x00%d", u.cron, u.tz, pt.sec)
			ps, ok := specs[key]
			if !ok {
				ps = &PeakSpec{Cron: u.cron, Timezone: u.tz, Second: int(pt.sec)}
				specs[key] = ps
			}
			ps.Entries += len(u.entries)
			ps.Fires += int64(pt.n) * int64(len(u.entries))
			ps.Jittered += u.jittered
			for _, e := range u.entries {
				if len(ps.Sample) == 5 {
					break
				}
				ps.Sample = append(ps.Sample, e.ID)
			}
			pk.Entries += len(u.entries)
		}
		for _, ps := range specs {
			pk.Specs = append(pk.Specs, *ps)
		}
		slices.SortFunc(pk.Specs, func(a, b PeakSpec) int {
			return cmp.Or(cmp.Compare(b.Fires, a.Fires), strings.Compare(a.Cron, b.Cron))
		})
		pk.Hint = hint(pk, pk.Fires-median, median, pk.At)
		out = append(out, pk)
	}
	return out
}

// hint suggests a jitter that would spread the unjittered entries behind a
// peak down to about the mean rate, never longer than the shortest gap
// between two fires of their spec (a longer jitter would push a tick past
// the next one), and nothing when that gap is under a minute (jitter then
// cannot move fires out of their minute for long).
func hint(pk Peak, excess, median int64, at time.Time) string {
	var example *PeakSpec
	for i := range pk.Specs {
		if pk.Specs[i].Entries-pk.Specs[i].Jittered >= 2 {
			example = &pk.Specs[i]
			break
		}
	}
	if example == nil {
		return ""
	}
	// Spread the excess so that it adds about a tenth of the steady load
	// to each minute: at least a minute, at most an hour.
	spread := time.Duration(excess/max(median/10, 1)) * time.Minute
	spread = min(max(spread, time.Minute), time.Hour).Round(time.Minute)
	if gap := specGap(example.Cron, example.Timezone, at); gap > 0 {
		if gap < time.Minute {
			return ""
		}
		spread = min(spread, gap.Truncate(time.Minute))
	}
	return fmt.Sprintf("%s entries of %q (e.g. %q) fire in this minute without jitter: jitter %s on them would spread it over %s",
		Thousands(int64(example.Entries-example.Jittered)), example.Cron, example.Sample[0], shortDuration(spread), shortDuration(spread))
}

// specGap is the shortest gap between two fires of spec in zone after at
// (schedule.Schedule.ShortestGap), 0 when unknown.
func specGap(spec, zone string, at time.Time) time.Duration {
	s, err := schedule.NewSchedule(contract.Entry{ID: "gap", Cron: spec, Timezone: zone})
	if err != nil {
		return 0
	}
	return s.ShortestGap(at.Add(-time.Second))
}

func shortDuration(d time.Duration) string {
	s := d.String()
	s = strings.TrimSuffix(s, "0s")
	return strings.TrimSuffix(s, "0m")
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// Describe is a one-line account of a peak spec: "12,400 entries fire at
// 00:00:00 UTC (cron 0 0 * * *)".
func (ps PeakSpec) Describe(at time.Time) string {
	t := at.Add(time.Duration(ps.Second) * time.Second)
	noun := "entries fire"
	if ps.Entries == 1 {
		noun = "entry fires"
	}
	return fmt.Sprintf("%s %s at %s UTC (%s%s)", Thousands(int64(ps.Entries)), noun, t.UTC().Format("15:04:05"), ps.Cron, tzSuffix(ps.Timezone))
}

func tzSuffix(tz string) string {
	if tz == "" || tz == "UTC" {
		return ""
	}
	return " in " + tz
}

// Thousands writes n with comma separators.
func Thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
