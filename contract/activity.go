package contract

import (
	"fmt"
	"time"
)

// Fired is the data of cronstream.entry.fired: one tick of an entry became
// one asynq task.
type Fired struct {
	Entry       string    `json:"entry"`
	ScheduledAt time.Time `json:"scheduled_at"`
	EnqueuedAt  time.Time `json:"enqueued_at"`
	TaskID      string    `json:"task_id"`
	Queue       string    `json:"queue"`
	Revision    uint64    `json:"revision"`
	Replica     string    `json:"replica"`
	// Trigger is set for a manual trigger (its request id) and Backfill for
	// a backfilled tick, so the audit log tells them from scheduled fires.
	Trigger  string `json:"trigger,omitempty"`
	Backfill bool   `json:"backfill,omitempty"`
}

// Skip reasons.
const (
	SkipMissed  = "missed"
	SkipOverlap = "overlap"
	// SkipUnique: the entry's unique option found its previous task still
	// holding asynq's unique lock.
	SkipUnique = "unique"
	// SkipExcluded: the tick matched one of the entry's exclude specs.
	SkipExcluded = "excluded"
	// SkipOverlapDropped: a tick held by overlap buffer-one was dropped
	// instead of fired, because its entry was paused, removed, moved to
	// another queue or no longer uses buffer-one.
	SkipOverlapDropped = "overlap-dropped"
	// SkipPaused: the tick was due before its entry was paused, but no
	// replica had fired it when the pause took effect (every replica down,
	// or Redis failing); the pause stops it from firing late.
	SkipPaused = "paused"
	// SkipRemoved: the tick was due before its entry was removed, but no
	// replica had fired it when the removal took effect; the removal stops
	// it from firing late.
	SkipRemoved = "removed"
)

// Skipped is the data of cronstream.entry.skipped. When many consecutive
// ticks are skipped at once, one event covers them: ScheduledAt is the first
// and Until the last, Count how many.
type Skipped struct {
	Entry       string     `json:"entry"`
	ScheduledAt time.Time  `json:"scheduled_at"`
	Until       *time.Time `json:"until,omitempty"`
	Count       int        `json:"count,omitempty"`
	Reason      string     `json:"reason"`
	Revision    uint64     `json:"revision,omitempty"`
	Replica     string     `json:"replica,omitempty"`
}

// TaskRecovered is the data of cronstream.task.retried and
// cronstream.task.archived (RetryAt is only set for retried).
type TaskRecovered struct {
	TaskID   string     `json:"task_id"`
	Queue    string     `json:"queue"`
	Type     string     `json:"type"`
	Retried  int        `json:"retried"`
	MaxRetry int        `json:"max_retry"`
	RetryAt  *time.Time `json:"retry_at,omitempty"`
	Error    string     `json:"error"`
	Replica  string     `json:"replica"`
}

// AggregationReclaimed is the data of cronstream.aggregation.reclaimed: a
// stale aggregation set's tasks went back to their group.
type AggregationReclaimed struct {
	Queue   string `json:"queue"`
	Group   string `json:"group"`
	Set     string `json:"set"`
	Tasks   int    `json:"tasks"`
	Replica string `json:"replica,omitempty"`
}

// Ways a replaced task went (TaskCancelled.Action).
const (
	// CancelDeleted: the task was waiting (pending, scheduled, retry or
	// aggregating) and was deleted in the step that fired its replacement.
	CancelDeleted = "deleted"
	// CancelRequested: the task was running; its cancellation was published
	// to asynq's workers and the replacing tick is held until it stops.
	CancelRequested = "cancel-requested"
)

