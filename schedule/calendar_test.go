package schedule_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/firetest"
)

// The calendar tests compute every expected tick here, by walking dates
// and instants with package time, never with the code under test.

// dayRule says whether a date (a time at midnight UTC carrying the wall
// date) is one a day field names.
type dayRule func(d time.Time) bool

func inMonth(d time.Time, off int) (time.Time, bool) {
	x := d.AddDate(0, 0, off)
	return x, x.Month() == d.Month()
}

func isWeekday(d time.Time) bool { return d.Weekday() != time.Saturday && d.Weekday() != time.Sunday }

var (
	ruleLast = func(d time.Time) bool { _, same := inMonth(d, 1); return !same }
	// The last weekday: no Monday-to-Friday day follows it in the month.
	ruleLastWeekday = func(d time.Time) bool {
		if !isWeekday(d) {
			return false
		}
		for off := 1; ; off++ {
			x, same := inMonth(d, off)
			if !same {
				return true
			}
			if isWeekday(x) {
				return false
			}
		}
	}
)

// ruleBeforeLast: L-n, n days before the last day.
func ruleBeforeLast(n int) dayRule {
	return func(d time.Time) bool {
		x, same := inMonth(d, n)
		return same && ruleLast(x)
	}
}

// ruleNearest: nW, the Monday-to-Friday day of the month closest to day n
// (when the month has one).
func ruleNearest(n int) dayRule {
	return func(d time.Time) bool {
		target := time.Date(d.Year(), d.Month(), n, 0, 0, 0, 0, time.UTC)
		if target.Month() != d.Month() {
			return false
		}
		best, bestDist := 0, 99
		for x := time.Date(d.Year(), d.Month(), 1, 0, 0, 0, 0, time.UTC); x.Month() == d.Month(); x = x.AddDate(0, 0, 1) {
			dist := x.Day() - n
			if dist < 0 {
				dist = -dist
			}
			if isWeekday(x) && dist < bestDist {
				best, bestDist = x.Day(), dist
			}
		}
		return d.Day() == best
	}
}

// ruleLastOf: dL, the last weekday wd of the month.
func ruleLastOf(wd time.Weekday) dayRule {
	return func(d time.Time) bool {
		_, same := inMonth(d, 7)
		return d.Weekday() == wd && !same
	}
}

// ruleNth: d#n, counted from the first of the month.
func ruleNth(wd time.Weekday, n int) dayRule {
	return func(d time.Time) bool {
		count := 0
		for x := time.Date(d.Year(), d.Month(), 1, 0, 0, 0, 0, time.UTC); !x.After(d); x = x.AddDate(0, 0, 1) {
			if x.Weekday() == wd {
				count++
			}
		}
		return d.Weekday() == wd && count == n
	}
}

func ruleWeekdays(wds ...time.Weekday) dayRule {
	return func(d time.Time) bool { return slices.Contains(wds, d.Weekday()) }
}

func ruleDays(days ...int) dayRule {
	return func(d time.Time) bool { return slices.Contains(days, d.Day()) }
}

func ruleMonths(r dayRule, months ...time.Month) dayRule {
	return func(d time.Time) bool { return slices.Contains(months, d.Month()) && r(d) }
}

func anyOf(rules ...dayRule) dayRule {
	return func(d time.Time) bool {
		return slices.ContainsFunc(rules, func(r dayRule) bool { return r(d) })
	}
}

// calendarYears cover leap years (2000, 2024, 2028), a century year that
// is not one (2100), and every length of February.
var calendarYears = [][2]int{{1999, 2001}, {2023, 2030}, {2099, 2101}}

