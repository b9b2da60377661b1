package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
)

// History tells the scheduler which queues an entry used before its current
// one, so a replica that did not see a queue change live still closes the
// old queue before it fires into the new one (docs/design.md
// INV-handover).
//
// Reading an entry's history costs a consumer on the config stream, and the
// question arises for every entry without a watermark in its queue — every
// entry of a fresh deployment, every new registration. EventCounts answers
// for all entries at once: an entry whose subject holds one event (its
// registration) has no earlier queue, so only entries with more events are
// read one by one.
type History interface {
	// EventCounts returns how many config events each entry's subject
	// holds, and a stream sequence the counts are at least as new as.
	EventCounts(ctx context.Context) (counts map[string]uint64, asOf uint64, err error)
	// PreviousQueues returns the queues of entry's current life (since its
	// last registration), oldest first; the current queue may be among
	// them.
	PreviousQueues(ctx context.Context, entry string) ([]string, error)

	// FiredEntries returns the entries with events on their fire subjects
	// in the activity stream, in one request.
	FiredEntries(ctx context.Context) (map[string]bool, error)
	// LastHandledAll returns, in one pass, the last scheduled tick the
	// activity stream recorded for every entry whose fire subject's last
	// message is one (fired, or skipped as a tick); entries whose last
	// message is a trigger or a backfill are left out.
	LastHandledAll(ctx context.Context) (map[string]time.Time, error)
	// LastHandled returns the last scheduled tick the activity stream
	// recorded for entry (fired, or skipped as a tick: not a trigger or a
	// backfill) and its task id; ok is false when there is none.
	LastHandled(ctx context.Context, entry string) (tick time.Time, taskID string, ok bool, err error)
	// FiredSince counts entry's scheduled ticks (not triggers or
	// backfills) the activity stream recorded as fired under a revision at
	// or after since: the count of a fire limit (events.Entry.MaxFires).
	// Fires the stream no longer holds (its retention) are not counted;
	// the tally says when such fires may have been.
	FiredSince(ctx context.Context, entry string, since uint64) (FireTally, error)
	// FiredAfter returns the scheduled ticks (not triggers or backfills)
	// the activity stream records as fired into queue after after and at
	// or before until: what a restore found lost (lost.go).
	FiredAfter(ctx context.Context, entry, queue string, after, until time.Time) (FiredSpan, error)
	// ScheduleStart returns when entry's current schedule began, by the
	// stream's clock: the event that (re)registered it, last changed its
	// cron spec or time zone, or followed a paused state; and, when that
	// event restarted it after a pause or removal, that stop. ok is false
	// when its history holds no applicable event.
	ScheduleStart(ctx context.Context, entry string) (start ScheduleStart, ok bool, err error)
	// StopSince returns, for an entry whose last state is paused or whose
	// last event removed it, when it stopped firing (the first of its
	// trailing paused states, or the removal of a running entry) and when
	// the schedule it stopped had begun (by ScheduleStart's rules, as of
	// the stop). ok is false when the entry is neither. upTo, when not 0,
	// is the last config sequence read: the state the entry was found in,
	// whatever came after it.
	StopSince(ctx context.Context, entry string, upTo uint64) (span StopSpan, ok bool, err error)
	// ConfigMessageAt returns the subject and events.ConfigMessageID of
	// the config stream's message at seq; found is false when the stream
	// has no message there (beyond its last sequence, or deleted).
	ConfigMessageAt(ctx context.Context, seq uint64) (subject, id string, found bool, err error)
}

// StreamHistory is the History of a config stream.
type StreamHistory struct {
	js     jetstream.JetStream
	names  events.Names
	client *events.Client
}

// NewStreamHistory returns the History of names' config stream.
func NewStreamHistory(js jetstream.JetStream, names events.Names) *StreamHistory {
	return &StreamHistory{js: js, names: names, client: events.NewClient(js, names)}
}

// Connected reports whether the client's NATS connection is up; the firing
// loop's reads fail at once while it is not (boundedHistory).
func (h *StreamHistory) Connected() bool { return h.js.Conn().IsConnected() }

