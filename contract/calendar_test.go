package contract

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

// days2026 lists the days of each month of 2026 a spec fires on at
// midnight UTC, from its first 12 ticks after 2025-12-31.
func days2026(t *testing.T, spec string) []int {
	t.Helper()
	s, err := ParseCron(spec, time.UTC)
	if err != nil {
		t.Fatalf("%s: %v", spec, err)
	}
	var out []int
	for at := time.Date(2025, 12, 31, 12, 0, 0, 0, time.UTC); ; {
		at = s.Next(at)
		if at.IsZero() || at.Year() > 2026 {
			return out
		}
		out = append(out, at.Day())
	}
}

// TestCalendarForms: each form against the days of 2026 it must fire on
// (read off a printed calendar of 2026).
func TestCalendarForms(t *testing.T) {
	t.Parallel()
	cases := []struct {
		spec string
		want []int // one day per month it fires in, January first
	}{
		{"0 0 L * *", []int{31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}},
		{"0 0 0 l * ?", []int{31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}},
		{"0 0 L-3 * *", []int{28, 25, 28, 27, 28, 27, 28, 28, 27, 28, 27, 28}},
		{"0 0 LW * *", []int{30, 27, 31, 30, 29, 30, 31, 31, 30, 30, 30, 31}},
		{"0 0 1W * *", []int{1, 2, 2, 1, 1, 1, 1, 3, 1, 1, 2, 1}}, // Aug 1st is a Saturday: Monday the 3rd
		{"0 0 15W * *", []int{15, 16, 16, 15, 15, 15, 15, 14, 15, 15, 16, 15}},
		{"0 0 31W * *", []int{30, 31, 29, 31, 31, 30, 31}}, // only months with a 31st; May 31st is a Sunday: Friday the 29th
		{"0 0 ? * 5L", []int{30, 27, 27, 24, 29, 26, 31, 28, 25, 30, 27, 25}},
		{"0 0 * * FRIL", []int{30, 27, 27, 24, 29, 26, 31, 28, 25, 30, 27, 25}},
		{"0 0 ? * 0L", []int{25, 22, 29, 26, 31, 28, 26, 30, 27, 25, 29, 27}},
		{"0 0 ? * 7L", []int{25, 22, 29, 26, 31, 28, 26, 30, 27, 25, 29, 27}},
		{"0 0 ? * MON#2", []int{12, 9, 9, 13, 11, 8, 13, 10, 14, 12, 9, 14}},
		{"0 0 ? * 5#5", []int{30, 29, 31, 30}}, // January, May, July, October
		{"0 0 0 L 2,8 *", []int{28, 31}},
	}
	for _, c := range cases {
		if got := days2026(t, c.spec); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: fires on %v in 2026, want %v", c.spec, got, c.want)
		}
	}
	// Sunday as 7, alone and in ranges; the days a list of forms names.
	for spec, want := range map[string]string{
		"0 0 * 1 7":          "[4 11 18 25]",
		"0 0 * 1 5-7":        "[2 3 4 9 10 11 16 17 18 23 24 25 30 31]",
		"0 0 1,15,L 1 *":     "[1 15 31]",
		"0 0 ? 1 MON#1,5L":   "[5 30]",
		"0 0 L 1 MON#1":      "[5 31]", // both restricted: either matches
		"0 0 * 1 MON#1":      "[5]",    // "*" day of month: the day of week alone
		"0 0 10-11,LW 1 ?":   "[10 11 30]",
		"0 0 ? 1 1-5/2,SUNL": "[2 5 7 9 12 14 16 19 21 23 25 26 28 30]",
	} {
		if got := fmt.Sprint(days2026(t, spec)); got != want {
			t.Errorf("%s: fires on %s in January 2026, want %s", spec, got, want)
		}
	}
}

