package main

import (
	"strings"
	"testing"
	"time"
)

// TestParseTime: the time flags (backfill --from/--to, ls --at, put's
// times) take what audit --since takes: RFC 3339, a date, now, or a signed
// relative time that may count whole days; an unsigned duration is refused
// with the signed form to use.
func TestParseTime(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want time.Time
		err  string
	}{
		{in: "now", want: now},
		{in: "-2h", want: now.Add(-2 * time.Hour)},
		{in: "-30d", want: now.AddDate(0, 0, -30)},
		{in: "-1d12h", want: now.Add(-36 * time.Hour)},
		{in: "+90m", want: now.Add(90 * time.Minute)},
		{in: "2026-12-01", want: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		{in: "2026-12-01T09:30:00Z", want: time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)},
		{in: "30d", err: "a relative time needs a sign: -30d"},
		{in: "-3x", err: "not a relative time"},
		{in: "-1d-2h", err: "not a relative time"},
		{in: "yesterday", err: "use RFC 3339"},
	} {
		got, err := parseTime("from", c.in, now)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: %v, %v; want an error with %q", c.in, got, err, c.err)
		case c.err == "" && (err != nil || !got.Equal(c.want)):
			t.Errorf("%q: %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}