// EventCounts reads the per-subject message counts of the config stream in
// one stream-info request (paged by the client for very many subjects).
func (h *StreamHistory) EventCounts(ctx context.Context) (map[string]uint64, uint64, error) {
	s, err := h.js.Stream(ctx, h.names.ConfigStream())
	if err != nil {
		return nil, 0, fmt.Errorf("config event counts: %w", err)
	}
	// One filter over both of an entry's subjects, config events and
	// fail-pause requests; other subjects the stream may hold are left out
	// below.
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(h.names.EveryEntryRevisionFilter()))
	if err != nil {
		return nil, 0, fmt.Errorf("config event counts: %w", err)
	}
	counts := make(map[string]uint64, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		if id, _, ok := h.names.EntryFromHistorySubject(subj); ok {
			counts[id] += n
		}
	}
	return counts, info.State.LastSeq, nil
}

// ConfigMessageAt reads one message of the config stream by sequence.
func (h *StreamHistory) ConfigMessageAt(ctx context.Context, seq uint64) (string, string, bool, error) {
	s, err := h.js.Stream(ctx, h.names.ConfigStream())
	if err != nil {
		return "", "", false, fmt.Errorf("config message %d: %w", seq, err)
	}
	msg, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, fmt.Errorf("config message %d: %w", seq, err)
	}
	return msg.Subject, events.ConfigMessageID(msg.Subject, msg.Time), true, nil
}

// PreviousQueues reads entry's config history.
func (h *StreamHistory) PreviousQueues(ctx context.Context, entry string) ([]string, error) {
	recs, err := h.client.History(ctx, entry)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, rec := range recs {
		if rec.Entry == nil {
			continue
		}
		if rec.Event != nil && events.ConfigKind(rec.Event.Type) == events.TypeEntryRegistered {
			// Queues of an earlier life of the entry no longer matter.
			seen, out = map[string]bool{}, nil
		}
		q := rec.Entry.Options.QueueName()
		if !seen[q] {
			seen[q] = true
			out = append(out, q)
		}
	}
	return out, nil
}

// ScheduleStart is when an entry's current schedule began (Since) and,
// when it began by restarting after a stop (a resume, or a registration
// after a removal), that stop (zero otherwise): ticks of the schedule it
// stopped (Stop.From, nil when none ran) due before the stop may be
// unhandled.
type ScheduleStart struct {
	Since time.Time
	Stop  StopSpan
}

// ScheduleStart reads entry's config history. Its rules are the
// scheduler's for a live change (walkSchedule).
func (h *StreamHistory) ScheduleStart(ctx context.Context, entry string) (ScheduleStart, bool, error) {
	recs, err := h.client.History(ctx, entry)
	if err != nil {
		return ScheduleStart{}, false, err
	}
	w := walkSchedule(recs)
	return ScheduleStart{Since: w.since, Stop: w.restart}, w.live, nil
}

// StopSpan is when an entry stopped firing (Stopped) and when the
// schedule it stopped had begun (Since), by the stream's clock; Removed
// says the stop was its removal rather than a pause, Revision is the
// config sequence of the event that stopped it, and From the entry as it
// ran before it (nil when no schedule ran: registered paused).
type StopSpan struct {
	Stopped, Since time.Time
	Removed        bool
	Revision       uint64
	From           *events.Entry
}

// StopSince reads entry's config history, with ScheduleStart's rules.
func (h *StreamHistory) StopSince(ctx context.Context, entry string, upTo uint64) (StopSpan, bool, error) {
	recs, err := h.client.History(ctx, entry)
	if err != nil {
		return StopSpan{}, false, err
	}
	if upTo != 0 {
		recs = slices.DeleteFunc(recs, func(r events.Record) bool { return r.Seq > upTo })
	}
	w := walkSchedule(recs)
	switch {
	case w.live && w.paused:
		return w.pause, true, nil
	case !w.live && w.removed:
		return w.removal, true, nil
	}
	return StopSpan{}, false, nil
}

// scheduleWalk is what an entry's config history says of its schedule.
type scheduleWalk struct {
	since        time.Time // when the current schedule began
	pause        StopSpan  // the stop the entry is paused after, when paused
	live, paused bool      // the entry exists; its last state is paused
	// removal is when the entry stopped firing if its last valid event
	// removed it (removed): the removal, or the pause it was in then.
	removal StopSpan
	removed bool
	// restart is the stop the current schedule began right after (zero:
	// no such stop).
	restart StopSpan
}

