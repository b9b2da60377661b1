package contract

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestScheduleFieldsValidate: bad windows, exclusions and labels are
// refused with the field named; good ones pass and normalize to UTC
// seconds.
func TestScheduleFieldsValidate(t *testing.T) {
	t.Parallel()
	start := time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name  string
		edit  func(*Entry)
		field string // "" when valid
		want  string
	}{
		{"window", func(e *Entry) { e.StartAt, e.EndAt = start, start.Add(time.Hour) }, "", ""},
		{"end only", func(e *Entry) { e.EndAt = start }, "", ""},
		{"end before start", func(e *Entry) { e.StartAt, e.EndAt = start, start.Add(-time.Second) }, "end_at", "is before start_at"},
		{"bad exclusion", func(e *Entry) { e.Exclude = []string{"* * 32 12 *"} }, "exclude", ""},
		{"@every exclusion", func(e *Entry) { e.Exclude = []string{"@every 1h"} }, "exclude", "not a calendar"},
		{"good exclusions", func(e *Entry) { e.Exclude = []string{"* * 25 12 *", "0 0 9 * * 1"} }, "", ""},
		{"labels", func(e *Entry) {
			e.Labels = map[string]string{"team": "payments", "example.com/tier": "", "a_b.c-d": "X_1"}
		}, "", ""},
		{"label key with space", func(e *Entry) { e.Labels = map[string]string{"my team": "x"} }, "labels", "key name"},
		{"label value dash end", func(e *Entry) { e.Labels = map[string]string{"team": "pay-"} }, "labels.team", "value"},
		{"label prefix upper", func(e *Entry) { e.Labels = map[string]string{"Example.com/x": "y"} }, "labels", "prefix"},
		{"max fires", func(e *Entry) { e.MaxFires = 5 }, "", ""},
		{"negative max fires", func(e *Entry) { e.MaxFires = -1 }, "max_fires", "at least 1"},
		{"label value too long", func(e *Entry) { e.Labels = map[string]string{"k": strings.Repeat("a", 64)} }, "labels.k", "value"},
	}
	for _, c := range cases {
		e := validEntry("w")
		c.edit(&e)
		err := e.Validate()
		if c.field == "" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || !strings.Contains(fe.Reason, c.want) || !errors.Is(err, ErrInvalidEntry) {
			t.Errorf("%s: got %v, want a field error on %s saying %q", c.name, err, c.field, c.want)
		}
	}
	e := validEntry("w")
	e.StartAt = time.Date(2027, 3, 1, 10, 0, 0, 500, time.FixedZone("CET", 3600))
	if n := e.Normalize(); n.StartAt.Location() != time.UTC || n.StartAt.Nanosecond() != 0 || !n.StartAt.Equal(start.Add(9*time.Hour)) {
		t.Errorf("normalized start_at %v", n.StartAt)
	}
}