// TestCalendarRefused: what the forms refuse, each with an error that says
// why; specs robfig refuses keep robfig's error.
func TestCalendarRefused(t *testing.T) {
	t.Parallel()
	for spec, want := range map[string]string{
		"0 0 ? * L":                      "name the day before L",
		"0 0 ? * 8L":                     "0-7",
		"0 0 ? * XYZL":                   "0-7",
		"0 0 ? * 1#6":                    "n from 1 to 5",
		"0 0 ? * 1#0":                    "n from 1 to 5",
		"0 0 ? * #2":                     "0-7",
		"0 0 ? * 1#":                     "n from 1 to 5",
		"0 0 32W * *":                    "from 1 to 31",
		"0 0 0W * *":                     "from 1 to 31",
		"0 0 W * *":                      "L and W",
		"0 0 L-0 * *":                    "from 1 to 30",
		"0 0 L-31 * *":                   "from 1 to 30",
		"0 0 L-x * *":                    "from 1 to 30",
		"0 0 LL * *":                     "L and W",
		"0 0 15WL * *":                   "L and W",
		"0 0 L,,1 * *":                   "not a value",
		"0 0 L * 9":                      "not a value from 0 to 7",
		"0 0 L * 5-3":                    "starts after it ends",
		"0 0 L * */0":                    "positive",
		"0 0 L * +5":                     "not a value",
		"0 0 31W 2 *":                    "never fires",
		"0 0 L-30 2 *":                   "never fires",
		"0 0 0 ? 2 1#5 x":                "fields",
		"0 61 9 L * *":                   "above maximum",
		"CRON_TZ=Nowhere/Else 0 0 L * *": "bad location",
	} {
		_, err := ParseCron(spec, time.UTC)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one saying %q", spec, err, want)
		}
	}
	e := validEntry("cal")
	e.Cron = "0 0 ? * L"
	if err := e.Validate(); err == nil || !strings.Contains(err.Error(), `cron "0 0 ? * L": day of week: "L": name the day before L`) {
		t.Errorf("entry with a bad calendar spec: %v", err)
	}
}

// TestCalendarSpecRouting: a spec robfig accepts is never taken for a
// calendar spec (its ticks stay robfig's), and the plain forms of a
// calendar spec's day fields mean what robfig makes of them.
func TestCalendarSpecRouting(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 9))
	el := func(min, max int, names []string) string {
		v := func() string {
			if names != nil && rng.IntN(3) == 0 {
				return names[rng.IntN(len(names))]
			}
			return fmt.Sprint(min + rng.IntN(max-min+1))
		}
		switch rng.IntN(6) {
		case 0:
			return "*"
		case 1:
			return "?"
		case 2:
			return fmt.Sprintf("*/%d", 1+rng.IntN(8))
		case 3:
			return v() + "/" + fmt.Sprint(1+rng.IntN(5))
		case 4:
			a := min + rng.IntN(max-min+1)
			return fmt.Sprintf("%d-%d", a, a+rng.IntN(max-a+1))
		}
		return v()
	}
	list := func(min, max int, names []string) string {
		parts := make([]string, 1+rng.IntN(3))
		for i := range parts {
			parts[i] = el(min, max, names)
		}
		return strings.Join(parts, ",")
	}
	days := []string{"sun", "MON", "Tue", "wed", "THU", "fri", "SAT"}
	parser := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)
	checked := 0
	for range 5000 {
		dom, dow := list(1, 31, nil), list(0, 6, days)
		spec := "0 0 0 " + dom + " * " + dow
		sched, err := parser.Parse(spec)
		if err != nil {
			continue // a range robfig refuses, such as 5-3 after a name
		}
		checked++
		if isCalendarSpec(spec) || isCalendarSpec("0 0 "+dom+" * "+dow) {
			t.Fatalf("%s: robfig accepts it, but it is taken for a calendar spec", spec)
		}
		sp := sched.(*cron.SpecSchedule)
		d, err := parseDom(dom)
		if err != nil {
			t.Fatalf("day of month %q: robfig accepts it, parseDom says %v", dom, err)
		}
		w, err := parseDow(dow)
		if err != nil {
			t.Fatalf("day of week %q: robfig accepts it, parseDow says %v", dow, err)
		}
		if d.days != sp.Dom&^(1<<63) || d.star != (sp.Dom&(1<<63) != 0) {
			t.Fatalf("day of month %q: %b star %t, robfig %b", dom, d.days, d.star, sp.Dom)
		}
		if uint64(w.days) != sp.Dow&^(1<<63) || w.star != (sp.Dow&(1<<63) != 0) {
			t.Fatalf("day of week %q: %b star %t, robfig %b", dow, w.days, w.star, sp.Dow)
		}
	}
	if checked < 2000 {
		t.Fatalf("only %d of 5000 generated specs were valid", checked)
	}
	for _, spec := range []string{"0 0 * * */7", "0 0 * * 0/7", "@monthly", "CRON_TZ=Europe/Berlin 0 0 1 * *", "0 0 * JUL *", "0 0 * * wed"} {
		if isCalendarSpec(spec) {
			t.Errorf("%s is taken for a calendar spec", spec)
		}
	}
}

