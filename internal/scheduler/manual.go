package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// firer is what manual fires need of Redis; *taskstate.Store implements it.
type firer interface {
	FireBatch(ctx context.Context, fences taskstate.Fences, fires []taskstate.Fire) ([]taskstate.FireResult, error)
}

// Manual fires an entry outside its schedule: a trigger now, or a backfill
// of past ticks. Both are idempotent: a retried call fires nothing twice.
// They need no running scheduler, only Redis and the streams, so the CLI
// uses them directly.
type Manual struct {
	Redis  redis.UniversalClient // the asynq Redis
	JS     jetstream.JetStream
	Names  events.Names
	Source string // who asks, for the events' source (e.g. "cronstream/cli")
	Now    func() time.Time

	// firer, when set (tests: fault injection), is used instead of a
	// Store on Redis.
	firer firer
}

// MaxBackfill bounds the ticks one backfill call considers.
const MaxBackfill = 10_000

// ErrTooManyTicks is returned by Backfill for a range with more ticks than
// MaxBackfill.
var ErrTooManyTicks = errors.New("too many ticks in the range")

// ErrBadRange is a backfill range that cannot be: its end before its start,
// or in the future.
var ErrBadRange = errors.New("bad range")

func (m Manual) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	// The CLI's local clock: Manual runs without a replica's corrected
	// clock, and its instant never decides whether a tick is due (it
	// stamps a trigger's task and events, and bounds a backfill's range).
	return time.Now()
}

func (m Manual) source() string {
	if m.Source != "" {
		return m.Source
	}
	return "cronstream/manual"
}

// Target is what a manual fire presents: the entry's state and the config
// stream's last sequence, read before the state (Load).
//
// The revision fence in a queue's slot holds the highest projection
// sequence a replica fired with, a stream-wide sequence, not an entry's
// revision. A manual fire presents ConfigSeq: no replica's projection can
// be ahead of the stream's last sequence when it was read, and the state
// read after it is at least that new, so the fence refuses a manual fire
// only when a config event landed after Load and a replica fired from it.
type Target struct {
	projector.State
	ConfigSeq uint64
}

// ErrRefused reports a manual fire the fire script refused; the error
// names the status. A refusal changed nothing in Redis.
var ErrRefused = errors.New("refused")

// manualAttempts bounds how often a manual fire refused by the revision
// fence, or because the entry moved to another queue, is built again from
// a fresh Target.
const manualAttempts = 3

// Load reads the config stream's last config event's sequence, then entry
// id's state. Fences count config events alone (projector's FenceSeq): a
// fail-pause request's sequence is left out.
func (m Manual) Load(ctx context.Context, id string) (Target, error) {
	stream, err := m.JS.Stream(ctx, m.Names.ConfigStream())
	if err != nil {
		return Target{}, fmt.Errorf("config stream: %w", err)
	}
	var configSeq uint64
	switch last, err := stream.GetLastMsgForSubject(ctx, m.Names.ConfigFilter()); {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return Target{}, fmt.Errorf("config stream: %w", err)
	default:
		configSeq = last.Sequence
	}
	cur, err := events.NewClient(m.JS, m.Names).Lookup(ctx, id)
	if err != nil {
		return Target{}, err
	}
	if cur.Err != nil {
		return Target{}, fmt.Errorf("entry %q at revision %d: %w", id, cur.Revision, cur.Err)
	}
	if !cur.FailPause {
		configSeq = max(configSeq, cur.StateRevision)
	}
	return Target{State: projector.State{Entry: cur.Entry.Normalize(), Revision: cur.Revision}, ConfigSeq: configSeq}, nil
}

