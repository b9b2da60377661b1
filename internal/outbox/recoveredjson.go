package outbox

import (
	"strconv"
	"time"

	"github.com/cronstream/cronstream/events"
)

// AppendTaskRecoveredEvent appends the JSON of a task recovery event (typ
// is events.TypeTaskRetried or events.TypeTaskArchived, about queue
// subject) to buf: byte for byte what events.NewEventAt(id, at, typ,
// source, subject, d) and Event.Marshal produce (a test holds them equal),
// without reflection. A mass recovery builds one per task while it moves
// the tasks, and encoding/json's reflection was the largest part of the
// recoverer's own CPU.
func AppendTaskRecoveredEvent(buf []byte, id string, at time.Time, typ, source, subject string, d *events.TaskRecovered) []byte {
	buf = append(buf, `{"specversion":`...)
	buf = appendJSONString(buf, events.SpecVersion)
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
	buf = append(buf, `,"datacontenttype":"application/json","data":{"task_id":`...)
	buf = appendJSONString(buf, d.TaskID)
	buf = append(buf, `,"queue":`...)
	buf = appendJSONString(buf, d.Queue)
	buf = append(buf, `,"type":`...)
	buf = appendJSONString(buf, d.Type)
	buf = append(buf, `,"retried":`...)
	buf = strconv.AppendInt(buf, int64(d.Retried), 10)
	buf = append(buf, `,"max_retry":`...)
	buf = strconv.AppendInt(buf, int64(d.MaxRetry), 10)
	if d.RetryAt != nil {
		buf = append(buf, `,"retry_at":`...)
		buf = appendJSONTime(buf, *d.RetryAt)
	}
	buf = append(buf, `,"error":`...)
	buf = appendJSONString(buf, d.Error)
	buf = append(buf, `,"replica":`...)
	buf = appendJSONString(buf, d.Replica)
	return append(buf, "}}"...)
}
