package contract

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Calendar cron: the day forms of Quartz and Spring's CronExpression that
// robfig/cron refuses — in the day-of-month field L (the last day), L-n (n
// days before the last day), LW (the last weekday) and nW (the weekday
// nearest day n, within the month); in the day-of-week field dL (the last
// weekday d of the month) and d#n (its n-th), and 7 for Sunday beside 0.
// A spec that uses none of them is parsed by robfig/cron exactly as
// before; one that uses any is a CalendarSchedule, whose seconds, minutes,
// hours and months robfig parses too, so those fields mean the same in
// both. Day-of-month and day-of-week combine as robfig combines them: when
// either is "*" or "?" a day must match both (so the other alone decides),
// otherwise either (Vixie cron's rule).
//
// An entry whose spec uses these forms is gated (Entry.Gated): replicas of
// builds without them would refuse the spec in validation anyway, and the
// gated type makes that refusal the documented one.

// CalendarSchedule is a parsed cron spec that uses calendar day forms. It
// is immutable once parsed, so parsed schedules are shared.
type CalendarSchedule struct {
	// Second, Minute, Hour and Month are robfig's bit masks, with its star
	// bit (1<<63) kept: a "*" hour is what the daylight-saving rules of the
	// scheduler look at.
	Second, Minute, Hour, Month uint64
	Location                    *time.Location
	dom                         domField
	dow                         dowField
}

// domField is a parsed day-of-month field.
type domField struct {
	days        uint64 // bit d: day d (1-31)
	star        bool   // "*" or "?": every day, and the day-of-week field alone decides
	last        bool   // L
	lastWeekday bool   // LW
	beforeLast  uint32 // bit n: L-n, n days before the last day (1-30)
	nearest     uint32 // bit n: nW, the weekday nearest day n (1-31)
}

// dowField is a parsed day-of-week field; days are time.Weekday values.
type dowField struct {
	days   uint8    // bit d: every weekday d
	star   bool     // "*" or "?"
	lastOf uint8    // bit d: dL, the last weekday d of the month
	nth    [7]uint8 // bit n of nth[d]: d#n, the n-th weekday d (1-5)
}

// calendarSearchYears bounds Next. The longest wait between two days that
// a calendar spec matches is 40 years (the fifth Monday of February needs
// a leap year whose February starts on a Monday: 2016, 2044, 2072, then,
// 2100 not being a leap year, 2112), so a spec with none in 50 years has
// none at all (TestCalendarLongestWait).
const calendarSearchYears = 50

// isCalendarSpec reports whether spec (with any CRON_TZ= prefix) uses a
// calendar day form, which robfig/cron would refuse: letters in the
// day-of-month field, L or # in the day-of-week field (no day name holds
// either), or 7 there as a day.
func isCalendarSpec(spec string) bool {
	dom, dow, ok := dayFields(spec)
	return ok && (strings.ContainsAny(dom, "LlWw") || strings.ContainsAny(dow, "Ll#") || hasSunday7(dow))
}

// dayFields returns the day-of-month and day-of-week fields of a five- or
// six-field spec.
func dayFields(spec string) (dom, dow string, ok bool) {
	_, rest := splitZone(spec)
	if strings.HasPrefix(rest, "@") {
		return "", "", false
	}
	f := strings.Fields(rest)
	if n := len(f); n == 5 || n == 6 {
		return f[n-3], f[n-1], true
	}
	return "", "", false
}

// splitZone splits a CRON_TZ= or TZ= prefix (with its space) off spec.
func splitZone(spec string) (prefix, rest string) {
	if strings.HasPrefix(spec, "CRON_TZ=") || strings.HasPrefix(spec, "TZ=") {
		if i := strings.IndexByte(spec, ' '); i >= 0 {
			return spec[:i+1], strings.TrimSpace(spec[i+1:])
		}
	}
	return "", spec
}

// hasSunday7 reports whether a day-of-week field names day 7 (a value or a
// range bound, not a step).
func hasSunday7(field string) bool {
	for _, el := range strings.Split(field, ",") {
		rng, _, _ := strings.Cut(el, "/")
		for _, v := range strings.Split(rng, "-") {
			if n, ok := digits(v); ok && n == 7 {
				return true
			}
		}
	}
	return false
}