// walkSchedule folds config records: an entry that was removed or
// quarantined (a bad event) starts afresh at its next valid event, and an
// event after a paused state or with another cron spec or time zone starts
// a new schedule; other changes (payload, queue, note...) do not. A run of
// paused states began at its first; one that began with a registration
// right after a removal stopped the entry at that removal, since nothing
// ran in between.
func walkSchedule(recs []events.Record) scheduleWalk {
	var w scheduleWalk
	var prev *events.Entry
	for _, rec := range recs {
		e := rec.Entry
		if e == nil {
			prev, w.removed = nil, false // quarantined, not removed
			continue
		}
		if e.Removed {
			if prev != nil {
				w.removal, w.removed = StopSpan{Stopped: rec.Time, Since: w.since, Removed: true, Revision: rec.Seq, From: prev}, true
				if prev.Paused {
					w.removal = w.pause
				}
			}
			prev = nil
			continue
		}
		afterRemoval := prev == nil && w.removed
		w.removed = false
		if e.Paused && (prev == nil || !prev.Paused) {
			switch {
			case afterRemoval:
				w.pause = w.removal
			case prev == nil:
				// Registered paused: no schedule ran before it.
				w.pause = StopSpan{Stopped: rec.Time, Since: rec.Time, Revision: rec.Seq}
			default:
				w.pause = StopSpan{Stopped: rec.Time, Since: w.since, Revision: rec.Seq, From: prev}
			}
		}
		if prev == nil || prev.Paused || prev.Cron != e.Cron || prev.Timezone != e.Timezone {
			w.since, w.restart = rec.Time, StopSpan{}
			switch {
			case e.Paused:
			case afterRemoval:
				w.restart = w.removal
			case prev != nil && prev.Paused:
				w.restart = w.pause
			}
		}
		prev = e
	}
	w.live, w.paused = prev != nil, prev != nil && prev.Paused
	return w
}

// FiredEntries reads the per-subject counts of the activity stream's fire
// subjects in one stream-info request.
func (h *StreamHistory) FiredEntries(ctx context.Context) (map[string]bool, error) {
	s, err := h.js.Stream(ctx, h.names.ActivityStream())
	if err != nil {
		return nil, fmt.Errorf("fired entries: %w", err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(h.names.FireSubject("*")))
	if err != nil {
		return nil, fmt.Errorf("fired entries: %w", err)
	}
	out := make(map[string]bool, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		if id, ok := h.names.EntryFromFireSubject(subj); ok && n > 0 {
			out[id] = true
		}
	}
	return out, nil
}

// lookBack bounds how far before the subject's last message LastHandled
// searches when that message is a trigger or a backfill.
const lookBack = 24 * time.Hour

// LastHandled reads entry's last fire-subject message and, when that is a
// trigger or a backfill (which never move the watermark), the messages of
// the day before it.
func (h *StreamHistory) LastHandled(ctx context.Context, entry string) (time.Time, string, bool, error) {
	subj := h.names.FireSubject(entry)
	s, err := h.js.Stream(ctx, h.names.ActivityStream())
	if err != nil {
		return time.Time{}, "", false, err
	}
	last, err := s.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return time.Time{}, "", false, nil
	}
	if err != nil {
		return time.Time{}, "", false, err
	}
	if tick, task, ok := handledTick(last.Data); ok {
		return tick, task, true, nil
	}
	since := last.Time.Add(-lookBack)
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subj}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
	})
	if err != nil {
		return time.Time{}, "", false, err
	}
	var tick time.Time
	var task string
	found := false
	err = readConsumer(ctx, c, func(m jetstream.Msg, md *jetstream.MsgMetadata) bool {
		if t, id, ok := handledTick(m.Data()); ok && (!found || t.After(tick)) {
			tick, task, found = t, id, true
		}
		return md.Sequence.Stream >= last.Sequence || md.NumPending == 0
	})
	if err != nil {
		return time.Time{}, "", false, fmt.Errorf("read %s: %w", subj, err)
	}
	return tick, task, found, nil
}

// readWait bounds the wait for each message of readConsumer.
const readWait = 5 * time.Second

// readConsumer hands each message of c to each until it returns true,
// through one iterator: an ordered consumer's Next (a fetch) would replace
// its consumer for every message and delete the one before, which no role
// may (deploy/nats/permissions.conf). The server removes the consumer
// after its inactive threshold.
func readConsumer(ctx context.Context, c jetstream.Consumer, each func(jetstream.Msg, *jetstream.MsgMetadata) (done bool)) error {
	it, err := c.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		mctx, cancel := context.WithTimeout(ctx, readWait)
		m, err := it.Next(jetstream.NextContext(mctx))
		cancel()
		if err != nil {
			return err
		}
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		if each(m, md) {
			return nil
		}
	}
}

