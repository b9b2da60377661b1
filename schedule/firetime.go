package schedule

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math/bits"
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/cronstream/cronstream/contract"
)

// Schedule computes the ticks of one entry. Every replica computes the same
// instants from the same entry, whenever it started:
//
//   - Cron specs are evaluated in the entry's timezone (or the spec's
//     CRON_TZ=), to the second.
//   - "@every D" ticks at the multiples of D since the Unix epoch, not D
//     after the process started, so replicas agree.
//   - Daylight saving, for specs with a fixed hour (hour field not "*"),
//     follows Vixie cron, which is what "daily at 02:30" means to people:
//     a wall-clock time that is skipped when clocks spring forward fires
//     once, at the instant the gap ends (02:30 in a 02:00→03:00 gap fires at
//     03:00); a wall-clock time that occurs twice when clocks fall back fires
//     once, at its first occurrence. Specs with "*" in the hour field tick on
//     every real instant that matches, so an hourly or every-15-minutes job
//     keeps its rhythm through both changes.
//
// Calendar specs (L, W and # in the day fields: contract.CalendarSchedule)
// follow the same rules.
type Schedule struct {
	spec   *cron.SpecSchedule // nil for @every, other constant schedules and calendar specs
	cal    *contract.CalendarSchedule
	sched  cron.Schedule
	every  time.Duration
	loc    *time.Location
	jitter time.Duration
	entry  string
	// The entry's active window (zero: unbounded) and exclusions, from
	// contract so that every reader of Next agrees on them.
	start, end time.Time
	exclude    contract.Exclusions
}

// NewSchedule builds the schedule of e. The entry must have passed
// validation; an error here means it did not.
func NewSchedule(e contract.Entry) (*Schedule, error) {
	loc, err := e.Location()
	if err != nil {
		return nil, err
	}
	s := &Schedule{loc: loc, jitter: e.Jitter.D(), entry: e.ID, start: e.StartAt, end: e.EndAt}
	if s.exclude, err = e.Exclusions(); err != nil {
		return nil, fmt.Errorf("entry %q: %w", e.ID, err)
	}
	if every, ok := strings.CutPrefix(e.Cron, "@every "); ok {
		d, err := time.ParseDuration(every)
		if err != nil || d < time.Second {
			return nil, fmt.Errorf("entry %q: bad @every %q", e.ID, every)
		}
		s.every = d.Truncate(time.Second)
		return s, nil
	}
	sched, err := contract.ParseCron(e.Cron, loc)
	if err != nil {
		return nil, fmt.Errorf("entry %q: cron %q: %w", e.ID, e.Cron, err)
	}
	s.sched = sched
	switch sp := sched.(type) {
	case *cron.SpecSchedule:
		s.spec, s.loc = sp, sp.Location
	case *contract.CalendarSchedule:
		s.cal, s.loc = sp, sp.Location
	}
	return s, nil
}

// Next returns the first tick strictly after t within the entry's active
// window, or the zero time when there is none. Excluded ticks are ticks:
// the scheduler records them as skipped (NextFire passes over them).
func (s *Schedule) Next(t time.Time) time.Time {
	if !s.start.IsZero() && t.Before(s.start) {
		// Ticks are whole seconds: the first one at or after start.
		t = s.start.Add(-time.Nanosecond)
	}
	next := s.nextTick(t)
	if !s.end.IsZero() && next.After(s.end) {
		return time.Time{}
	}
	return next
}

// maxExcludedRun bounds how many excluded ticks in a row NextFire passes
// over before it gives up (an exclusion that covers every tick).
const maxExcludedRun = 100_000

// NextFire is Next passing over excluded ticks: the first tick after t
// that would fire.
func (s *Schedule) NextFire(t time.Time) time.Time {
	for range maxExcludedRun {
		t = s.Next(t)
		if t.IsZero() || !s.Excluded(t) {
			return t
		}
	}
	return time.Time{}
}

// Excluded reports whether tick matches one of the entry's exclude specs.
func (s *Schedule) Excluded(tick time.Time) bool { return s.exclude.Match(tick) }

// nextTick is the spec's first tick strictly after t.
func (s *Schedule) nextTick(t time.Time) time.Time {
	if s.every > 0 {
		step := int64(s.every / time.Second)
		sec := t.Unix()
		// Floor division, so instants before the epoch align too.
		q := sec / step
		if sec%step != 0 && sec < 0 {
			q--
		}
		return time.Unix((q+1)*step, 0).UTC()
	}
	if next, ok := lastSpecTick.get(s, t); ok {
		return next
	}
	var next time.Time
	if !s.fixedHour() {
		next = s.utc(s.sched.Next(t))
	} else {
		next = s.nextFixedHour(t)
	}
	lastSpecTick.put(s, t, next)
	return next
}

// lastSpecTick is the last tick computed for a cron or calendar spec. The
// entries with one spec and zone share its parsed form (contract.ParseCron
// caches it), and those due at one instant ask for the tick after the
// same instant one after another: thousands of times in a burst, or every
// minute for entries "* * * * *". A spec's next tick costs microseconds
// (robfig's search field by field, then the daylight-saving checks), the
// lookup a lock.
var lastSpecTick specTickMemo

