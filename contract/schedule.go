package contract

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// maxExclusions bounds an entry's exclusion specs.
const maxExclusions = 32

// normalTime is t as an entry stores it: UTC, whole seconds (ticks are whole
// seconds), the zero time unchanged.
func normalTime(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC().Truncate(time.Second)
}

// Gated reports whether e sets a field that builds before these fields
// existed do not know. Such an entry's config events are published under
// the gated types (GatedType), which earlier builds refuse, so a replica of
// an earlier build quarantines the entry instead of firing past its end or
// inside an exclusion during a rolling upgrade. An overlap policy they do
// not know (buffer-one, cancel-previous) is gated too: they would refuse it in validation
// anyway, and the gated type makes that refusal the documented one. So is
// a cron spec with calendar day forms (L, W, #, Sunday as 7), for the same
// reason. So is tick_headers: an earlier build would fire the tasks
// without the headers their handlers read.
func (e Entry) Gated() bool {
	return !e.StartAt.IsZero() || !e.EndAt.IsZero() || len(e.Exclude) > 0 || len(e.Labels) > 0 || e.PauseOnFailure ||
		e.Overlap == OverlapBufferOne || e.Overlap == OverlapCancelPrevious || e.MaxFires != 0 ||
		isCalendarSpec(e.Cron) || e.TickHeaders
}

// InWindow reports whether tick lies in the entry's active window
// [StartAt, EndAt] (either bound may be unset).
func (e Entry) InWindow(tick time.Time) bool {
	return (e.StartAt.IsZero() || !tick.Before(e.StartAt)) && (e.EndAt.IsZero() || !tick.After(e.EndAt))
}

// Ended reports whether the entry's active window is over at now: it has
// an end and now is past it. An ended entry stays registered and shows as
// ended; it fires nothing.
func (e Entry) Ended(now time.Time) bool {
	return !e.EndAt.IsZero() && now.After(e.EndAt)
}

// Exclusions parses the entry's exclusion specs in its zone. The entry must
// have passed validation; an error here means it did not.
func (e Entry) Exclusions() (Exclusions, error) {
	if len(e.Exclude) == 0 {
		return nil, nil
	}
	loc, err := e.Location()
	if err != nil {
		return nil, err
	}
	out := make(Exclusions, 0, len(e.Exclude))
	for _, spec := range e.Exclude {
		s, err := parseExclusion(spec, loc)
		if err != nil {
			return nil, fmt.Errorf("exclude %q: %w", spec, err)
		}
		out = append(out, exclusion{sched: s, minutes: !hasSeconds(spec)})
	}
	return out, nil
}

// Exclusions are parsed exclusion specs.
type Exclusions []exclusion

type exclusion struct {
	sched cron.Schedule
	// minutes: the spec has no seconds field, so it names whole minutes:
	// "* * 25 12 *" excludes every tick of December 25th, those of a
	// six-field entry spec at :30 seconds too.
	minutes bool
}

// hasSeconds reports whether a cron spec has the optional leading seconds
// field (six fields after any CRON_TZ= prefix).
func hasSeconds(spec string) bool {
	f := strings.Fields(spec)
	if len(f) > 0 && (strings.HasPrefix(f[0], "CRON_TZ=") || strings.HasPrefix(f[0], "TZ=")) {
		f = f[1:]
	}
	return len(f) == 6
}

// Match reports whether tick matches one of the specs: a six-field spec
// matches the seconds it would tick at, a five-field one (or a descriptor)
// every second of the minutes it would tick at.
func (x Exclusions) Match(tick time.Time) bool {
	for _, s := range x {
		t := tick.Truncate(time.Second)
		if s.minutes {
			t = tick.Truncate(time.Minute)
		}
		// Next of the second before is t exactly when the spec matches t.
		if s.sched.Next(t.Add(-time.Second)).Equal(t) {
			return true
		}
	}
	return false
}

// Limited reports whether the entry has a fire limit (MaxFires).
func (e Entry) Limited() bool { return e.MaxFires > 0 }

// MaxFiresSince is the revision an entry's fire limit counts from after
// the config event at seq set it to next: the previous state's (prev, whose
// limit counted from prevSince; nil when the entry was absent, removed or
// quarantined) when the limit kept its value, else seq. 0 for no limit.
func MaxFiresSince(prev *Entry, prevSince uint64, next Entry, seq uint64) uint64 {
	switch {
	case !next.Limited():
		return 0
	case prev != nil && prev.MaxFires == next.MaxFires && prevSince != 0:
		return prevSince
	}
	return seq
}

// parseExclusion parses one exclusion spec. @every specs make no sense as
// calendars (they tick from the Unix epoch, not on dates) and are refused.
func parseExclusion(spec string, loc *time.Location) (cron.Schedule, error) {
	if len(spec) >= len("@every") && spec[:len("@every")] == "@every" {
		return nil, fmt.Errorf("@every is not a calendar: name the dates or times to exclude (e.g. \"* * 25 12 *\")")
	}
	return ParseCron(spec, loc)
}

// validateSchedule checks the window, exclusions, labels and the task
// headers tick_headers reserves.
func (n Entry) validateSchedule(loc *time.Location) []error {
	var errs []error
	add := func(field, value, reason string) {
		errs = append(errs, &FieldError{Field: field, Value: shorten(value), Reason: reason})
	}
	if !n.StartAt.IsZero() && !n.EndAt.IsZero() && n.EndAt.Before(n.StartAt) {
		add("end_at", n.EndAt.Format(time.RFC3339), "is before start_at "+n.StartAt.Format(time.RFC3339))
	}
	for _, f := range []struct {
		name string
		t    time.Time
	}{{"start_at", n.StartAt}, {"end_at", n.EndAt}} {
		if !f.t.IsZero() && (f.t.Year() < 1970 || f.t.Year() > 9999) {
			add(f.name, f.t.Format(time.RFC3339), "must be between 1970 and 9999")
		}
	}
	if len(n.Exclude) > maxExclusions {
		add("exclude", fmt.Sprintf("%d specs", len(n.Exclude)), fmt.Sprintf("at most %d specs", maxExclusions))
	}
	for _, spec := range n.Exclude {
		if _, err := parseExclusion(spec, loc); err != nil {
			add("exclude", spec, err.Error())
		}
	}
	if n.MaxFires < 0 {
		add("max_fires", fmt.Sprint(n.MaxFires), "must be at least 1 (leave it unset for no limit)")
	}
	if err := ValidateLabels(n.Labels); err != nil {
		errs = append(errs, err)
	}
	return append(errs, n.validateTickHeaders()...)
}
