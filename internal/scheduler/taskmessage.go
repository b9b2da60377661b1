package scheduler

import (
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// fireOrigin says what kind of fire a task is for, which its tick headers
// tell the handler (events.TaskHeaders): a scheduled tick (the zero
// value), a trigger (its request id) or a backfill.
type fireOrigin struct {
	trigger  string
	backfill bool
}

// entryTaskMessage is the asynq task of entry e's tick, with asynq's
// client defaults; the deadline is relative to the tick.
func entryTaskMessage(e events.Entry, taskID string, tick time.Time, o fireOrigin) *taskstate.TaskMessage {
	m := new(taskstate.TaskMessage)
	fillTaskMessage(m, e.Normalize(), taskID, tick, events.FormatTaskTick(tick), o)
	return m
}

// fillTaskMessage writes the task of tick (tickText as
// events.FormatTaskTick writes it) of entry e, already normalized (as the
// projection holds them), into m, without copying its payload or, unless
// it adds tick headers, its headers.
func fillTaskMessage(m *taskstate.TaskMessage, e events.Entry, taskID string, tick time.Time, tickText string, o fireOrigin) {
	*m = taskstate.TaskMessage{
		Type:      e.Task.Type,
		Payload:   e.Task.Payload,
		Headers:   events.TaskHeaders(e, tickText, o.trigger, o.backfill),
		ID:        taskID,
		Queue:     e.Options.QueueName(),
		Retry:     int32(e.Options.Retries()),
		Timeout:   int64(e.Options.Timeout.D() / time.Second),
		Retention: int64(e.Options.Retention.D() / time.Second),
		GroupKey:  e.Options.Group,
	}
	if d := e.Options.Deadline.D(); d > 0 {
		m.Deadline = tick.Add(d).Unix()
	}
}