type specTickMemo struct {
	mu   sync.Mutex
	spec *cron.SpecSchedule
	cal  *contract.CalendarSchedule
	// next is the tick after t.
	t, next time.Time
}

func (m *specTickMemo) get(s *Schedule, t time.Time) (time.Time, bool) {
	if s.spec == nil && s.cal == nil {
		return time.Time{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.spec != s.spec || m.cal != s.cal || !m.t.Equal(t) {
		return time.Time{}, false
	}
	return m.next, true
}

func (m *specTickMemo) put(s *Schedule, t, next time.Time) {
	if s.spec == nil && s.cal == nil {
		return
	}
	m.mu.Lock()
	m.spec, m.cal, m.t, m.next = s.spec, s.cal, t, next
	m.mu.Unlock()
}

// fixedHour reports whether the spec's hour field is not "*": the
// daylight-saving rules of Vixie cron apply to it.
func (s *Schedule) fixedHour() bool {
	switch {
	case s.spec != nil:
		return s.spec.Hour&starBit == 0
	case s.cal != nil:
		return s.cal.Hour&starBit == 0
	}
	return false
}

const starBit = 1 << 63

// calendarZoneChanges bounds the zone changes gapTick looks through for a
// calendar spec: two a year over the fifty years its Next searches.
const calendarZoneChanges = 104

// nextFixedHour applies the Vixie cron daylight-saving rules on top of
// the spec's Next (robfig's, or a calendar spec's), which skips gap times
// and repeats fall-back times.
func (s *Schedule) nextFixedHour(t time.Time) time.Time {
	for i := 0; i < 4; i++ {
		// A gap between t and robfig's answer may hold a skipped wall time.
		next := s.sched.Next(t)
		if g, ok := s.gapTick(t, next); ok {
			return g
		}
		if next.IsZero() {
			return time.Time{}
		}
		if s.repeatsWallClock(next) {
			t = next
			continue
		}
		return s.utc(next)
	}
	return time.Time{}
}

// gapTick returns the end of a spring-forward gap that lies in (t, next]
// (or after t when next is zero) if the spec matches a wall-clock time the
// gap skipped.
func (s *Schedule) gapTick(t, next time.Time) (time.Time, bool) {
	lt := t.In(s.loc)
	changes := 3 // robfig's specs: at most a few zone changes before next
	if s.cal != nil {
		// A calendar spec can name the day of a change itself ("30 2 ? 3
		// 0#5" in Europe/Berlin: only in the gap, some years apart), so
		// its next real instant may be years away, or none.
		changes = calendarZoneChanges
	}
	for range changes {
		end := contract.ZonePeriodEnd(lt)
		if end.IsZero() || (!next.IsZero() && end.After(next)) {
			return time.Time{}, false
		}
		_, offBefore := end.Add(-time.Second).Zone()
		_, offAfter := end.Zone()
		if jump := time.Duration(offAfter-offBefore) * time.Second; jump > 0 && end.After(t) {
			// Wall times [end-in-old-offset, +jump) never happened.
			wallStart := end.Add(-time.Second).In(time.FixedZone("", offBefore)).Add(time.Second)
			for w := wallStart; w.Before(wallStart.Add(jump)); w = w.Add(time.Second) {
				if s.matchesWall(w) {
					return end.UTC(), true
				}
			}
		}
		lt = end.In(s.loc)
	}
	return time.Time{}, false
}

// repeatsWallClock reports whether tick shows the same wall-clock time as
// the instant one zone-offset change earlier: the second run of a fall-back
// hour.
func (s *Schedule) repeatsWallClock(tick time.Time) bool {
	lt := tick.In(s.loc)
	start, _ := lt.ZoneBounds()
	if start.IsZero() {
		return false
	}
	_, offNow := lt.Zone()
	_, offBefore := start.Add(-time.Second).Zone()
	back := time.Duration(offBefore-offNow) * time.Second
	if back <= 0 || tick.Sub(start) >= back {
		return false
	}
	// The same wall time existed back seconds earlier, in the old offset.
	return true
}

// matchesWall reports whether the spec matches wall-clock time w (fields
// read off w as it is, whatever its zone).
func (s *Schedule) matchesWall(w time.Time) bool {
	if s.cal != nil {
		return s.cal.MatchesWall(w)
	}
	sp := s.spec
	bit := func(mask uint64, v int) bool { return mask&(1<<uint(v)) != 0 }
	if !bit(sp.Second, w.Second()) || !bit(sp.Minute, w.Minute()) || !bit(sp.Hour, w.Hour()) || !bit(sp.Month, int(w.Month())) {
		return false
	}
	dom, dow := bit(sp.Dom, w.Day()), bit(sp.Dow, int(w.Weekday()))
	if sp.Dom&starBit != 0 || sp.Dow&starBit != 0 {
		return dom && dow
	}
	return dom || dow
}

func (s *Schedule) utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

// Every is the interval of an @every spec, 0 for any other.
func (s *Schedule) Every() time.Duration { return s.every }

// EndAt is the end of the entry's active window (zero: none).
func (s *Schedule) EndAt() time.Time { return s.end }

// MinGap is a lower bound on the time between two consecutive ticks, read
// from the spec alone (ShortestGap walks the ticks instead): the @every
// interval; a minute when the seconds field holds one value (two ticks
// then lie in different minutes); else a second.
func (s *Schedule) MinGap() time.Duration {
	switch {
	case s.every > 0:
		return s.every
	case s.spec != nil && oneValue(s.spec.Second), s.cal != nil && oneValue(s.cal.Second):
		return time.Minute
	}
	return time.Second
}

// oneValue reports whether a robfig field mask allows a single value.
func oneValue(mask uint64) bool {
	const star = 1 << 63
	return mask&star == 0 && bits.OnesCount64(mask) == 1
}

// MaxJitter is the entry's jitter: every tick's delay (Jitter) is shorter.
func (s *Schedule) MaxJitter() time.Duration { return s.jitter }

// Jitter returns the delay added to tick: a deterministic offset in
// [0, jitter), whole seconds, from a hash of entry id and tick, so every
// replica delays a tick by the same amount and ticks of one entry spread.
func (s *Schedule) Jitter(tick time.Time) time.Duration {
	secs := int64(s.jitter / time.Second)
	if secs <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(s.entry))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(tick.Unix()))
	h.Write(b[:])
	return time.Duration(h.Sum64()%uint64(secs)) * time.Second
}