// fireFresh sends one fire per item, built by build from t. Fires refused
// by the revision fence or a queue move (the configuration changed after t
// was read) are built again from a fresh Target and sent again, up to
// manualAttempts in all; each fire is idempotent, so resending is safe. It
// returns the results in item order and the Target of the last attempt.
func (m Manual) fireFresh(ctx context.Context, t Target, items int, build func(t Target, item int) (taskstate.Fire, error)) ([]taskstate.FireResult, Target, error) {
	results := make([]taskstate.FireResult, items)
	todo := make([]int, items)
	for i := range todo {
		todo[i] = i
	}
	for attempt := 1; ; attempt++ {
		fires := make([]taskstate.Fire, 0, len(todo))
		for _, i := range todo {
			f, err := build(t, i)
			if err != nil {
				return nil, t, err
			}
			fires = append(fires, f)
		}
		var again []int
		for start := 0; start < len(fires); start += DefaultBatch {
			end := min(start+DefaultBatch, len(fires))
			res, err := m.fire(ctx, taskstate.Fences{ConfigSeq: t.ConfigSeq}, fires[start:end])
			if err != nil {
				return nil, t, err
			}
			for n, r := range res {
				i := todo[start+n]
				results[i] = r
				if r.Status == taskstate.StatusRevisionFenced || r.Status == taskstate.StatusMoved {
					again = append(again, i)
				}
			}
		}
		if len(again) == 0 || attempt == manualAttempts {
			return results, t, nil
		}
		fresh, err := m.Load(ctx, t.Entry.ID)
		if err != nil {
			return nil, t, err
		}
		t, todo = fresh, again
	}
}

// refusal describes a refused fire's result.
func refusal(r taskstate.FireResult, seq uint64) string {
	switch r.Status {
	case taskstate.StatusRevisionFenced:
		return fmt.Sprintf("%s: a replica fired into the queue from config sequence %d, newer than %d read here", r.Status, r.Fence, seq)
	case taskstate.StatusMoved:
		return fmt.Sprintf("%s: the entry left the queue at config sequence %d", r.Status, r.MovedAt)
	}
	return r.Status.String()
}

// Trigger enqueues one task of t's entry now. requestID makes it
// idempotent: the same id fires once (for a day); the
// task id and the event id are derived from it. It never moves the
// watermark, so the schedule is unaffected. It returns the task id and
// whether this call created it; a refused fire is an error wrapping
// ErrRefused.
func (m Manual) Trigger(ctx context.Context, t Target, requestID string) (string, bool, error) {
	if err := events.ValidateID(requestID); err != nil {
		return "", false, fmt.Errorf("request id: %w", err)
	}
	now := m.now()
	prefix := m.Names.Prefix()
	id := t.Entry.ID
	build := func(t Target, _ int) (taskstate.Fire, error) {
		e := t.Entry
		taskID := events.TriggerTaskID(prefix, e.ID, requestID)
		rec, err := m.record(events.TriggerFiredEventID(e.ID, requestID), events.TypeEntryFired, e.ID, now, events.Fired{
			Entry: e.ID, ScheduledAt: now.UTC().Truncate(time.Second), EnqueuedAt: now.UTC(), TaskID: taskID,
			Queue: e.Options.QueueName(), Revision: t.Revision, Replica: m.source(), Trigger: requestID,
		})
		if err != nil {
			return taskstate.Fire{}, err
		}
		f := taskstate.NewTriggerFire(prefix, e.Options.QueueName(), e.ID, requestID, now, entryTaskMessage(e, taskID, now, fireOrigin{trigger: requestID}), rec)
		f.UniqueTTL = e.Options.Unique.D()
		if f.UniqueTTL > 0 {
			if f.DuplicateRecord, err = m.record(events.TriggerSkippedEventID(e.ID, requestID), events.TypeEntrySkipped, e.ID, now,
				events.Skipped{Entry: e.ID, ScheduledAt: now.UTC().Truncate(time.Second), Reason: events.SkipUnique, Revision: t.Revision, Replica: m.source()}); err != nil {
				return taskstate.Fire{}, err
			}
		}
		return f, nil
	}
	res, last, err := m.fireFresh(ctx, t, 1, build)
	if err != nil {
		return "", false, err
	}
	switch res[0].Status {
	case taskstate.StatusFired:
		return res[0].TaskID, true, nil
	case taskstate.StatusAlreadyExists:
		return res[0].TaskID, false, nil
	case taskstate.StatusDuplicate:
		return res[0].TaskID, false, fmt.Errorf("trigger %s: the unique lock is held by task %s", id, res[0].TaskID)
	}
	return "", false, fmt.Errorf("trigger %s: %w (%s)", id, ErrRefused, refusal(res[0], last.ConfigSeq))
}