// parseCalendar parses a calendar spec (isCalendarSpec), with its zone
// prefix, or in time.Local without one (as robfig/cron does; ParseCron
// always names the zone).
func parseCalendar(spec string) (*CalendarSchedule, error) {
	prefix, rest := splitZone(spec)
	f := strings.Fields(rest)
	n := len(f)
	dom, err := parseDom(f[n-3])
	if err != nil {
		return nil, fmt.Errorf("day of month: %w", err)
	}
	dow, err := parseDow(f[n-1])
	if err != nil {
		return nil, fmt.Errorf("day of week: %w", err)
	}
	// robfig parses the other fields, with every day, so that they mean
	// what they mean in any other spec.
	f[n-3], f[n-1] = "*", "*"
	parsed, err := cronParser.Parse(prefix + strings.Join(f, " "))
	if err != nil {
		return nil, err
	}
	sp, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("not a cron spec")
	}
	c := &CalendarSchedule{Second: sp.Second, Minute: sp.Minute, Hour: sp.Hour, Month: sp.Month, Location: sp.Location, dom: dom, dow: dow}
	if c.neverMatches() {
		return nil, fmt.Errorf("never fires (no matching date)")
	}
	return c, nil
}

// parseCalendarSchedule is parseCalendar as ParseCron returns it: a nil
// interface on an error.
func parseCalendarSchedule(spec string) (cron.Schedule, error) {
	c, err := parseCalendar(spec)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// parseDom parses a day-of-month field: a comma list of robfig's forms
// (*, ?, n, a-b, with /step) and L, L-n, LW, nW.
func parseDom(field string) (domField, error) {
	var d domField
	for _, el := range strings.Split(field, ",") {
		u := strings.ToUpper(el)
		switch {
		case u == "L":
			d.last = true
		case u == "LW":
			d.lastWeekday = true
		case strings.HasPrefix(u, "L-"):
			n, ok := digits(u[2:])
			if !ok || n < 1 || n > 30 {
				return d, fmt.Errorf("%q: L-n needs n from 1 to 30 (days before the last day)", el)
			}
			d.beforeLast |= 1 << n
		case strings.HasSuffix(u, "W") && len(u) > 1:
			n, ok := digits(u[:len(u)-1])
			if !ok || n < 1 || n > 31 {
				return d, fmt.Errorf("%q: nW needs a day n from 1 to 31", el)
			}
			d.nearest |= 1 << n
		case strings.ContainsAny(u, "LW"):
			return d, fmt.Errorf("%q: L and W are used as L, L-n, LW or nW (e.g. 15W)", el)
		default:
			mask, star, err := parseRange(el, 1, 31, 31, nil)
			if err != nil {
				return d, err
			}
			d.days |= mask
			d.star = d.star || star
		}
	}
	return d, nil
}

// parseDow parses a day-of-week field: a comma list of robfig's forms, with
// day names and 7 for Sunday, and dL, d#n.
func parseDow(field string) (dowField, error) {
	var d dowField
	for _, el := range strings.Split(field, ",") {
		u := strings.ToUpper(el)
		if i := strings.IndexByte(u, '#'); i >= 0 {
			day, err := weekday(u[:i])
			if err != nil {
				return d, fmt.Errorf("%q: %w", el, err)
			}
			n, ok := digits(u[i+1:])
			if !ok || n < 1 || n > 5 {
				return d, fmt.Errorf("%q: d#n needs n from 1 to 5 (the n-th weekday d of the month)", el)
			}
			d.nth[day] |= 1 << n
			continue
		}
		if strings.HasSuffix(u, "L") {
			if len(u) == 1 {
				return d, fmt.Errorf("%q: name the day before L (5L or FRIL is the last Friday of the month)", el)
			}
			day, err := weekday(u[:len(u)-1])
			if err != nil {
				return d, fmt.Errorf("%q: %w", el, err)
			}
			d.lastOf |= 1 << day
			continue
		}
		// Ranges may end at 7 (Sunday); "*" and "n/step" stop at 6, as in
		// robfig, so they mean the same days here as there.
		mask, star, err := parseRange(el, 0, 7, 6, dayNames)
		if err != nil {
			return d, err
		}
		if mask&(1<<7) != 0 {
			mask = mask&^(1<<7) | 1
		}
		d.days |= uint8(mask)
		d.star = d.star || star
	}
	return d, nil
}

var dayNames = map[string]int{"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}

// weekday parses the day before L or #: 0-7 (0 and 7 are Sunday) or a
// three-letter name.
func weekday(s string) (int, error) {
	if n, ok := dayNames[s]; ok {
		return n, nil
	}
	n, ok := digits(s)
	if !ok || n > 7 {
		return 0, fmt.Errorf("the day must be 0-7 (0 and 7 are Sunday) or SUN-SAT")
	}
	return n % 7, nil
}

// parseRange parses one of robfig's range forms — *, ?, n, a-b, each with
// an optional /step, n/step meaning n-implicitMax/step — into a bit mask,
// and reports a star ("*" or "?" with no step above 1), as robfig does.
// Values are decimal digits (or names, upper case) between min and max.
func parseRange(el string, min, max, implicitMax int, names map[string]int) (uint64, bool, error) {
	rng, stepText, hasStep := strings.Cut(el, "/")
	step := 1
	if hasStep {
		n, ok := digits(stepText)
		if !ok || n == 0 {
			return 0, false, fmt.Errorf("%q: the step must be a positive number", el)
		}
		step = n
	}
	value := func(s string) (int, error) {
		if n, ok := names[strings.ToUpper(s)]; ok {
			return n, nil
		}
		n, ok := digits(s)
		if !ok || n < min || n > max {
			return 0, fmt.Errorf("%q: %q is not a value from %d to %d", el, s, min, max)
		}
		return n, nil
	}
	var lo, hi int
	star := false
	if rng == "*" || rng == "?" {
		lo, hi, star = min, implicitMax, step <= 1
	} else {
		a, b, isRange := strings.Cut(rng, "-")
		var err error
		if lo, err = value(a); err != nil {
			return 0, false, err
		}
		hi = lo
		switch {
		case isRange:
			if hi, err = value(b); err != nil {
				return 0, false, err
			}
		case hasStep:
			hi = implicitMax
		}
		if lo > hi {
			return 0, false, fmt.Errorf("%q: the range starts after it ends", el)
		}
	}
	var mask uint64
	for v := lo; v <= hi; v += step {
		mask |= 1 << v
	}
	return mask, star, nil
}

// digits parses a non-empty string of at most four decimal digits.
func digits(s string) (int, bool) {
	if s == "" || len(s) > 4 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, _ := strconv.Atoi(s)
	return n, true
}

// daysIn is the number of days of month m of year y.
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// dayMask returns the days of month m of year y the spec's day fields
// match: bit d for day d.
func (c *CalendarSchedule) dayMask(y int, m time.Month) uint32 {
	n := daysIn(y, m)
	first := int(time.Date(y, m, 1, 0, 0, 0, 0, time.UTC).Weekday())
	wd := func(day int) int { return (first + day - 1) % 7 }
	dom := c.dom.mask(n, wd)
	var dow uint32
	for day := 1; day <= n; day++ {
		w := wd(day)
		if c.dow.days&(1<<w) != 0 || (c.dow.lastOf&(1<<w) != 0 && day > n-7) || c.dow.nth[w]&(1<<((day-1)/7+1)) != 0 {
			dow |= 1 << day
		}
	}
	if c.dom.star || c.dow.star {
		return dom & dow
	}
	return dom | dow
}

// mask is the day-of-month field's days in a month of n days whose day d
// falls on weekday wd(d).
func (d domField) mask(n int, wd func(int) int) uint32 {
	all := uint32(1)<<(n+1) - 2 // days 1..n
	m := uint32(d.days) & all
	if d.star {
		m = all
	}
	if d.last {
		m |= 1 << n
	}
	for k := 1; k <= 30; k++ {
		if d.beforeLast&(1<<k) != 0 && n-k >= 1 {
			m |= 1 << (n - k)
		}
	}
	if d.lastWeekday {
		m |= 1 << nearestWeekday(n, n, wd)
	}
	for k := 1; k <= n; k++ {
		if d.nearest&(1<<k) != 0 {
			m |= 1 << nearestWeekday(k, n, wd)
		}
	}
	return m
}

// nearestWeekday is the Monday-to-Friday day nearest day k of a month of n
// days, never outside the month: a Saturday moves to the Friday before
// (the 1st to Monday the 3rd), a Sunday to the Monday after (the last day
// to Friday the day before yesterday).
func nearestWeekday(k, n int, wd func(int) int) int {
	switch wd(k) {
	case int(time.Saturday):
		if k == 1 {
			return 3
		}
		return k - 1
	case int(time.Sunday):
		if k == n {
			return k - 2
		}
		return k + 1
	}
	return k
}

// neverMatches reports whether no date matches the spec's month and day
// fields. Weekdays repeat every 400 years of the Gregorian calendar, so
// 400 years from any year say it for all time: unlike a check from the
// current time, the answer never changes.
func (c *CalendarSchedule) neverMatches() bool {
	for y := 2000; y < 2400; y++ {
		for m := time.January; m <= time.December; m++ {
			if c.Month&(1<<m) != 0 && c.dayMask(y, m) != 0 {
				return false
			}
		}
	}
	return true
}

// MatchesWall reports whether the wall-clock time w (its fields read as
// they are, whatever its zone) matches the spec.
func (c *CalendarSchedule) MatchesWall(w time.Time) bool {
	y, m, d := w.Date()
	h, mi, s := w.Clock()
	return c.Second&(1<<s) != 0 && c.Minute&(1<<mi) != 0 && c.Hour&(1<<h) != 0 && c.Month&(1<<m) != 0 &&
		c.dayMask(y, m)&(1<<d) != 0
}

// Next returns the first instant after t, in whole seconds, whose wall
// clock in the spec's zone matches, in its zone; the zero time when there
// is none within calendarSearchYears. A wall time that a daylight-saving
// change skips never matches, one it repeats matches twice: the scheduler
// applies its daylight-saving rules on top, as it does to robfig's Next.
//
// It walks instants, not wall times: within one period of constant zone
// offset the wall clock moves with the instant, so from a wall time that
// does not match it jumps straight to the next wall time that could,
// stopping at the period's end, where the offset changes, to look again.
func (c *CalendarSchedule) Next(t time.Time) time.Time {
	u := t.Add(time.Second - time.Duration(t.Nanosecond())).In(c.Location)
	limit := u.Year() + calendarSearchYears
	for u.Year() <= limit {
		target, ok := c.nextWall(u)
		if ok {
			return u
		}
		y, m, d := u.Date()
		h, mi, s := u.Clock()
		next := u.Add(target.Sub(time.Date(y, m, d, h, mi, s, 0, time.UTC)))
		if end := ZonePeriodEnd(u); !end.IsZero() && next.After(end) {
			next = end
		}
		u = next.In(c.Location)
	}
	return time.Time{}
}

// nextWall returns true when u's wall clock matches; otherwise the next
// wall time (as a UTC time with the wall clock's fields) that could match,
// found field by field from the month down.
func (c *CalendarSchedule) nextWall(u time.Time) (time.Time, bool) {
	y, m, d := u.Date()
	h, mi, s := u.Clock()
	at := func(y int, m time.Month, d, h, mi, s int) time.Time { return time.Date(y, m, d, h, mi, s, 0, time.UTC) }
	if c.Month&(1<<m) == 0 {
		for next := m + 1; next <= time.December; next++ {
			if c.Month&(1<<next) != 0 {
				return at(y, next, 1, 0, 0, 0), false
			}
		}
		return at(y+1, time.January, 1, 0, 0, 0), false
	}
	if days := c.dayMask(y, m); days&(1<<d) == 0 {
		if later := days >> (d + 1); later != 0 {
			return at(y, m, d+1+bits.TrailingZeros32(later), 0, 0, 0), false
		}
		return at(y, m+1, 1, 0, 0, 0), false
	}
	if c.Hour&(1<<h) == 0 {
		if n, ok := nextSet(c.Hour, h, 23); ok {
			return at(y, m, d, n, 0, 0), false
		}
		return at(y, m, d+1, 0, 0, 0), false
	}
	if c.Minute&(1<<mi) == 0 {
		if n, ok := nextSet(c.Minute, mi, 59); ok {
			return at(y, m, d, h, n, 0), false
		}
		return at(y, m, d, h+1, 0, 0), false
	}
	if c.Second&(1<<s) == 0 {
		if n, ok := nextSet(c.Second, s, 59); ok {
			return at(y, m, d, h, mi, n), false
		}
		return at(y, m, d, h, mi+1, 0), false
	}
	return time.Time{}, true
}

// nextSet returns the first value after v, up to max, set in mask.
func nextSet(mask uint64, v, max int) (int, bool) {
	for n := v + 1; n <= max; n++ {
		if mask&(1<<n) != 0 {
			return n, true
		}
	}
	return 0, false
}

// ZonePeriodEnd is the end of the period of constant zone offset holding t
// (t.ZoneBounds), the zero time when the offset never changes again. Past
// the last year its zone's table lists (2037), Go computes the periods
// from the zone's rule and ends the last one of a leap year a day early,
// before t itself; there the offset holds until the next UTC midnight,
// which is returned instead, so a caller walking periods always moves on.
func ZonePeriodEnd(t time.Time) time.Time {
	_, end := t.ZoneBounds()
	if !end.IsZero() && !end.After(t) {
		return t.Truncate(24 * time.Hour).Add(24 * time.Hour)
	}
	return end
}