// FireTally is what the activity stream holds of an entry's fires under
// a limit: Count of them, and, when the stream may have dropped some of
// them (its retention: max age, messages or bytes, or a per-subject
// limit), the span [GapFrom, GapTo) of publish times whose events may be
// gone. GapTo is zero when the stream holds every event published since
// the limit's revision (GapFrom, the revision's time).
type FireTally struct {
	Count          int
	GapFrom, GapTo time.Time
}

// FiredSince reads entry's fire subject from its first message; a tick
// counts once however often its fired event was published. The limits
// drop the oldest messages first, so the stream holds every event
// published after the revision's time when its first retained message (or
// the subject's, once the subject is at a per-subject limit) is no later.
func (h *StreamHistory) FiredSince(ctx context.Context, entry string, since uint64) (FireTally, error) {
	fail := func(err error) (FireTally, error) {
		return FireTally{}, fmt.Errorf("count fires of entry %q: %w", entry, err)
	}
	var t FireTally
	cs, err := h.js.Stream(ctx, h.names.ConfigStream())
	if err != nil {
		return fail(err)
	}
	switch rev, err := cs.GetMsg(ctx, since); {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// Unknown revision time: anything the stream dropped may count.
	case err != nil:
		return fail(err)
	default:
		t.GapFrom = rev.Time
	}
	subj := h.names.FireSubject(entry)
	s, err := h.js.Stream(ctx, h.names.ActivityStream())
	if err != nil {
		return fail(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fail(err)
	}
	switch st := info.State; {
	case st.FirstSeq <= 1:
		// Nothing dropped yet.
	case st.Msgs == 0:
		t.GapTo = st.LastTime.Add(time.Nanosecond) // everything dropped
	case st.FirstTime.After(t.GapFrom):
		t.GapTo = st.FirstTime
	}
	last, err := s.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return t, nil
	}
	if err != nil {
		return fail(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		return fail(err)
	}
	ticks := map[int64]bool{}
	first := true
	err = readConsumer(ctx, c, func(m jetstream.Msg, md *jetstream.MsgMetadata) bool {
		if ev, err := events.DecodeEvent(m.Data()); err == nil && ev.Type == events.TypeEntryFired {
			var f events.Fired
			if ev.DecodeData(&f) == nil && f.Trigger == "" && !f.Backfill && !f.ScheduledAt.IsZero() && f.Revision >= since {
				ticks[f.ScheduledAt.UnixMilli()] = true
			}
		}
		if limit := info.Config.MaxMsgsPerSubject; first && limit > 0 && int64(md.NumPending)+1 >= limit && md.Timestamp.After(t.GapFrom) && md.Timestamp.After(t.GapTo) {
			t.GapTo = md.Timestamp // the subject is full: older events of it may be gone
		}
		first = false
		return md.Sequence.Stream >= last.Sequence || md.NumPending == 0
	})
	if err != nil {
		return fail(fmt.Errorf("read %s: %w", subj, err))
	}
	t.Count = len(ticks)
	return t, nil
}

// LastHandledAll reads the last message of every fire subject through one
// ordered consumer.
func (h *StreamHistory) LastHandledAll(ctx context.Context) (map[string]time.Time, error) {
	s, err := h.js.Stream(ctx, h.names.ActivityStream())
	if err != nil {
		return nil, fmt.Errorf("last handled ticks: %w", err)
	}
	filter := h.names.FireSubject("*")
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("last handled ticks: %w", err)
	}
	out := make(map[string]time.Time, len(info.State.Subjects))
	if len(info.State.Subjects) == 0 {
		return out, nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("last handled ticks: %w", err)
	}
	it, err := c.Messages()
	if err != nil {
		return nil, fmt.Errorf("last handled ticks: %w", err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("last handled ticks: %w", err)
		}
		if id, ok := h.names.EntryFromFireSubject(m.Subject()); ok {
			if tick, _, ok := handledTick(m.Data()); ok && tick.After(out[id]) {
				out[id] = tick
			}
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("last handled ticks: %w", err)
		}
		// Fires go on while it reads: stop at the stream's end as it was.
		if md.NumPending == 0 || md.Sequence.Stream >= info.State.LastSeq {
			return out, nil
		}
	}
}