// BackfillResult counts what a backfill did.
type BackfillResult struct {
	Ticks   int      // ticks of the schedule in the range
	Fired   []string // task ids created now
	Already int      // ticks that had fired before (event or task found)
	// SkippedUnique counts ticks not fired because asynq's unique lock was
	// held by another task (each has its skipped event).
	SkippedUnique int
	// Registered is when the entry's current life began (its last
	// registration); BeforeRegistration counts the range's ticks before it,
	// which are fired as asked like any other.
	Registered         time.Time
	BeforeRegistration int
}

// BackfillPlan is what a backfill would do: the range's ticks, those that
// fired already (by their fired event in the activity stream) and those it
// would fire.
type BackfillPlan struct {
	From, To time.Time
	Ticks    int         // ticks of the schedule in the range
	Already  int         // ticks with a fired event
	Todo     []time.Time // ticks to fire, oldest first
	// Registered is when the entry's current life began (its last
	// registration); BeforeRegistration counts the range's ticks before it.
	Registered         time.Time
	BeforeRegistration int
}

// PlanBackfill says what Backfill would fire of t's entry in [from, to]:
// every tick without a fired event in the activity stream. It changes
// nothing.
func (m Manual) PlanBackfill(ctx context.Context, t Target, from, to time.Time) (BackfillPlan, error) {
	plan := BackfillPlan{From: from, To: to}
	id := t.Entry.ID
	if to.Before(from) {
		return plan, fmt.Errorf("backfill %s: %w: --to %s is before --from %s", id, ErrBadRange, to.Format(time.RFC3339), from.Format(time.RFC3339))
	}
	if to.After(m.now()) {
		return plan, fmt.Errorf("backfill %s: %w: --to %s is in the future", id, ErrBadRange, to.Format(time.RFC3339))
	}
	sched, err := schedule.NewSchedule(t.Entry)
	if err != nil {
		return plan, err
	}
	ticks, more := sched.Ticks(from.Add(-time.Nanosecond), to, MaxBackfill)
	if more {
		return plan, fmt.Errorf("backfill %s: %w (more than %d); split it", id, ErrTooManyTicks, MaxBackfill)
	}
	plan.Ticks = len(ticks)
	if plan.Registered, err = m.registered(ctx, id); err != nil {
		return plan, err
	}
	for _, tick := range ticks {
		if tick.Before(plan.Registered) {
			plan.BeforeRegistration++
		}
	}
	if len(ticks) == 0 {
		return plan, nil
	}
	fired, err := m.firedTicks(ctx, id, ticks[0], ticks[len(ticks)-1])
	if err != nil {
		return plan, err
	}
	var unfired []time.Time
	for _, tick := range ticks {
		if fired[tick.Unix()] {
			plan.Already++
			continue
		}
		unfired = append(unfired, tick)
	}
	// A tick whose task is in Redis fired too (its event may not be
	// relayed yet, or never was): a preview must not count it as to fire.
	if m.Redis != nil && len(unfired) > 0 {
		refs := make([]taskstate.TaskRef, len(unfired))
		for i, tick := range unfired {
			refs[i] = taskstate.TaskRef{Queue: t.Entry.Options.QueueName(), ID: schedule.TaskID(m.Names.Prefix(), id, tick)}
		}
		states, err := taskstate.New(m.Redis).TaskStates(ctx, refs)
		if err != nil {
			return plan, err
		}
		for i, tick := range unfired {
			if states[i] != taskstate.StateGone {
				plan.Already++
				continue
			}
			plan.Todo = append(plan.Todo, tick)
		}
		return plan, nil
	}
	plan.Todo = unfired
	return plan, nil
}

// Backfill fires every tick of t's entry in [from, to] that has no fired
// event in the activity stream (the stream is the record of what fired):
// PlanBackfill, then FireBackfill.
func (m Manual) Backfill(ctx context.Context, t Target, from, to time.Time) (BackfillResult, error) {
	plan, err := m.PlanBackfill(ctx, t, from, to)
	if err != nil {
		return BackfillResult{Ticks: plan.Ticks, Already: plan.Already, Registered: plan.Registered, BeforeRegistration: plan.BeforeRegistration}, err
	}
	return m.FireBackfill(ctx, t, plan)
}