// TestCalendarEnumerated: each calendar form fires at 09:30:15 on exactly
// the dates its rule names, in every month of the years above.
func TestCalendarEnumerated(t *testing.T) {
	t.Parallel()
	cases := []struct {
		spec string
		rule dayRule
	}{
		{"15 30 9 L * *", ruleLast},
		{"15 30 9 L-1 * ?", ruleBeforeLast(1)},
		{"15 30 9 L-3 * *", ruleBeforeLast(3)},
		{"15 30 9 L-27 * *", ruleBeforeLast(27)},
		{"15 30 9 LW * *", ruleLastWeekday},
		{"15 30 9 1W * *", ruleNearest(1)},
		{"15 30 9 15W * *", ruleNearest(15)},
		{"15 30 9 28W * *", ruleNearest(28)},
		{"15 30 9 29W * *", ruleNearest(29)},
		{"15 30 9 30W * *", ruleNearest(30)},
		{"15 30 9 31W * *", ruleNearest(31)},
		{"15 30 9 ? * 5L", ruleLastOf(time.Friday)},
		{"15 30 9 ? * SUNL", ruleLastOf(time.Sunday)},
		{"15 30 9 * * 7L", ruleLastOf(time.Sunday)},
		{"15 30 9 ? * 1#1", ruleNth(time.Monday, 1)},
		{"15 30 9 ? * wed#3", ruleNth(time.Wednesday, 3)},
		{"15 30 9 ? * 0#5", ruleNth(time.Sunday, 5)},
		{"15 30 9 ? * 7#4,6#5", anyOf(ruleNth(time.Sunday, 4), ruleNth(time.Saturday, 5))},
		{"15 30 9 * * 5-7", ruleWeekdays(time.Friday, time.Saturday, time.Sunday)},
		// Lists, and both day fields restricted: either matches.
		{"15 30 9 1,15,L * *", anyOf(ruleDays(1, 15), ruleLast)},
		{"15 30 9 L * 5L", anyOf(ruleLast, ruleLastOf(time.Friday))},
		{"15 30 9 L-2,15W * MON#1", anyOf(ruleBeforeLast(2), ruleNearest(15), ruleNth(time.Monday, 1))},
		{"15 30 9 10-12,LW * 0", anyOf(ruleDays(10, 11, 12), ruleLastWeekday, ruleWeekdays(time.Sunday))},
		// Months restrict as always; a five-field spec.
		{"15 30 9 L FEB ?", ruleMonths(ruleLast, time.February)},
		{"15 30 9 29W 2 *", ruleMonths(ruleNearest(29), time.February)},
		{"15 30 9 ? 2 MON#5", ruleMonths(ruleNth(time.Monday, 5), time.February)},
		{"15 30 9 ? JAN,JUL SUN#1", ruleMonths(ruleNth(time.Sunday, 1), time.January, time.July)},
	}
	for _, c := range cases {
		s := firetest.Schedule(t, c.spec, "", 0)
		for _, span := range calendarYears {
			from := time.Date(span[0], 1, 1, 0, 0, 0, 0, time.UTC)
			until := time.Date(span[1]+1, 1, 1, 0, 0, 0, 0, time.UTC)
			var want []time.Time
			for d := from; d.Before(until); d = d.AddDate(0, 0, 1) {
				if c.rule(d) {
					want = append(want, d.Add(9*time.Hour+30*time.Minute+15*time.Second))
				}
			}
			got, _ := s.Ticks(from, until, 0)
			if diff := tickDiff(got, want); diff != "" {
				t.Errorf("%s, %d-%d: %s", c.spec, span[0], span[1], diff)
			}
		}
	}
	// The same rule written with five fields.
	five, six := firetest.Schedule(t, "30 9 LW * *", "", 0), firetest.Schedule(t, "0 30 9 LW * *", "", 0)
	a, _ := five.Ticks(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), 0)
	b, _ := six.Ticks(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), 0)
	if d := tickDiff(a, b); d != "" || len(a) != 24 {
		t.Errorf("five and six fields differ (%d ticks): %s", len(a), d)
	}
}

// tickDiff describes how got differs from want ("" when equal).
func tickDiff(got, want []time.Time) string {
	if slices.EqualFunc(got, want, time.Time.Equal) {
		return ""
	}
	for i := 0; i < len(got) || i < len(want); i++ {
		var g, w string
		if i < len(got) {
			g = got[i].UTC().Format(time.RFC3339)
		}
		if i < len(want) {
			w = want[i].UTC().Format(time.RFC3339)
		}
		if g != w {
			return fmt.Sprintf("%d ticks, want %d; tick %d is %q, want %q", len(got), len(want), i, g, w)
		}
	}
	return ""
}

