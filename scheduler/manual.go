package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/taskstate"
)

// Firer is what manual fires need of Redis; *taskstate.Store implements it.
type Firer interface {
	FireBatch(ctx context.Context, fires []taskstate.Fire) ([]taskstate.FireResult, error)
}

// Manual fires an entry outside its schedule: a trigger now, or a backfill
// of past ticks. Both are idempotent: a retried call fires nothing twice.
// They need no running scheduler, only Redis and the streams, so the CLI
// uses them directly.
type Manual struct {
	Firer  Firer
	JS     jetstream.JetStream
	Names  events.Names
	Source string // who asks, for the events' source (e.g. "cronstream/cli")
	Now    func() time.Time
}

// MaxBackfill bounds the ticks one backfill call considers.
const MaxBackfill = 10_000

// ErrTooManyTicks is returned by Backfill for a range with more ticks than
// MaxBackfill.
var ErrTooManyTicks = errors.New("too many ticks in the range")

func (m Manual) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

func (m Manual) source() string {
	if m.Source != "" {
		return m.Source
	}
	return "cronstream/manual"
}

// Trigger enqueues one task of st's entry now. requestID makes it
// idempotent: the same id fires once (for taskstate.DefaultTriggerTTL); the
// task id and the event id are derived from it. It never moves the
// watermark, so the schedule is unaffected. It returns the task id and
// whether this call created it.
func (m Manual) Trigger(ctx context.Context, st projector.State, requestID string) (string, bool, error) {
	if err := events.ValidateID(requestID); err != nil {
		return "", false, fmt.Errorf("request id: %w", err)
	}
	now := m.now()
	prefix := m.Names.Prefix()
	e := st.Entry
	taskID := prefix + ":" + e.ID + ":trigger:" + requestID
	id := "trigger:" + e.ID + ":" + requestID
	rec, err := m.record(id, events.TypeEntryFired, e.ID, now, events.Fired{
		Entry: e.ID, ScheduledAt: now.UTC().Truncate(time.Second), EnqueuedAt: now.UTC(), TaskID: taskID,
		Queue: e.Options.QueueName(), Revision: st.Revision, Replica: m.source(), Trigger: requestID,
	})
	if err != nil {
		return "", false, err
	}
	f := taskstate.Fire{
		Prefix: prefix, Entry: e.ID, Queue: e.Options.QueueName(), Kind: taskstate.FireTrigger,
		Tick: now, RequestID: requestID, Msg: TaskMessage(e, taskID, now),
		UniqueTTL: e.Options.Unique.D(), FiredRecord: rec, ConfigSeq: st.Revision,
	}
	if f.UniqueTTL > 0 {
		if f.DuplicateRecord, err = m.record("skip:"+e.ID+":trigger:"+requestID, events.TypeEntrySkipped, e.ID, now,
			events.Skipped{Entry: e.ID, ScheduledAt: now.UTC().Truncate(time.Second), Reason: events.SkipUnique, Revision: st.Revision, Replica: m.source()}); err != nil {
			return "", false, err
		}
	}
	res, err := m.fire(ctx, []taskstate.Fire{f})
	if err != nil {
		return "", false, err
	}
	switch res[0].Status {
	case taskstate.StatusFired:
		return res[0].TaskID, true, nil
	case taskstate.StatusAlreadyExists:
		return res[0].TaskID, false, nil
	case taskstate.StatusDuplicate:
		return res[0].TaskID, false, fmt.Errorf("trigger %s: the unique lock is held by task %s", e.ID, res[0].TaskID)
	}
	return "", false, fmt.Errorf("trigger %s: refused (%s)", e.ID, res[0].Status)
}

// BackfillResult counts what a backfill did.
type BackfillResult struct {
	Ticks   int      // ticks of the schedule in the range
	Fired   []string // task ids created now
	Already int      // ticks that had fired before (event or task found)
}