// Ticks returns the ticks in (after, until] that would fire (excluded ones
// left out), oldest first, at most max of them (max ≤ 0: no bound); more
// reports whether ticks were left out.
func (s *Schedule) Ticks(after, until time.Time, max int) (ticks []time.Time, more bool) {
	for t := s.NextFire(after); !t.IsZero() && !t.After(until); t = s.NextFire(t) {
		if max > 0 && len(ticks) == max {
			return ticks, true
		}
		ticks = append(ticks, t)
	}
	return ticks, false
}

// gapHorizon bounds ShortestGap's walk: a year and a day holds every
// month length, both DST changes of any zone and a Feb 29 gap's neighbours.
const (
	gapHorizon  = 366 * 24 * time.Hour
	gapMaxTicks = 5000
)

// ShortestGap returns the shortest time between two consecutive fires
// after from (excluded ticks left out), looking a year ahead and at most
// gapMaxTicks fires, or 0 when fewer than two fall in that span. A jitter
// longer than it would push a tick past its successor's time; the forecast
// never suggests one and `entry put` warns about one.
func (s *Schedule) ShortestGap(from time.Time) time.Duration {
	if s.every > 0 && s.start.IsZero() && s.end.IsZero() && len(s.exclude) == 0 {
		return s.every
	}
	var shortest time.Duration
	prev := s.NextFire(from)
	for i := 0; i < gapMaxTicks && !prev.IsZero() && prev.Sub(from) < gapHorizon; i++ {
		next := s.NextFire(prev)
		if next.IsZero() {
			break
		}
		if d := next.Sub(prev); shortest == 0 || d < shortest {
			shortest = d
		}
		prev = next
	}
	return shortest
}

// Prev returns the last tick at or before t that is after floor, or the
// zero time when there is none. It walks forward from floor, so callers
// bound the walk with floor (a catch-up window).
func (s *Schedule) Prev(t, floor time.Time) time.Time {
	if s.every > 0 && s.start.IsZero() && s.end.IsZero() {
		step := int64(s.every / time.Second)
		q := t.Unix() / step
		if t.Unix()%step != 0 && t.Unix() < 0 {
			q--
		}
		p := time.Unix(q*step, 0).UTC()
		if !p.After(floor) {
			return time.Time{}
		}
		return p
	}
	var last time.Time
	for n := s.Next(floor); !n.IsZero() && !n.After(t); n = s.Next(n) {
		last = n
	}
	return last
}

// TaskID is the asynq task id of an entry's tick: readable in asynq's UI and
// the same on every replica, so a tick can only ever be one task.
func TaskID(prefix, entryID string, tick time.Time) string {
	return contract.TaskID(prefix, entryID, tick)
}

// TaskEntry reads the entry id back from a task id that cronstream wrote
// under prefix: a scheduled or backfilled tick (TaskID) or a trigger
// (<prefix>:<entry>:trigger:<request>). ok is false for any other id, such
// as tasks enqueued by asynq clients. Entry ids hold no ':', so the entry
// is the part up to the next one.
func TaskEntry(prefix, taskID string) (entry string, ok bool) {
	rest, found := strings.CutPrefix(taskID, prefix+":")
	if !found {
		return "", false
	}
	entry, tail, found := strings.Cut(rest, ":")
	if !found || entry == "" || tail == "" || contract.ValidateID(entry) != nil {
		return "", false
	}
	return entry, true
}