// handledTick reads the tick a fire-subject event moved the watermark to.
func handledTick(data []byte) (time.Time, string, bool) {
	ev, err := events.DecodeEvent(data)
	if err != nil {
		return time.Time{}, "", false
	}
	switch ev.Type {
	case events.TypeEntryFired:
		var f events.Fired
		if ev.DecodeData(&f) != nil || f.Trigger != "" || f.Backfill || f.ScheduledAt.IsZero() {
			return time.Time{}, "", false
		}
		return f.ScheduledAt, f.TaskID, true
	case events.TypeEntrySkipped:
		var sk events.Skipped
		if ev.DecodeData(&sk) != nil || sk.ScheduledAt.IsZero() {
			return time.Time{}, "", false
		}
		if sk.Until != nil {
			return *sk.Until, "", true
		}
		return sk.ScheduledAt, "", true
	case events.TypeTaskLost:
		// Written in the step that seeded the watermark at Until.
		var l events.TasksLost
		if ev.DecodeData(&l) != nil || l.Until.IsZero() {
			return time.Time{}, "", false
		}
		return l.Until, "", true
	}
	return time.Time{}, "", false
}

// historyRefresh bounds how often the event counts and the fired entries
// are read: each lists every entry's subject, and registrations arrive in
// bursts.
const historyRefresh = time.Second

// historyCache holds what History said about all entries, for the loop
// goroutine.
type historyCache struct {
	counts   map[string]uint64
	asOf     uint64
	countsAt clock.Mono
	fired    map[string]bool
	firedAt  clock.Mono
	fires    lastFiresCache

	// countsFailed and firedErr: the last EventCounts and FiredEntries
	// reads failed.
	countsFailed bool
	firedErr     error
}

// errHistoryLater: the cached counts predate the entry's revision and may
// not be read again yet; the entry stays loading.
var errHistoryLater = errors.New("config event counts are older than the entry")

// onlyRegistration reports whether r's config subject holds nothing but
// its registration, by event counts for all entries read at most once per
// historyRefresh (one request, however many entries ask). When the counts
// predate r's revision and may not be read again yet it returns
// errHistoryLater; when they cannot be read it answers false (read the
// entry's history instead).
func (s *Scheduler) onlyRegistration(ctx context.Context, r *entryRun) (bool, error) {
	h := &s.hist
	if h.counts == nil || h.asOf < r.st.Revision {
		if s.clock.Since(h.countsAt) < historyRefresh {
			if h.countsFailed {
				// As when the read fails: read the entry's history (which
				// fails at once while stream reads pause), not one entry
				// per historyRefresh.
				return false, nil
			}
			return false, errHistoryLater
		}
		h.countsAt = s.clock.Mono()
		counts, asOf, err := s.cfg.History.EventCounts(ctx)
		h.countsFailed = err != nil
		if err != nil {
			s.log.Warn("read config event counts", "err", err)
		} else {
			h.counts, h.asOf = counts, asOf
		}
	}
	return h.counts != nil && h.asOf >= r.st.Revision && h.counts[r.id] <= 1, nil
}

// previousQueues returns r's earlier queues, or nil when it cannot have
// any: its subject holds only its registration. errHistoryLater asks the
// caller to come back after historyRefresh.
func (s *Scheduler) previousQueues(ctx context.Context, r *entryRun) ([]string, error) {
	if s.cfg.History == nil {
		return nil, nil
	}
	if only, err := s.onlyRegistration(ctx, r); only || err != nil {
		return nil, err
	}
	prev, err := s.cfg.History.PreviousQueues(ctx, r.id)
	if err != nil {
		// INV-staleness-fence: without NATS nobody can change the config either,
		// so keep firing on what is known.
		if errors.Is(err, errStreamsUnavailable) {
			// Paused after a failure boundedHistory logged: one line
			// per entry would flood the log.
			return nil, nil
		}
		s.log.Warn("read the entry's earlier queues; firing without closing them", "entry", r.id, "err", err)
		return nil, nil
	}
	return prev, nil
}

