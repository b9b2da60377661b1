package outbox

import (
	"bytes"
	"testing"
	"time"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/eventtest"
)

// TestAppendFiredEventMatchesEncodingJSON: the hand-written encoder writes
// exactly what NewEventAt and Event.Marshal write.
func TestAppendFiredEventMatchesEncodingJSON(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	tick := time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC)
	cases := []struct {
		name   string
		id     string
		at     time.Time
		source string
		f      contract.Fired
	}{
		{"plain", "fire:e1:1774746000", tick.Add(1234567 * time.Nanosecond), "cronstream/host-1-abc",
			contract.Fired{Entry: "e1", ScheduledAt: tick, EnqueuedAt: tick.Add(1234567 * time.Nanosecond), TaskID: "cronstream:e1:2026-03-29T01:00:00Z", Queue: "default", Revision: 42, Replica: "host-1-abc"}},
		{"local zone and odd strings", "trigger:e-2:req_1", tick.In(berlin).Add(999 * time.Nanosecond), "cronstream/<r&d>",
			contract.Fired{Entry: "e-2", ScheduledAt: tick, EnqueuedAt: tick.In(berlin).Add(time.Millisecond), TaskID: "p:e-2:trigger:req_1", Queue: "qué \"quoted\" \u2028 <b>", Replica: "<r&d>\n", Trigger: "req_1"}},
		{"backfill, zero revision, whole seconds", "fire:x:0", time.Unix(0, 0), "cronstream/cli",
			contract.Fired{Entry: "x", ScheduledAt: time.Unix(0, 0).UTC(), EnqueuedAt: time.Unix(5, 0).UTC(), TaskID: "t", Queue: "q", Backfill: true}},
		{"invalid utf-8", "fire:y:1", tick, "cronstream/\xff",
			contract.Fired{Entry: "y", ScheduledAt: tick, EnqueuedAt: tick, TaskID: "t\xfe", Queue: "q"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := eventtest.MarshalAt(t, c.id, c.at, contract.TypeEntryFired, c.source, c.f.Entry, c.f)
			got := AppendFiredEvent(nil, c.id, c.at, c.source, &c.f)
			if !bytes.Equal(got, want) {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
		})
	}
}

func BenchmarkFiredEvent(b *testing.B) {
	tick := time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC)
	f := contract.Fired{Entry: "e1", ScheduledAt: tick, EnqueuedAt: tick.Add(time.Millisecond), TaskID: "cronstream:e1:2026-03-29T01:00:00Z", Queue: "default", Revision: 42, Replica: "host-1-abc"}
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			ev, _ := contract.NewEventAt("fire:e1:1774746000", f.EnqueuedAt, contract.TypeEntryFired, "cronstream/host-1-abc", "e1", f)
			_, _ = ev.Marshal()
		}
	})
	b.Run("append", func(b *testing.B) {
		for b.Loop() {
			_ = AppendFiredEvent(make([]byte, 0, 512), "fire:e1:1774746000", f.EnqueuedAt, "cronstream/host-1-abc", &f)
		}
	})
}
