package outbox

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/cronstream/cronstream/contract"
)

// AppendFiredEvent appends the JSON of a cronstream.entry.fired event to
// buf: byte for byte what events.NewEventAt(id, at, events.TypeEntryFired,
// source, f.Entry, f) and Event.Marshal produce (a test holds them equal),
// without reflection. The relay builds one for every scheduled fire
// (ExpandFiredRecord), so this is on the hot path: encoding through
// encoding/json twice (data, then the envelope, which re-validates and
// compacts the data) was once the largest CPU cost of a fire.
func AppendFiredEvent(buf []byte, id string, at time.Time, source string, f *contract.Fired) []byte {
	buf = appendEventHead(buf, id, at, contract.TypeEntryFired, source, f.Entry)
	buf = append(buf, `{"entry":`...)
	buf = appendJSONString(buf, f.Entry)
	buf = append(buf, `,"scheduled_at":`...)
	buf = appendJSONTime(buf, f.ScheduledAt)
	buf = append(buf, `,"enqueued_at":`...)
	buf = appendJSONTime(buf, f.EnqueuedAt)
	buf = append(buf, `,"task_id":`...)
	buf = appendJSONString(buf, f.TaskID)
	buf = append(buf, `,"queue":`...)
	buf = appendJSONString(buf, f.Queue)
	buf = append(buf, `,"revision":`...)
	buf = strconv.AppendUint(buf, f.Revision, 10)
	buf = append(buf, `,"replica":`...)
	buf = appendJSONString(buf, f.Replica)
	if f.Trigger != "" {
		buf = append(buf, `,"trigger":`...)
		buf = appendJSONString(buf, f.Trigger)
	}
	if f.Backfill {
		buf = append(buf, `,"backfill":true`...)
	}
	return append(buf, "}}"...)
}

// appendEventHead appends an event envelope's fields up to its data, as
// Event.Marshal writes them for events.NewEventAt(id, at, typ, source,
// subject, …): the caller appends the data object and the closing brace.
func appendEventHead(buf []byte, id string, at time.Time, typ, source, subject string) []byte {
	buf = append(buf, `{"specversion":`...)
	buf = appendJSONString(buf, contract.SpecVersion)
	buf = append(buf, `,"id":`...)
	buf = appendJSONString(buf, id)
	buf = append(buf, `,"source":`...)
	buf = appendJSONString(buf, source)
	buf = append(buf, `,"type":`...)
	buf = appendJSONString(buf, typ)
	if subject != "" {
		buf = append(buf, `,"subject":`...)
		buf = appendJSONString(buf, subject)
	}
	buf = append(buf, `,"time":`...)
	buf = appendJSONTime(buf, at.UTC().Truncate(time.Microsecond))
	return append(buf, `,"datacontenttype":"application/json","data":`...)
}

// appendJSONString appends s as encoding/json would: plain printable ASCII
// as is, anything else (escapes, HTML characters, non-ASCII) through
// encoding/json itself.
func appendJSONString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, err := json.Marshal(s)
			if err != nil {
				// json.Marshal of a string cannot fail; keep the output
				// valid JSON all the same.
				return append(buf, `""`...)
			}
			return append(buf, b...)
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}

// appendJSONTime appends t as time.Time's MarshalJSON does (RFC 3339 with
// nanoseconds, in t's own zone).
func appendJSONTime(buf []byte, t time.Time) []byte {
	if y := t.Year(); y < 0 || y > 9999 {
		b, err := t.MarshalJSON()
		if err != nil {
			return append(buf, `null`...)
		}
		return append(buf, b...)
	}
	buf = append(buf, '"')
	buf = t.AppendFormat(buf, time.RFC3339Nano)
	return append(buf, '"')
}