// TestCalendarGated: an entry whose spec uses a calendar form is gated;
// the same entry with a plain spec is not.
func TestCalendarGated(t *testing.T) {
	t.Parallel()
	for spec, gated := range map[string]bool{
		"0 0 L * *": true, "0 0 ? * 5#2": true, "0 0 * * 7": true, "CRON_TZ=Asia/Tokyo 0 0 15W * *": true, "0 0 0 ? * FRIL": true,
		"0 0 * * 0": false, "@daily": false, "0 0 * * */7": false, "0 0 1 * MON-FRI": false,
	} {
		e := validEntry("g")
		e.Cron = spec
		if err := e.Validate(); err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		if e.Gated() != gated {
			t.Errorf("%s: gated %t, want %t", spec, e.Gated(), gated)
		}
	}
}

// TestCalendarNextProperties: from random instants in random zones, Next of
// calendar specs is after its argument, in whole seconds, on a wall time
// that matches, and nothing matches in between (checked second by second
// over short spans).
func TestCalendarNextProperties(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "Pacific/Chatham"}
	specs := []string{"*/7 * * L * *", "0 */5 * ? * 0L", "30 * * LW * ?", "* 0 0-2 1W * *", "0 0 * ? * SUN#1,SUN#2", "*/20 * * 15W,L * 7"}
	for range 300 {
		loc, _ := time.LoadLocation(zones[rng.IntN(len(zones))])
		spec := specs[rng.IntN(len(specs))]
		s, err := ParseCron(spec, loc)
		if err != nil {
			t.Fatal(err)
		}
		c := s.(*CalendarSchedule)
		from := time.Date(2024+rng.IntN(4), time.Month(1+rng.IntN(12)), 1+rng.IntN(31), rng.IntN(24), rng.IntN(60), rng.IntN(60), rng.IntN(1e9), time.UTC)
		next := c.Next(from)
		if !next.After(from) || next.Nanosecond() != 0 {
			t.Fatalf("%s in %s: Next(%s) = %s", spec, loc, from, next)
		}
		if !c.MatchesWall(next.In(loc)) {
			t.Fatalf("%s in %s: Next(%s) = %s, whose wall clock %s does not match", spec, loc, from, next, next.In(loc))
		}
		if span := next.Sub(from); span < 3*time.Hour {
			for u := from.Truncate(time.Second).Add(time.Second); u.Before(next); u = u.Add(time.Second) {
				if c.MatchesWall(u.In(loc)) {
					t.Fatalf("%s in %s: Next(%s) = %s passes over %s", spec, loc, from, next, u)
				}
			}
		}
	}
}

// TestCalendarLongestWait: no calendar form limited to one month waits
// longer than calendarSearchYears for its next day, so Next's bound finds
// every tick there is. Over 400 years (the Gregorian cycle) the longest
// gap of each form is measured by walking the dates.
func TestCalendarLongestWait(t *testing.T) {
	t.Parallel()
	var forms []string
	forms = append(forms, "L", "LW")
	for n := 1; n <= 30; n++ {
		forms = append(forms, fmt.Sprintf("L-%d", n))
	}
	for n := 1; n <= 31; n++ {
		forms = append(forms, fmt.Sprintf("%dW", n))
	}
	for d := 0; d < 7; d++ {
		forms = append(forms, fmt.Sprintf("? * %dL", d))
		for n := 1; n <= 5; n++ {
			forms = append(forms, fmt.Sprintf("? * %d#%d", d, n))
		}
	}
	longest, which := 0, ""
	for _, form := range forms {
		for m := 1; m <= 12; m++ {
			dom, dow := form, "*"
			if strings.HasPrefix(form, "? * ") {
				dom, dow = "?", strings.TrimPrefix(form, "? * ")
			}
			s, err := ParseCron(fmt.Sprintf("0 0 %s %d %s", dom, m, dow), time.UTC)
			if err != nil {
				continue // never fires in that month (L-30 in February)
			}
			c := s.(*CalendarSchedule)
			// Two cycles, so that the gap across the cycle's end counts.
			last := -1
			for y := 2000; y < 2800; y++ {
				if c.dayMask(y, time.Month(m)) == 0 {
					continue
				}
				if gap := y - last; last >= 0 && gap > longest {
					longest, which = gap, fmt.Sprintf("%s in month %d before %d", form, m, y)
				}
				last = y
			}
		}
	}
	if longest >= calendarSearchYears {
		t.Fatalf("%s waits %d years, more than Next searches (%d)", which, longest, calendarSearchYears)
	}
	t.Logf("longest wait: %d years (%s)", longest, which)
}