// scheduleStart returns when r's current schedule began, for an entry
// loaded at start whose watermark is older than its last config event: if
// only a field other than the schedule changed while no replica ran, the
// ticks between the watermark and that change were missed, not ticks of an
// earlier schedule. It answers r.floor when r's subject holds only its
// registration or the history cannot be read (INV-staleness-fence: keep firing).
// errHistoryLater asks the caller to come back after historyRefresh.
func (s *Scheduler) scheduleStart(ctx context.Context, r *entryRun) (ScheduleStart, error) {
	floor := ScheduleStart{Since: r.floor}
	if s.cfg.History == nil {
		return floor, nil
	}
	if only, err := s.onlyRegistration(ctx, r); only || err != nil {
		return floor, err
	}
	start, ok, err := s.cfg.History.ScheduleStart(ctx, r.id)
	if err != nil {
		if !errors.Is(err, errStreamsUnavailable) {
			s.log.Warn("read the entry's config history; missed ticks before its last change are not caught up", "entry", r.id, "err", err)
		}
		return floor, nil
	}
	if !ok || start.Since.After(r.floor) {
		return floor, nil
	}
	return start, nil
}

// stopSince returns when paused or removed r stopped firing and when the
// schedule it stopped had begun, for an entry found paused or removed with
// a tick between its watermark and its last config event. ok is false when
// there is nothing to go by: no history, only a registration (registered
// paused), or a read that failed (logged; those ticks then stay
// unrecorded). errHistoryLater asks the caller to come back after
// historyRefresh.
func (s *Scheduler) stopSince(ctx context.Context, r *entryRun) (StopSpan, bool, error) {
	if s.cfg.History == nil {
		return StopSpan{}, false, nil
	}
	if only, err := s.onlyRegistration(ctx, r); only || err != nil {
		return StopSpan{}, false, err
	}
	// As of the state the run was found in: changes since wait for this
	// (foundStopped).
	span, ok, err := s.cfg.History.StopSince(ctx, r.id, r.settle.revision)
	if err != nil {
		if !errors.Is(err, errStreamsUnavailable) {
			s.log.Warn("read the entry's config history; ticks due before its pause or removal that no replica fired are not recorded", "entry", r.id, "err", err)
		}
		return StopSpan{}, false, nil
	}
	return span, ok, nil
}

// lastHandled is the last scheduled tick of r the activity stream holds;
// err is set when the stream could not tell (read failed now, or which
// entries fired could not be read within historyRefresh).
func (s *Scheduler) lastHandled(ctx context.Context, r *entryRun) (time.Time, string, bool, error) {
	if s.cfg.History == nil {
		return time.Time{}, "", false, nil
	}
	h := &s.hist
	if !h.fired[r.id] && s.clock.Since(h.firedAt) >= historyRefresh {
		h.firedAt = s.clock.Mono()
		fired, err := s.cfg.History.FiredEntries(ctx)
		h.firedErr = err
		switch {
		case err == nil:
			h.fired = fired
		case !errors.Is(err, errStreamsUnavailable):
			s.log.Warn("read which entries fired; not restoring lost watermarks from the stream", "err", err)
		}
	}
	if !h.fired[r.id] {
		return time.Time{}, "", false, h.firedErr
	}
	tick, task, ok, err := s.cfg.History.LastHandled(ctx, r.id)
	if err != nil {
		if !errors.Is(err, errStreamsUnavailable) {
			s.log.Warn("read the entry's last fire to restore its watermark", "entry", r.id, "err", err)
		}
		return time.Time{}, "", false, err
	}
	if !ok {
		return time.Time{}, "", false, nil
	}
	if !s.plausible(r.id, tick) {
		// Seeding it would stop the entry until then.
		return time.Time{}, "", false, nil
	}
	return tick, task, true, nil
}

// plausible reports whether tick, read back from the activity stream as
// entry's last fire, can be a replica's fire: one far ahead of the clock is
// a forged event (or a publisher's wrong clock), counted, logged and
// ignored.
func (s *Scheduler) plausible(entry string, tick time.Time) bool {
	ahead := tick.Sub(s.clock.Now())
	if ahead <= implausibleAhead {
		return true
	}
	s.m.Implausible.Inc()
	s.log.Warn("the entry's last fire in the activity stream is far ahead of the clock (forged?): ignored", "entry", entry, "tick", tick.UTC().Format(time.RFC3339), "ahead", ahead.Round(time.Second))
	return false
}

// implausibleAhead is how far ahead of the scheduler's clock a tick read
// back from the activity stream is taken as implausible: no replica fires
// a tick before it is due, and the replicas' clocks are corrected to
// Redis's.
const implausibleAhead = time.Minute
