package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

var goldenTime = time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)

func ptr[T any](v T) *T { return &v }

// fullEntry sets every field of an entry.
func fullEntry() Entry {
	return Entry{
		ID:       "daily-report",
		Cron:     "0 9 * * 1-5",
		Timezone: "Europe/Berlin",
		Task: Task{
			Type:    "report:daily",
			Payload: []byte(`{"team":"ops"}`),
			Headers: map[string]string{"source": "cron", "tenant": "acme"},
		},
		Options: Options{
			Queue:     "reports",
			MaxRetry:  ptr(5),
			Timeout:   Duration(10 * time.Minute),
			Deadline:  Duration(time.Hour),
			Unique:    Duration(30 * time.Minute),
			Retention: Duration(24 * time.Hour),
			Group:     "daily",
		},
		Catchup: Catchup{Policy: CatchupLatest, Window: Duration(2 * time.Hour)},
		Overlap: OverlapSkip,
		Jitter:  Duration(30 * time.Second),
		Owner:   "sync",
	}
}

// goldenEvents is one event of every type with fixed ids and times. The
// golden files pin their JSON: the field names are the contract with
// publishers, replicas of other versions and audit readers.
func goldenEvents() []struct {
	typ, subject string
	data         any
	fresh        func() any // a zero value to decode data into
} {
	registered := fullEntry()
	updated := fullEntry()
	updated.Cron = "30 9 * * 1-5"
	paused := updated
	paused.Paused, paused.Note = true, "quarter-end freeze"
	resumed := updated
	removed := updated
	removed.Removed = true
	retryAt := goldenTime.Add(40 * time.Second)
	until := goldenTime.Add(3 * time.Hour)
	lostFrom := goldenTime.Add(time.Hour)
	entry := func() any { return new(Entry) }
	return []struct {
		typ, subject string
		data         any
		fresh        func() any
	}{
		{TypeEntryRegistered, "daily-report", registered.Normalize(), entry},
		{TypeEntryUpdated, "daily-report", updated.Normalize(), entry},
		{TypeEntryPaused, "daily-report", paused.Normalize(), entry},
		{TypeEntryResumed, "daily-report", resumed.Normalize(), entry},
		{TypeEntryRemoved, "daily-report", removed.Normalize(), entry},
		{TypeEntryFired, "daily-report", Fired{
			Entry: "daily-report", ScheduledAt: goldenTime, EnqueuedAt: goldenTime.Add(15 * time.Millisecond),
			TaskID: "cronstream:daily-report:1767323045", Queue: "reports", Revision: 42, Replica: "replica-a",
		}, func() any { return new(Fired) }},
		{TypeEntrySkipped, "daily-report", Skipped{
			Entry: "daily-report", ScheduledAt: goldenTime, Until: &until, Count: 4, Reason: SkipMissed, Revision: 42, Replica: "replica-b",
		}, func() any { return new(Skipped) }},
		{TypeTaskRetried, "reports", TaskRecovered{
			TaskID: "t-1", Queue: "reports", Type: "report:daily", Retried: 3, MaxRetry: 5, RetryAt: &retryAt,
			Error: "asynq: task lease expired", Replica: "replica-a",
		}, func() any { return new(TaskRecovered) }},
		{TypeTaskArchived, "reports", TaskRecovered{
			TaskID: "t-2", Queue: "reports", Type: "report:daily", Retried: 5, MaxRetry: 5,
			Error: "asynq: task lease expired", Replica: "replica-a",
		}, func() any { return new(TaskRecovered) }},
		{TypeAggregationReclaimed, "reports", AggregationReclaimed{
			Queue: "reports", Group: "daily", Set: "asynq:{reports}:g:daily:3f2a", Tasks: 12, Replica: "replica-a",
		}, func() any { return new(AggregationReclaimed) }},
		{TypeTaskLost, "daily-report", TasksLost{
			Entry: "daily-report", Queue: "reports", ScheduledAt: &lostFrom, Until: until, Count: 3, Watermark: &goldenTime,
			Revision: 42, Replica: "replica-b",
		}, func() any { return new(TasksLost) }},
	}
}

func TestEventRoundTripAndGolden(t *testing.T) {
	t.Parallel()
	for i, g := range goldenEvents() {
		t.Run(g.typ, func(t *testing.T) {
			id := fmt.Sprintf("%032d", i)
			ev, err := NewEventAt(id, goldenTime.In(time.FixedZone("CET", 3600)), g.typ, "cronstream/replica-a", g.subject, g.data)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := ev.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, raw, "", "  "); err != nil {
				t.Fatal(err)
			}
			pretty.WriteByte('\n')
			path := filepath.Join("testdata", "golden", strings.TrimPrefix(g.typ, "cronstream.")+".json")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, pretty.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run TestEventRoundTripAndGolden -update to create it)", err)
			}
			if !bytes.Equal(pretty.Bytes(), want) {
				t.Fatalf("JSON of %s changed; if intended, run with -update.\ngot:\n%s\nwant:\n%s", g.typ, pretty.Bytes(), want)
			}

			// Decoding the golden file (as a reader of another version
			// would) gives back the same event and data.
			back, err := DecodeEvent(want)
			if err != nil {
				t.Fatal(err)
			}
			if back.ID != id || back.Type != g.typ || back.Source != "cronstream/replica-a" || back.Subject != g.subject ||
				!back.Time.Equal(goldenTime) || back.Time.Location() != time.UTC || back.SpecVersion != "1.0" || back.DataContentType != "application/json" {
				t.Fatalf("envelope after round trip: %+v", back)
			}
			data := g.fresh()
			if err := back.DecodeData(data); err != nil {
				t.Fatal(err)
			}
			if got := reflect.ValueOf(data).Elem().Interface(); !reflect.DeepEqual(got, g.data) {
				t.Fatalf("data after round trip:\n got %#v\nwant %#v", got, g.data)
			}
			if IsConfigType(g.typ) {
				_, e, err := DecodeConfigEvent(want)
				if err != nil || !reflect.DeepEqual(*e, g.data) {
					t.Fatalf("DecodeConfigEvent: %+v %v", e, err)
				}
			}
		})
	}
}