// TaskCancelled is the data of cronstream.task.cancelled: a tick of an
// entry with overlap cancel-previous replaced the entry's previous task.
// It is written in the same atomic step that fires or holds the tick.
type TaskCancelled struct {
	Entry string `json:"entry"`
	Queue string `json:"queue"`
	// ScheduledAt is the replacing tick, ReplacedBy the task it fires as.
	ScheduledAt time.Time `json:"scheduled_at"`
	ReplacedBy  string    `json:"replaced_by"`
	Revision    uint64    `json:"revision,omitempty"`
	Replica     string    `json:"replica,omitempty"`
	// TaskID is the replaced task, State the asynq state it was in, Action
	// what became of it (CancelDeleted, CancelRequested).
	TaskID string `json:"task_id"`
	State  string `json:"state"`
	Action string `json:"action"`
}

// TasksLost is the data of cronstream.task.lost. Redis (the server that
// now holds the entry's queue: a replica promoted by a failover, or one
// restarted or flushed) lost data, and the entry's watermark there was
// found behind the ticks the activity stream recorded as handled. The
// step that restored the watermark wrote this record.
//
// A fire writes its task, the watermark and its record in one atomic step,
// and Redis replicates steps in order. So with a watermark W left, every
// tick the stream records as fired after W was lost: the Redis now in use
// never received its task (a worker may have run it on the server that
// did, before the failover), and no tick at or before W was. Without a
// watermark nothing tells a lost task from one asynq completed and
// deleted: Unknown is set and no tick is named as lost.
type TasksLost struct {
	Entry string `json:"entry"`
	Queue string `json:"queue"`
	// ScheduledAt and Until are the first and last tick the stream records
	// as fired after the watermark, Count how many it records from one to
	// the other (ticks skipped in between are not counted). ScheduledAt is
	// unset, and Until the last tick the stream records as handled, when
	// Unknown.
	ScheduledAt *time.Time `json:"scheduled_at,omitempty"`
	Until       time.Time  `json:"until"`
	Count       int        `json:"count"`
	// Watermark is the tick the entry's watermark held when it was found:
	// that tick and the ones before it were not lost. Unset when Redis
	// held none.
	Watermark *time.Time `json:"watermark,omitempty"`
	// Unknown: which fires up to Until lost their tasks cannot be told,
	// because Redis held no watermark of the entry, or the activity stream
	// could not be read when it was restored.
	Unknown bool `json:"unknown,omitempty"`
	// Revision is the entry's revision the watermark was restored at;
	// Replica the replica that restored it.
	Revision uint64 `json:"revision,omitempty"`
	Replica  string `json:"replica,omitempty"`
}

// Summary says what the record states, in one line (audit, describe,
// the console).
func (l TasksLost) Summary() string {
	at := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	switch {
	case l.Unknown && l.Watermark != nil:
		return fmt.Sprintf("Redis's watermark in queue %s was behind (%s): which fires up to %s lost their tasks is unknown (the activity stream could not be read)", l.Queue, at(*l.Watermark), at(l.Until))
	case l.Unknown:
		return fmt.Sprintf("Redis lost the entry's watermark in queue %s: which fires up to %s lost their tasks is unknown", l.Queue, at(l.Until))
	}
	first := l.Until
	if l.ScheduledAt != nil {
		first = *l.ScheduledAt
	}
	s := fmt.Sprintf("Redis lost the tasks of %d fires in queue %s: scheduled %s to %s", l.Count, l.Queue, at(first), at(l.Until))
	if l.Watermark != nil {
		s += " (it kept those up to " + at(*l.Watermark) + ")"
	}
	return s
}

// HeaderRedisUnconfirmed is the NATS header of an activity message whose
// Redis write the replicas had not confirmed when the relay published it
// (Redis WAIT timed out, was refused, or the replicas were already found
// behind): "<acked>/<wanted> <reason>", reason "timeout", "behind" or
// "refused". A failover to a replica may lose such a write. The message's
// data and Nats-Msg-Id are what they would be without it.
const HeaderRedisUnconfirmed = "Cronstream-Redis-Unconfirmed"

// ReplicaSource is the CloudEvents source of the events a replica writes.
func ReplicaSource(replica string) string { return "cronstream/" + replica }