// FireBackfill fires the ticks of plan. Each fire is idempotent by task
// id, so a repeated backfill fires nothing twice (a tick whose task exists
// counts as fired already). It never moves the watermark. Ticks before the
// entry was registered fire too (the caller asked for them); the result
// counts them. When the script refuses a fire, the result holds what
// happened to the others and the error wraps ErrRefused.
func (m Manual) FireBackfill(ctx context.Context, t Target, plan BackfillPlan) (BackfillResult, error) {
	out := BackfillResult{Ticks: plan.Ticks, Already: plan.Already, Registered: plan.Registered, BeforeRegistration: plan.BeforeRegistration}
	todo := plan.Todo
	if len(todo) == 0 {
		return out, nil
	}
	id := t.Entry.ID
	prefix := m.Names.Prefix()
	now := m.now()
	build := func(t Target, i int) (taskstate.Fire, error) {
		e, tick := t.Entry, todo[i]
		queue := e.Options.QueueName()
		taskID := schedule.TaskID(prefix, e.ID, tick)
		rec, err := m.record(firedEventID(e.ID, tick), events.TypeEntryFired, e.ID, now, events.Fired{
			Entry: e.ID, ScheduledAt: tick.UTC(), EnqueuedAt: now.UTC(), TaskID: taskID, Queue: queue,
			Revision: t.Revision, Replica: m.source(), Backfill: true,
		})
		if err != nil {
			return taskstate.Fire{}, err
		}
		f := taskstate.NewBackfillFire(prefix, queue, e.ID, tick, entryTaskMessage(e, taskID, tick, fireOrigin{backfill: true}), rec)
		f.UniqueTTL = e.Options.Unique.D()
		if f.UniqueTTL > 0 {
			if f.DuplicateRecord, err = m.record(skippedEventID(e.ID, tickRange{First: tick, Last: tick, Count: 1}), events.TypeEntrySkipped, e.ID, now,
				events.Skipped{Entry: e.ID, ScheduledAt: tick, Reason: events.SkipUnique, Revision: t.Revision, Replica: m.source()}); err != nil {
				return taskstate.Fire{}, err
			}
		}
		return f, nil
	}
	res, last, err := m.fireFresh(ctx, t, len(todo), build)
	if err != nil {
		return out, err
	}
	var refused []string
	for i, r := range res {
		switch r.Status {
		case taskstate.StatusFired:
			out.Fired = append(out.Fired, r.TaskID)
		case taskstate.StatusAlreadyExists:
			out.Already++
		case taskstate.StatusDuplicate:
			out.SkippedUnique++
		default:
			refused = append(refused, todo[i].UTC().Format(time.RFC3339)+": "+refusal(r, last.ConfigSeq))
		}
	}
	if len(refused) > 0 {
		return out, fmt.Errorf("backfill %s: %w: %d of %d ticks not fired (first: %s)", id, ErrRefused, len(refused), out.Ticks, refused[0])
	}
	return out, nil
}

// registered returns when entry's current life began: the stream time of
// its last registration event (zero when its history holds none).
func (m Manual) registered(ctx context.Context, entry string) (time.Time, error) {
	recs, err := events.NewClient(m.JS, m.Names).History(ctx, entry)
	if err != nil {
		return time.Time{}, err
	}
	var at time.Time
	for _, rec := range recs {
		if rec.Event != nil && events.ConfigKind(rec.Event.Type) == events.TypeEntryRegistered {
			at = rec.Time
		}
	}
	return at, nil
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
	err = readConsumer(ctx, cons, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) bool {
		if ev, err := events.DecodeEvent(msg.Data()); err == nil && ev.Type == events.TypeEntryFired {
			var f events.Fired
			if ev.DecodeData(&f) == nil && f.Trigger == "" && !f.ScheduledAt.Before(from) && !f.ScheduledAt.After(to) {
				fired[f.ScheduledAt.Unix()] = true
			}
		}
		return meta.Sequence.Stream >= last || meta.NumPending == 0
	})
	if err != nil {
		return nil, fmt.Errorf("read fires of %s: %w", entry, err)
	}
	return fired, nil
}

func (m Manual) fire(ctx context.Context, fences taskstate.Fences, fires []taskstate.Fire) ([]taskstate.FireResult, error) {
	f := m.firer
	if f == nil {
		f = taskstate.New(m.Redis)
	}
	res, err := f.FireBatch(ctx, fences, fires)
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
