package outbox

import (
	"bytes"
	"testing"
	"time"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/eventtest"
)

// TestAppendTaskRecoveredEventMatchesEncodingJSON: the hand-written encoder
// writes exactly what NewEventAt and Event.Marshal write.
func TestAppendTaskRecoveredEventMatchesEncodingJSON(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 29, 1, 0, 0, 1234567, time.UTC)
	retryAt := now.Add(45 * time.Second).Truncate(time.Second)
	localRetry := retryAt.In(berlin)
	cases := []struct {
		name         string
		id, typ, src string
		subject      string
		at           time.Time
		d            contract.TaskRecovered
	}{
		{"retried", "recovered:default:t1:0:1774746000", contract.TypeTaskRetried, "cronstream/host-1-abc", "default", now,
			contract.TaskRecovered{TaskID: "t1", Queue: "default", Type: "email:send", Retried: 1, MaxRetry: 25, RetryAt: &retryAt, Error: "asynq: task lease expired", Replica: "host-1-abc"}},
		{"archived, no retry time", "recovered:q:t2:25:1774746000", contract.TypeTaskArchived, "cronstream/r", "q", now.In(berlin),
			contract.TaskRecovered{TaskID: "t2", Queue: "q", Type: "x", Retried: 25, MaxRetry: 25, Error: "asynq: task lease expired", Replica: "r"}},
		{"local zone and odd strings", "recovered:qué:<t&3>:0:1", contract.TypeTaskRetried, "cronstream/<r&d>\n", "qué \"quoted\" \u2028", now.Add(999 * time.Nanosecond),
			contract.TaskRecovered{TaskID: "<t&3>", Queue: "qué \"quoted\" \u2028", Type: "a\tb", RetryAt: &localRetry, Error: "e\x01", Replica: "<r&d>\n"}},
		{"invalid utf-8, empty subject, negative counts", "recovered:y:1", contract.TypeTaskRetried, "cronstream/\xff", "", time.Unix(0, 0),
			contract.TaskRecovered{TaskID: "t\xfe", Queue: "", Retried: -1, MaxRetry: -2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := eventtest.MarshalAt(t, c.id, c.at, c.typ, c.src, c.subject, c.d)
			got := AppendTaskRecoveredEvent(nil, c.id, c.at, c.typ, c.src, c.subject, &c.d)
			if !bytes.Equal(got, want) {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
		})
	}
}