// wallTicks computes the ticks of a spec firing at the given wall times
// (hours, minutes, second 0) on the dates rule names, in loc, over
// [from, until), by scanning every minute around each date: for a fixed
// hour, Vixie cron's rules (a wall time the spring-forward change skips
// fires when the gap ends, one the fall-back change repeats fires once, at
// its first occurrence); with every hour (hours nil), each real instant
// whose wall clock matches.
func wallTicks(loc *time.Location, rule dayRule, hours, minutes []int, from, until time.Time) []time.Time {
	var out []time.Time
	for d := from.AddDate(0, 0, -1); d.Before(until.AddDate(0, 0, 1)); d = d.AddDate(0, 0, 1) {
		if !rule(d) {
			continue
		}
		// instants of each wall time of the date, and the scan in order.
		type seen struct {
			wall time.Time
			at   time.Time
		}
		var scan []seen
		for u := d.Add(-15 * time.Hour); u.Before(d.Add(39 * time.Hour)); u = u.Add(time.Minute) {
			l := u.In(loc)
			wall := time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), 0, 0, time.UTC)
			if wall.Year() == d.Year() && wall.YearDay() == d.YearDay() {
				scan = append(scan, seen{wall, u})
			}
		}
		match := func(w time.Time) bool {
			return (hours == nil || slices.Contains(hours, w.Hour())) && slices.Contains(minutes, w.Minute())
		}
		if hours == nil {
			for _, s := range scan {
				if match(s.wall) {
					out = append(out, s.at)
				}
			}
			continue
		}
		for _, h := range hours {
			for _, m := range minutes {
				want := d.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute)
				// The first instant showing that wall time, or, when none
				// does (a gap), the first one after it.
				i := slices.IndexFunc(scan, func(s seen) bool { return !s.wall.Before(want) })
				if i >= 0 {
					out = append(out, scan[i].at)
				}
			}
		}
	}
	slices.SortFunc(out, time.Time.Compare)
	out = slices.CompactFunc(out, time.Time.Equal)
	return slices.DeleteFunc(out, func(t time.Time) bool { return t.Before(from) || !t.Before(until) })
}

