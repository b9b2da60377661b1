package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// Recording what Redis lost (docs/design.md INV-restore, the lost record).
// A restore seeds a watermark Redis lost; before it does, it works out
// which fires the activity stream records that this Redis no longer holds,
// and the seeding step appends their cronstream.task.lost record
// (taskstate.RestoreWatermark), so the audit log never claims a task
// without also saying it was lost.
//
// Why the range is exact: a fire writes its task, the entry's watermark and
// its outbox record in one script; Redis replicates each script's effects
// as one unit, in order, and a replica holds a prefix of its master's
// history. The watermark only moves forward. So a promoted replica whose
// watermark is W holds every fire up to W (their tasks, unless asynq
// completed and deleted them) and none after: every tick the stream
// records as fired after W (and up to the seed) was lost, whether or not a
// worker ran it on the old master. A flush or a restart without
// persistence leaves no watermark: nothing then tells a lost task from one
// asynq completed and deleted, so the record says Unknown and names no
// tick as lost. Triggers and backfills never move the watermark; their
// losses cannot be told and are not reported.

// FiredSpan is what the activity stream records of an entry's scheduled
// fires in a span of ticks: the first and last, and how many.
type FiredSpan struct {
	First, Last time.Time
	Count       int
}

// FiredAfter reads entry's fire subject from a minute before after (a
// fire is published after its tick; the minute is for the clocks of Redis
// and NATS) to its last message, and returns the scheduled ticks (not
// triggers or backfills) fired into queue after after and at or before
// until.
func (h *StreamHistory) FiredAfter(ctx context.Context, entry, queue string, after, until time.Time) (FiredSpan, error) {
	fail := func(err error) (FiredSpan, error) {
		return FiredSpan{}, fmt.Errorf("fires of entry %q after %s: %w", entry, after.Format(time.RFC3339), err)
	}
	subj := h.names.FireSubject(entry)
	s, err := h.js.Stream(ctx, h.names.ActivityStream())
	if err != nil {
		return fail(err)
	}
	last, err := s.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return FiredSpan{}, nil
	}
	if err != nil {
		return fail(err)
	}
	from := after.Add(-time.Minute)
	if last.Time.Before(from) {
		return FiredSpan{}, nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subj}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &from,
	})
	if err != nil {
		return fail(err)
	}
	var span FiredSpan
	seen := map[int64]bool{}
	err = readConsumer(ctx, c, func(m jetstream.Msg, md *jetstream.MsgMetadata) bool {
		if tick, ok := firedTick(m.Data(), queue); ok && tick.After(after) && !tick.After(until) && !seen[tick.UnixMilli()] {
			seen[tick.UnixMilli()] = true
			span.Count++
			if span.First.IsZero() || tick.Before(span.First) {
				span.First = tick
			}
			if tick.After(span.Last) {
				span.Last = tick
			}
		}
		return md.Sequence.Stream >= last.Sequence || md.NumPending == 0
	})
	if err != nil {
		return fail(err)
	}
	return span, nil
}

// firedTick reads a scheduled fire into queue from a fire-subject event.
func firedTick(data []byte, queue string) (time.Time, bool) {
	ev, err := events.DecodeEvent(data)
	if err != nil || ev.Type != events.TypeEntryFired {
		return time.Time{}, false
	}
	var f events.Fired
	if ev.DecodeData(&f) != nil || f.Trigger != "" || f.Backfill || f.ScheduledAt.IsZero() || f.Queue != queue {
		return time.Time{}, false
	}
	return f.ScheduledAt, true
}

func (b *boundedHistory) FiredAfter(ctx context.Context, entry, queue string, after, until time.Time) (FiredSpan, error) {
	rctx, cancel, err := b.begin(ctx)
	if err != nil {
		return FiredSpan{}, fmt.Errorf("fires of %s after %s: %w", entry, after.Format(time.RFC3339), err)
	}
	span, err := b.h.FiredAfter(rctx, entry, queue, after, until)
	return span, b.end(ctx, cancel, err)
}

// lostRecord is the record of what r's watermark wm, found lost or behind,
// says Redis lost of the fires up to seed, the tick it is restored to;
// nil when the stream records no fire of the span.
func (s *Scheduler) lostRecord(ctx context.Context, r *entryRun, wm taskstate.WatermarkInfo, seed time.Time) (*taskstate.LostRecord, *events.TasksLost, error) {
	d := &events.TasksLost{Entry: r.id, Queue: r.queue, Until: seed.UTC(), Revision: r.st.Revision, Replica: s.cfg.ReplicaID}
	switch {
	case !wm.OK:
		d.Unknown = true
	case !wm.Tick.Before(seed):
		return nil, nil, nil
	default:
		w := wm.Tick.UTC()
		d.Watermark = &w
		span, err := s.firedAfter(ctx, r, w, seed)
		switch {
		case err != nil:
			d.Unknown = true
		case span.Count == 0:
			return nil, nil, nil
		default:
			first := span.First.UTC()
			d.ScheduledAt, d.Until, d.Count = &first, span.Last.UTC(), span.Count
		}
	}
	var first time.Time
	if d.ScheduledAt != nil {
		first = *d.ScheduledAt
	}
	id := events.LostEventID(r.id, first, d.Until)
	ev, err := events.NewEventAt(id, s.clock.Now(), events.TypeTaskLost, s.source(), r.id, d)
	if err != nil {
		return nil, nil, err
	}
	data, err := ev.Marshal()
	if err != nil {
		return nil, nil, err
	}
	return &taskstate.LostRecord{Record: taskstate.Record{ID: id, Data: data}, Found: wm.Tick, FoundNone: !wm.OK}, d, nil
}

// firedAfter asks History for r's fires after w up to seed.
func (s *Scheduler) firedAfter(ctx context.Context, r *entryRun, w, seed time.Time) (FiredSpan, error) {
	if s.cfg.History == nil {
		return FiredSpan{}, errors.New("no activity stream to read")
	}
	span, err := s.cfg.History.FiredAfter(ctx, r.id, r.queue, w, seed)
	if err != nil && !errors.Is(err, errStreamsUnavailable) {
		s.log.Warn("read the entry's fires the restore found lost; recorded as unknown", "entry", r.id, "queue", r.queue, "err", err)
	}
	return span, err
}

// noteLost counts and logs a lost record the restore wrote.
func (s *Scheduler) noteLost(d *events.TasksLost) {
	args := []any{"entry", d.Entry, "queue", d.Queue, "until", d.Until}
	if d.Watermark != nil {
		args = append(args, "watermark", *d.Watermark)
	}
	if d.Unknown {
		s.m.LostUnknown.Inc()
		s.log.Warn("Redis lost the entry's watermark: whether it lost tasks of fires the activity stream records cannot be told (recorded as unknown, cronstream.task.lost)", args...)
		return
	}
	s.m.LostFires.Add(float64(d.Count))
	if d.ScheduledAt != nil {
		args = append(args, "first", *d.ScheduledAt)
	}
	s.log.Warn("Redis lost fires the activity stream records: their tasks are gone (recorded as cronstream.task.lost)", append(args, "count", d.Count)...)
}