// TestEntryWithoutScheduleFieldsIsUnchanged: an entry that sets none of the
// schedule fields encodes exactly as before they existed, and goes out
// under the plain types, so earlier builds keep applying it.
func TestEntryWithoutScheduleFieldsIsUnchanged(t *testing.T) {
	t.Parallel()
	e := validEntry("plain").Normalize()
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"plain","cron":"*/5 * * * *","timezone":"UTC","task":{"type":"report:daily","payload":"eyJ0ZWFtIjoib3BzIn0="},"options":{"queue":"default","max_retry":25,"timeout":"30m"},"catchup":{"policy":"none"},"overlap":"allow"}`
	if string(b) != want {
		t.Errorf("encoding changed:\n got %s\nwant %s", b, want)
	}
	for _, typ := range ConfigTypes {
		if got := GatedType(typ, e); got != typ {
			t.Errorf("GatedType(%s) of a plain entry = %s", typ, got)
		}
	}
	e.Labels = map[string]string{"team": "x"}
	for _, typ := range ConfigTypes {
		want := typ + GatedSuffix
		if typ == TypeEntryRemoved {
			want = typ
		}
		if got := GatedType(typ, e); got != want {
			t.Errorf("GatedType(%s) of a labelled entry = %s, want %s", typ, got, want)
		}
		if ConfigKind(want) != typ || !IsConfigType(want) || ShortType(want) != ShortType(typ) {
			t.Errorf("%s: kind %s, config %t, short %s", want, ConfigKind(want), IsConfigType(want), ShortType(want))
		}
	}
	if IsConfigType(TypeEntryRemoved+GatedSuffix) || IsConfigType(TypeEntryFired+GatedSuffix) {
		t.Error("a gated removal or activity type is taken for a config type")
	}
}

// TestDecodeGatedConfigEvent: a gated event decodes with its schedule
// fields; one with a field this build does not know is malformed (a later
// build's field), while a plain event keeps ignoring unknown fields.
func TestDecodeGatedConfigEvent(t *testing.T) {
	t.Parallel()
	e := validEntry("g")
	e.EndAt = time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	e.Exclude = []string{"* * 25 12 *"}
	e.Labels = map[string]string{"team": "payments"}
	data, _ := json.Marshal(e.Normalize())
	event := func(typ string, data []byte) []byte {
		ev, err := NewEvent(typ, "test", "g", json.RawMessage(data))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := ev.Marshal()
		return b
	}
	_, got, err := DecodeConfigEvent(event(TypeEntryRegistered+GatedSuffix, data))
	if err != nil || !got.EndAt.Equal(e.EndAt) || got.Labels["team"] != "payments" || len(got.Exclude) != 1 {
		t.Fatalf("gated event: %+v, %v", got, err)
	}
	later := []byte(strings.Replace(string(data), `{"id":"g"`, `{"id":"g","a_later_field":5`, 1))
	if _, _, err := DecodeConfigEvent(event(TypeEntryUpdated+GatedSuffix, later)); !errors.Is(err, ErrMalformedEvent) || !strings.Contains(err.Error(), "a_later_field") {
		t.Errorf("gated event with an unknown field: %v, want malformed naming a_later_field", err)
	}
	if _, _, err := DecodeConfigEvent(event(TypeEntryUpdated, later)); err != nil {
		t.Errorf("plain event with an unknown field: %v, want it ignored as before", err)
	}
	paused := e
	paused.Paused = true
	pdata, _ := json.Marshal(paused.Normalize())
	if _, _, err := DecodeConfigEvent(event(TypeEntryPaused+GatedSuffix, pdata)); err != nil {
		t.Errorf("gated pause: %v", err)
	}
	if _, _, err := DecodeConfigEvent(event(TypeEntryResumed+GatedSuffix, pdata)); !errors.Is(err, ErrMalformedEvent) {
		t.Errorf("gated resume with paused=true: %v", err)
	}
}

func TestSelector(t *testing.T) {
	t.Parallel()
	pay := map[string]string{"team": "payments", "tier": "critical"}
	ops := map[string]string{"team": "ops"}
	cases := []struct {
		sel      string
		pay, ops bool
		none     bool // an entry without labels
	}{
		{"", true, true, true},
		{"team=payments", true, false, false},
		{"team==payments", true, false, false},
		{"team!=payments", false, true, true},
		{"tier", true, false, false},
		{"!tier", false, true, true},
		{" team = payments , tier ", true, false, false},
		{"team=ops,!tier", false, true, false},
		{"team=", false, false, false},
	}
	for _, c := range cases {
		s, err := ParseSelector(c.sel)
		if err != nil {
			t.Errorf("%q: %v", c.sel, err)
			continue
		}
		if s.Matches(pay) != c.pay || s.Matches(ops) != c.ops || s.Matches(nil) != c.none {
			t.Errorf("%q: payments %t ops %t none %t, want %t %t %t", c.sel, s.Matches(pay), s.Matches(ops), s.Matches(nil), c.pay, c.ops, c.none)
		}
	}
	for _, bad := range []string{"team=pay ments", ",", "team=a,,b", "bad key=x", "!", "x=-a"} {
		if _, err := ParseSelector(bad); !errors.Is(err, ErrBadSelector) {
			t.Errorf("%q: %v, want ErrBadSelector", bad, err)
		}
	}
	if _, _, err := ParseLabel("team"); err == nil || !strings.Contains(err.Error(), "key=value") {
		t.Errorf("ParseLabel without '=': %v", err)
	}
}

func TestExclusionsAndWindow(t *testing.T) {
	t.Parallel()
	e := validEntry("x")
	e.Timezone = "Europe/Berlin"
	e.Exclude = []string{"* * 25 12 *", "*/10 * * * * *"}
	x, err := e.Exclusions()
	if err != nil {
		t.Fatal(err)
	}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	for _, c := range []struct {
		at   time.Time
		want bool
	}{
		{time.Date(2026, 12, 25, 9, 0, 0, 0, berlin), true},
		{time.Date(2026, 12, 24, 23, 30, 5, 0, time.UTC), true}, // 00:30 on the 25th in Berlin
		{time.Date(2026, 12, 25, 23, 30, 5, 0, time.UTC), false},
		{time.Date(2026, 12, 26, 9, 0, 20, 0, berlin), true}, // second 20
		{time.Date(2026, 12, 26, 9, 0, 21, 0, berlin), false},
	} {
		if got := x.Match(c.at); got != c.want {
			t.Errorf("Match(%s) = %t, want %t", c.at.UTC(), got, c.want)
		}
	}
	e.StartAt = time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	e.EndAt = e.StartAt.Add(time.Hour)
	for _, c := range []struct {
		at        time.Time
		in, ended bool
	}{
		{e.StartAt.Add(-time.Second), false, false},
		{e.StartAt, true, false},
		{e.EndAt, true, false},
		{e.EndAt.Add(time.Second), false, true},
	} {
		if e.InWindow(c.at) != c.in || e.Ended(c.at) != c.ended {
			t.Errorf("%s: in %t ended %t, want %t %t", c.at, e.InWindow(c.at), e.Ended(c.at), c.in, c.ended)
		}
	}
}

// TestSelectorSetBased covers Kubernetes' set-based requirements and its
// error messages.
func TestSelectorSetBased(t *testing.T) {
	t.Parallel()
	billing := map[string]string{"team": "billing", "env": "prod"}
	opsDev := map[string]string{"team": "ops", "env": "dev"}
	web := map[string]string{"team": "web"}
	cases := []struct {
		sel                  string
		billing, opsDev, web bool
		none                 bool
	}{
		{"team in (billing,ops),env!=dev", true, false, false, false},
		{"team in (billing, ops)", true, true, false, false},
		{"team notin (billing,ops)", false, false, true, true},
		{"team in (in,notin)", false, false, false, false},
		{"env in (prod,)", true, false, false, false}, // web has no env: not set is not ""
		{"env notin ()", true, true, true, true},
		{"!env,team", false, false, true, false},
		{"team=billing,env", true, false, false, false},
		{"team=(x", false, false, false, false},
	}
	for _, c := range cases {
		s, err := ParseSelector(c.sel)
		if c.sel == "team=(x" {
			if err == nil {
				t.Errorf("%q parsed", c.sel)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.sel, err)
			continue
		}
		if got := [4]bool{s.Matches(billing), s.Matches(opsDev), s.Matches(web), s.Matches(nil)}; got != [4]bool{c.billing, c.opsDev, c.web, c.none} {
			t.Errorf("%q: billing, ops/dev, web, none = %v, want %v", c.sel, got, [4]bool{c.billing, c.opsDev, c.web, c.none})
		}
	}
	errs := map[string]string{
		"team in (billing":     "unable to parse requirement: found 'end of string', expected: ',', ')' or identifier",
		"team in billing":      "unable to parse requirement: found 'billing', expected: '('",
		"team in (a b)":        "unable to parse requirement: found 'b', expected: ',' or ')'",
		"team > 3":             "unable to parse requirement: found '>', expected: '=', '!=', '==', 'in', 'notin'",
		"team=a,":              "found '', expected: identifier after ','",
		"=a":                   "found '=', expected: !, identifier, or 'end of string'",
		"team=a b":             "found 'b', expected: ',' or 'end of string'",
		"!team=a":              "after '!team'",
		"bad$key=x":            "key name must be 1-63 characters",
		"team in (ok,bad val)": "found 'val', expected: ',' or ')'",
		"team in (ok,-x)":      "value must be at most 63 characters",
	}
	for sel, want := range errs {
		_, err := ParseSelector(sel)
		if !errors.Is(err, ErrBadSelector) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want ErrBadSelector saying %q", sel, err, want)
		}
	}
}