// TestCalendarDaylightSaving: calendar specs that name the days the clocks
// change, in zones that change by an hour (Berlin, New York), by half an
// hour (Lord Howe), with a 45-minute offset (Chatham) and not at all
// (Kolkata), over four years.
func TestCalendarDaylightSaving(t *testing.T) {
	t.Parallel()
	// Four years the zones' tables list, and four past them (from 2038 Go
	// derives the changes from each zone's rule; 2040 is a leap year).
	spans := [][2]time.Time{
		{time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC)},
		{time.Date(2038, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2042, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	every := func(step int) []int {
		var m []int
		for i := 0; i < 60; i += step {
			m = append(m, i)
		}
		return m
	}
	cases := []struct {
		zone, spec     string
		rule           dayRule
		hours, minutes []int // hours nil: every hour
	}{
		// Berlin: the last Sunday of March 02:00→03:00, of October 03:00→02:00.
		{"Europe/Berlin", "0 30 2 ? 3 0L", ruleMonths(ruleLastOf(time.Sunday), time.March), []int{2}, []int{30}},
		{"Europe/Berlin", "0 30 2 ? 10 SUNL", ruleMonths(ruleLastOf(time.Sunday), time.October), []int{2}, []int{30}},
		{"Europe/Berlin", "0 0,30 * ? 3,10 7L", ruleMonths(ruleLastOf(time.Sunday), time.March, time.October), nil, []int{0, 30}},
		{"Europe/Berlin", "0 30 2 ? 3 0#5", ruleMonths(ruleNth(time.Sunday, 5), time.March), []int{2}, []int{30}},
		{"Europe/Berlin", "0 0 1-3 L * ?", ruleLast, []int{1, 2, 3}, []int{0}},
		// New York: the second Sunday of March 02:00→03:00, the first of
		// November 02:00→01:00.
		{"America/New_York", "0 30 2 ? 3 0#2", ruleMonths(ruleNth(time.Sunday, 2), time.March), []int{2}, []int{30}},
		{"America/New_York", "0 30 1 ? 11 SUN#1", ruleMonths(ruleNth(time.Sunday, 1), time.November), []int{1}, []int{30}},
		{"America/New_York", "0 */20 * ? 3,11 SUN#1,SUN#2", ruleMonths(anyOf(ruleNth(time.Sunday, 1), ruleNth(time.Sunday, 2)), time.March, time.November), nil, every(20)},
		{"America/New_York", "0 0,30 1,2 LW * *", ruleLastWeekday, []int{1, 2}, []int{0, 30}},
		// Lord Howe: the first Sunday of October 02:00→02:30, of April
		// 02:00→01:30.
		{"Australia/Lord_Howe", "0 15 2 ? 10 0#1", ruleMonths(ruleNth(time.Sunday, 1), time.October), []int{2}, []int{15}},
		{"Australia/Lord_Howe", "0 45 1 ? 4 0#1", ruleMonths(ruleNth(time.Sunday, 1), time.April), []int{1}, []int{45}},
		{"Australia/Lord_Howe", "0 */15 * ? 4,10 SUN#1", ruleMonths(ruleNth(time.Sunday, 1), time.April, time.October), nil, every(15)},
		// Chatham (+12:45, +13:45 in summer): the last Sunday of September
		// 02:45→03:45, the first of April 03:45→02:45.
		{"Pacific/Chatham", "0 0 3 ? 9 0L", ruleMonths(ruleLastOf(time.Sunday), time.September), []int{3}, []int{0}},
		{"Pacific/Chatham", "0 0 3 ? 4 0#1", ruleMonths(ruleNth(time.Sunday, 1), time.April), []int{3}, []int{0}},
		// Every hour of the last day of a leap year past the tables.
		{"Europe/Berlin", "0 0 * L 12 *", ruleMonths(ruleLast, time.December), nil, []int{0}},
		// Kolkata has no daylight saving.
		{"Asia/Kolkata", "0 30 2 L * *", ruleLast, []int{2}, []int{30}},
		{"Asia/Kolkata", "0 0 * ? * 5L", ruleLastOf(time.Friday), nil, []int{0}},
	}
	for _, c := range cases {
		loc, err := time.LoadLocation(c.zone)
		if err != nil {
			t.Fatal(err)
		}
		s := firetest.Schedule(t, c.spec, c.zone, 0)
		for _, span := range spans {
			got, _ := s.Ticks(span[0], span[1], 0)
			want := wallTicks(loc, c.rule, c.hours, c.minutes, span[0], span[1])
			if len(want) == 0 {
				t.Fatalf("%s in %s: the reference found no tick", c.spec, c.zone)
			}
			if diff := tickDiff(got, want); diff != "" {
				t.Errorf("%s in %s, %d-%d: %s", c.spec, c.zone, span[0].Year(), span[1].Year()-1, diff)
			}
		}
	}
}

// TestCalendarDaylightSavingInstants pins a few of those ticks as instants
// read off the zones' published rules.
func TestCalendarDaylightSavingInstants(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		zone, spec, from string
		want             []string
	}{
		// 02:30 on the day Berlin skips 02:00-03:00 fires at 03:00 CEST.
		{"Europe/Berlin", "0 30 2 ? 3 0L", "2026-01-01T00:00:00Z", []string{"2026-03-29T01:00:00Z", "2027-03-28T01:00:00Z"}},
		// 02:30 on the day Berlin repeats 02:00-03:00 fires once, in CEST.
		{"Europe/Berlin", "0 30 2 ? 10 0L", "2026-01-01T00:00:00Z", []string{"2026-10-25T00:30:00Z", "2027-10-31T00:30:00Z"}},
		// Only years whose March has five Sundays, all of them the change.
		{"Europe/Berlin", "0 30 2 ? 3 0#5", "2026-01-01T00:00:00Z", []string{"2026-03-29T01:00:00Z", "2030-03-31T01:00:00Z"}},
		// New York skips 02:00-03:00 on the second Sunday of March.
		{"America/New_York", "0 30 2 ? 3 0#2", "2026-01-01T00:00:00Z", []string{"2026-03-08T07:00:00Z", "2027-03-14T07:00:00Z"}},
		// Lord Howe skips 02:00-02:30 (+10:30 to +11) on the first Sunday of October.
		{"Australia/Lord_Howe", "0 15 2 ? 10 0#1", "2026-01-01T00:00:00Z", []string{"2026-10-03T15:30:00Z", "2027-10-02T15:30:00Z"}},
		// and repeats 01:30-02:00 on the first Sunday of April: the first, at +11.
		{"Australia/Lord_Howe", "0 45 1 ? 4 0#1", "2026-01-01T00:00:00Z", []string{"2026-04-04T14:45:00Z", "2027-04-03T14:45:00Z"}},
	} {
		s := firetest.Schedule(t, c.spec, c.zone, 0)
		at := firetest.UTC(c.from)
		for i, w := range c.want {
			at = s.Next(at)
			if !at.Equal(firetest.UTC(w)) {
				t.Errorf("%s in %s: tick %d is %s, want %s", c.spec, c.zone, i, at.Format(time.RFC3339), w)
				break
			}
		}
	}
}
