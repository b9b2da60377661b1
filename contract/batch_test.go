package contract

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestDecodeEventsBatch: a batch message decodes to its events, in order,
// each with its own id and data; a single event is a batch of one.
func TestDecodeEventsBatch(t *testing.T) {
	var parts []string
	for i := range 3 {
		ev, err := NewEventAt(fmt.Sprintf("recover:q:t%d:0:1", i), goldenTime, TypeTaskRetried, "cronstream/r1", "q",
			TaskRecovered{TaskID: fmt.Sprintf("t%d", i), Queue: "q", Type: "x", Retried: 1, MaxRetry: 3, Error: "lease expired", Replica: "r1"})
		if err != nil {
			t.Fatal(err)
		}
		b, err := ev.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, string(b))
	}
	batch := []byte(" [" + strings.Join(parts, ",") + "]")
	if !IsBatch(batch) || IsBatch([]byte(parts[0])) {
		t.Fatal("IsBatch does not tell a batch from an event")
	}
	evs, err := DecodeEvents(batch)
	if err != nil || len(evs) != 3 {
		t.Fatalf("DecodeEvents: %d events, %v", len(evs), err)
	}
	for i, ev := range evs {
		var d TaskRecovered
		if ev.ID != fmt.Sprintf("recover:q:t%d:0:1", i) || ev.DecodeData(&d) != nil || d.TaskID != fmt.Sprintf("t%d", i) {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	split, err := SplitEvents(batch)
	if err != nil || len(split) != 3 || string(split[1]) != parts[1] {
		t.Fatalf("SplitEvents: %q, %v", split, err)
	}
	one, err := DecodeEvents([]byte(parts[2]))
	if err != nil || len(one) != 1 || one[0].ID != evs[2].ID {
		t.Fatalf("a single event: %+v, %v", one, err)
	}
	if got := BatchID(3, evs[0].ID); got != "batch:3:"+evs[0].ID {
		t.Fatalf("BatchID = %q", got)
	}
}

// TestDecodeEventsMalformed: a batch that is not an array of events is an
// ErrMalformedEvent naming what is wrong, never a panic or a partial list.
func TestDecodeEventsMalformed(t *testing.T) {
	good := `{"specversion":"1.0","id":"a","type":"t","time":"` + goldenTime.Format(time.RFC3339) + `"}`
	for _, in := range []string{
		`[`, `[1]`, `["x"]`, `[` + good + `,`, `[` + good + `,{"specversion":"1.0"}]`, `[` + good + `] x`,
	} {
		evs, err := DecodeEvents([]byte(in))
		if !errors.Is(err, ErrMalformedEvent) || evs != nil {
			t.Errorf("DecodeEvents(%s) = %d events, %v; want ErrMalformedEvent", in, len(evs), err)
		}
	}
	if evs, err := DecodeEvents([]byte(`[]`)); err != nil || len(evs) != 0 {
		t.Errorf("empty batch: %d events, %v", len(evs), err)
	}
}
