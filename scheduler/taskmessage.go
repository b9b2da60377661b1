package scheduler

import (
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/taskstate"
)

// entryTaskMessage is the asynq task of entry e's tick, with asynq's
// client defaults; the deadline is relative to the tick.
func entryTaskMessage(e events.Entry, taskID string, tick time.Time) *taskstate.TaskMessage {
	return taskMessage(e.Normalize(), taskID, tick)
}

// taskMessage is entryTaskMessage of an entry already normalized (as the
// projection holds them), without copying its payload for every fire.
func taskMessage(e events.Entry, taskID string, tick time.Time) *taskstate.TaskMessage {
	m := new(taskstate.TaskMessage)
	fillTaskMessage(m, e, taskID, tick)
	return m
}

// fillTaskMessage writes entry e's task of tick into m.
func fillTaskMessage(m *taskstate.TaskMessage, e events.Entry, taskID string, tick time.Time) {
	*m = taskstate.TaskMessage{
		Type:      e.Task.Type,
		Payload:   e.Task.Payload,
		Headers:   e.Task.Headers,
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
