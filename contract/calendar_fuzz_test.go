package contract

import (
	"testing"
	"time"
)

var fuzzZones = []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Pacific/Chatham", "Asia/Kolkata", "Pacific/Apia"}

// FuzzParseCron: no spec makes the parser, or the schedule it returns,
// panic; what a calendar spec's Next returns is after its argument, in
// whole seconds, and matches the spec on the wall clock. The calendar
// parser is called without ParseCron's recover, so a panic of its own
// shows here.
//
//	go test -run '^$' -fuzz FuzzParseCron ./events/
func FuzzParseCron(f *testing.F) {
	for _, s := range []string{
		"0 0 L * *", "0 0 L-3 * ?", "0 0 LW * *", "0 0 15W * *", "0 0 1W,L * *", "0 0 ? * 5L", "0 0 ? * FRI#3",
		"0 0 * * 7", "0 0 * * 5-7", "0 0 L * 5L", "0 30 2 ? 3 0#5", "*/7 * * L * *", "CRON_TZ=Europe/Berlin 0 0 L * *",
		"TZ=Asia/Tokyo 0 0 L-30 * *", "0 0 ? 2 1#5", "0 0 31W 2 *", "0 0 ? * L", "0 0 ? * #", "0 0 L-", "0 0 W * *",
		"0 0 1-31/0,L * *", "0 0 ? * 7-7/9999,SUNL", "0 0 ,L * *", "L L L L L", "@every 1h", "@daily", "* * * * *",
		"0 0 9999W * *", "0 0 ? * 9999#9999", "0 0 L-9999 * *", "0 0 ? * 0L,1L,2L,3L,4L,5L,6L,7L",
	} {
		f.Add(s, int64(1767225600), uint8(0))
		f.Add(s, int64(2240611200), uint8(3)) // 2041, past the zone tables
	}
	f.Fuzz(func(t *testing.T, spec string, unix int64, zone uint8) {
		loc, err := time.LoadLocation(fuzzZones[int(zone)%len(fuzzZones)])
		if err != nil {
			t.Fatal(err)
		}
		sched, perr := ParseCron(spec, loc)
		full := spec // as ParseCron evaluates it
		if prefix, _ := splitZone(spec); prefix == "" {
			full = "CRON_TZ=" + loc.String() + " " + spec
		}
		if !isCalendarSpec(full) {
			return
		}
		c, err := parseCalendar(full)
		if perr == nil {
			if _, ok := sched.(*CalendarSchedule); !ok || err != nil {
				t.Fatalf("%q: ParseCron gave %T, parseCalendar %v", spec, sched, err)
			}
		}
		if err != nil {
			return
		}
		// Instants from 1970 to 2200.
		from := time.Unix(unix%(230*365*86400), int64(uint64(unix)%1e9)).UTC()
		if from.Unix() < 0 {
			from = from.Add(230 * 365 * 24 * time.Hour)
		}
		for range 3 {
			next := c.Next(from)
			if next.IsZero() {
				return
			}
			if !next.After(from) || next.Nanosecond() != 0 {
				t.Fatalf("%q in %s: Next(%s) = %s", spec, loc, from, next)
			}
			if !c.MatchesWall(next.In(c.Location)) {
				t.Fatalf("%q in %s: Next(%s) = %s does not match its wall clock", spec, loc, from, next)
			}
			from = next
		}
	})
}