// Backfill fires every tick of st's entry in [from, to] that has no fired
// event in the activity stream (the stream is the record of what fired).
// Each fire is idempotent by task id, so a repeated backfill fires nothing
// twice. It never moves the watermark.
func (m Manual) Backfill(ctx context.Context, st projector.State, from, to time.Time) (BackfillResult, error) {
	var out BackfillResult
	if to.Before(from) {
		return out, fmt.Errorf("backfill %s: --to %s is before --from %s", st.Entry.ID, to.Format(time.RFC3339), from.Format(time.RFC3339))
	}
	if to.After(m.now()) {
		return out, fmt.Errorf("backfill %s: --to %s is in the future", st.Entry.ID, to.Format(time.RFC3339))
	}
	sched, err := NewSchedule(st.Entry)
	if err != nil {
		return out, err
	}
	ticks, more := sched.Ticks(from.Add(-time.Nanosecond), to, MaxBackfill)
	if more {
		return out, fmt.Errorf("backfill %s: %w (more than %d); split it", st.Entry.ID, ErrTooManyTicks, MaxBackfill)
	}
	out.Ticks = len(ticks)
	if len(ticks) == 0 {
		return out, nil
	}
	fired, err := m.firedTicks(ctx, st.Entry.ID, ticks[0], ticks[len(ticks)-1])
	if err != nil {
		return out, err
	}
	prefix := m.Names.Prefix()
	now := m.now()
	queue := st.Entry.Options.QueueName()
	var fires []taskstate.Fire
	for _, tick := range ticks {
		if fired[tick.Unix()] {
			out.Already++
			continue
		}
		taskID := TaskID(prefix, st.Entry.ID, tick)
		id := firedEventID(st.Entry.ID, tick)
		rec, err := m.record(id, events.TypeEntryFired, st.Entry.ID, now, events.Fired{
			Entry: st.Entry.ID, ScheduledAt: tick.UTC(), EnqueuedAt: now.UTC(), TaskID: taskID, Queue: queue,
			Revision: st.Revision, Replica: m.source(), Backfill: true,
		})
		if err != nil {
			return out, err
		}
		f := taskstate.Fire{
			Prefix: prefix, Entry: st.Entry.ID, Queue: queue, Kind: taskstate.FireBackfill, Tick: tick,
			Msg: TaskMessage(st.Entry, taskID, tick), FiredRecord: rec, ConfigSeq: st.Revision,
			UniqueTTL: st.Entry.Options.Unique.D(),
		}
		if f.UniqueTTL > 0 {
			if f.DuplicateRecord, err = m.record(skippedEventID(st.Entry.ID, tickRange{First: tick, Last: tick, Count: 1}), events.TypeEntrySkipped, st.Entry.ID, now,
				events.Skipped{Entry: st.Entry.ID, ScheduledAt: tick, Reason: events.SkipUnique, Revision: st.Revision, Replica: m.source()}); err != nil {
				return out, err
			}
		}
		fires = append(fires, f)
	}
	for start := 0; start < len(fires); start += DefaultBatch {
		batch := fires[start:min(start+DefaultBatch, len(fires))]
		res, err := m.fire(ctx, batch)
		if err != nil {
			return out, err
		}
		for _, r := range res {
			switch r.Status {
			case taskstate.StatusFired:
				out.Fired = append(out.Fired, r.TaskID)
			default:
				out.Already++
			}
		}
	}
	return out, nil
}

// firedTicks reads the fired events of entry with scheduled times in
// [from, to] from the activity stream.
func (m Manual) firedTicks(ctx context.Context, entry string, from, to time.Time) (map[int64]bool, error) {
	fired := map[int64]bool{}
	stream, err := m.JS.Stream(ctx, m.Names.ActivityStream())
	if err != nil {
		return nil, fmt.Errorf("activity stream: %w", err)
	}
	subject := m.Names.FireSubject(entry)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return nil, fmt.Errorf("activity stream: %w", err)
	}
	if info.State.Subjects[subject] == 0 {
		return fired, nil
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return nil, fmt.Errorf("read fires of %s: %w", entry, err)
	}
	last := info.State.LastSeq
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			return nil, fmt.Errorf("read fires of %s: %w", entry, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return nil, err
		}
		if ev, err := events.DecodeEvent(msg.Data()); err == nil && ev.Type == events.TypeEntryFired {
			var f events.Fired
			if ev.DecodeData(&f) == nil && f.Trigger == "" && !f.ScheduledAt.Before(from) && !f.ScheduledAt.After(to) {
				fired[f.ScheduledAt.Unix()] = true
			}
		}
		if meta.Sequence.Stream >= last || meta.NumPending == 0 {
			return fired, nil
		}
	}
}

func (m Manual) fire(ctx context.Context, fires []taskstate.Fire) ([]taskstate.FireResult, error) {
	res, err := m.Firer.FireBatch(ctx, fires)
	if err != nil {
		return nil, err
	}
	for _, r := range res {
		if r.Err != nil {
			return nil, r.Err
		}
	}
	return res, nil
}

func (m Manual) record(id, typ, entry string, now time.Time, data any) (taskstate.Record, error) {
	ev, err := events.NewEventAt(id, now, typ, m.source(), entry, data)
	if err != nil {
		return taskstate.Record{}, err
	}
	b, err := ev.Marshal()
	return taskstate.Record{ID: id, Data: b}, err
}