func TestDecodeEventIsTolerant(t *testing.T) {
	t.Parallel()
	// Unknown fields (envelope extensions, data fields of a newer version)
	// and unknown types are not errors.
	raw := `{"specversion":"1.0","id":"x1","source":"cronstream/v9","type":"cronstream.entry.teleported",
		"subject":"job","time":"2026-01-02T03:04:05Z","traceparent":"00-abc","datacontenttype":"application/json",
		"data":{"id":"job","cron":"@daily","task":{"type":"t","priority":7},"options":{},"catchup":{},"colour":"blue"}}`
	ev, err := DecodeEvent([]byte(raw))
	if err != nil || ev.Type != "cronstream.entry.teleported" {
		t.Fatalf("unknown type: %+v %v", ev, err)
	}
	var e Entry
	if err := ev.DecodeData(&e); err != nil || e.Cron != "@daily" {
		t.Fatalf("data with unknown fields: %+v %v", e, err)
	}
	// A config reader cannot apply an unknown type: an error, not a panic.
	if _, _, err := DecodeConfigEvent([]byte(raw)); !errors.Is(err, ErrMalformedEvent) || !strings.Contains(err.Error(), "unknown config event type") {
		t.Fatalf("DecodeConfigEvent of unknown type: %v", err)
	}
	known := strings.Replace(raw, "cronstream.entry.teleported", TypeEntryUpdated, 1)
	if _, e, err := DecodeConfigEvent([]byte(known)); err != nil || e.Timezone != DefaultTimezone {
		t.Fatalf("known type with unknown fields: %+v %v", e, err)
	}

	for name, bad := range map[string]string{
		"not json":        `{"specversion":`,
		"array":           `[1,2]`,
		"null":            `null`,
		"no id":           `{"specversion":"1.0","type":"t","time":"2026-01-02T03:04:05Z"}`,
		"no type":         `{"specversion":"1.0","id":"a","time":"2026-01-02T03:04:05Z"}`,
		"old specversion": `{"specversion":"0.3","id":"a","type":"t"}`,
		"bad time":        `{"specversion":"1.0","id":"a","type":"t","time":"yesterday"}`,
		"id too long":     `{"specversion":"1.0","id":"` + strings.Repeat("a", 300) + `","type":"t"}`,
		"wrong id type":   `{"specversion":"1.0","id":7,"type":"t"}`,
	} {
		if _, err := DecodeEvent([]byte(bad)); !errors.Is(err, ErrMalformedEvent) {
			t.Errorf("%s: %v, want ErrMalformedEvent", name, err)
		}
	}
	// Config events whose state contradicts their type, or whose data is
	// missing or bad, cannot be applied.
	mk := func(typ, subject string, data any) []byte {
		ev, err := NewEventAt("e", goldenTime, typ, "s", subject, data)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := ev.Marshal()
		return b
	}
	removedFlag := validEntry("job")
	removedFlag.Removed = true
	pausedFlag := validEntry("job")
	pausedFlag.Paused = true
	for name, b := range map[string][]byte{
		"removed without flag":   mk(TypeEntryRemoved, "job", validEntry("job")),
		"updated with removed":   mk(TypeEntryUpdated, "job", removedFlag),
		"paused not paused":      mk(TypeEntryPaused, "job", validEntry("job")),
		"resumed but paused":     mk(TypeEntryResumed, "job", pausedFlag),
		"subject is another id":  mk(TypeEntryUpdated, "other", validEntry("job")),
		"data not an entry":      mk(TypeEntryUpdated, "job", []int{1}),
		"data null":              mk(TypeEntryUpdated, "job", nil),
		"invalid entry":          mk(TypeEntryUpdated, "job", Entry{ID: "job"}),
		"duration as a number":   []byte(`{"specversion":"1.0","id":"a","type":"cronstream.entry.updated","subject":"job","time":"2026-01-02T03:04:05Z","data":{"id":"job","cron":"@daily","task":{"type":"t"},"jitter":30}}`),
		"activity type":          mk(TypeEntryFired, "job", Fired{Entry: "job"}),
		"config type, no data":   []byte(`{"specversion":"1.0","id":"a","type":"cronstream.entry.updated","subject":"job","time":"2026-01-02T03:04:05Z"}`),
		"payload not base64":     []byte(`{"specversion":"1.0","id":"a","type":"cronstream.entry.updated","subject":"job","time":"2026-01-02T03:04:05Z","data":{"id":"job","cron":"@daily","task":{"type":"t","payload":"%%%"}}}`),
		"catchup enum of future": mk(TypeEntryUpdated, "job", Entry{ID: "job", Cron: "@daily", Task: Task{Type: "t"}, Catchup: Catchup{Policy: "smart"}}),
	} {
		if _, _, err := DecodeConfigEvent(b); !errors.Is(err, ErrMalformedEvent) {
			t.Errorf("%s: %v, want ErrMalformedEvent", name, err)
		}
	}
	// The CloudEvents subject is optional: the NATS subject names the entry.
	if _, e, err := DecodeConfigEvent(mk(TypeEntryUpdated, "", validEntry("job"))); err != nil || e.ID != "job" {
		t.Fatalf("config event without subject: %+v %v", e, err)
	}
}
