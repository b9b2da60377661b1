// Package failpause pauses entries with pause_on_failure whose tasks are
// archived: retries exhausted, by an asynq worker or by cronstream's
// recoverer (both move the task to the queue's archived set, scored with the
// archive time). The pause is a fail-pause request (the client's FailPause,
// on <p>.failpause.<entry>): a replica's credential may publish it where it
// may not publish config, and every reader applies it only as the pause of
// an entry armed at the revision it expects. Its note names the task and
// its last error, so it shows in describe, ls, history and audit, and
// `entry resume` undoes it.
//
// Each replica runs one Watcher. It keeps an index of the armed entries
// (pause_on_failure, not paused) by queue, maintained from the
// projection's changes, so a scan costs what the armed entries cost,
// never a walk of every entry. Every Interval it reads, for each queue
// that holds an armed entry and whose duties its replica holds (Holds:
// the owner of the queue's shard 0), the archived set from the score it
// reached last time (ZRANGEBYSCORE, in bounded pages), so a large archive
// is read once, not per scan. An entry's old queue after a move is
// scanned for it too, until no busy task of the entry is left there or
// for MovedScan. A task id tells its entry (scheduler.TaskEntry); only
// tasks of armed entries have their message read, for the error.
//
// Exactly one pause: two replicas may both hold a queue's duties for a
// moment (a shard moving), and replicas of an earlier build scan as their
// queue's primary, and see the same archived task; each pauses
// conditionally on the revision it saw armed; the
// first request wins and the others get a revision conflict, see the entry
// paused on their next look and do nothing. A request can only follow the
// entry's config event directly: when something else came after it (a
// request the readers refused, a NATS server reply stored there), the
// pause waits for the entry's next config change, and the watcher says so
// (a log line per entry and revision, the error metric, Blocked). A task archived before the
// entry last became armed (a resume, or the put that set pause_on_failure)
// never pauses it: the archive time is compared with the time of the config
// event that armed the entry (its last event, or from its history when it
// changed since the archive). A pause that fails (NATS down) stays pending
// and is retried every scan, with a log line and a metric each time.
package failpause

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/lifecycle"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// Defaults of Config.
const (
	DefaultInterval = 2 * time.Second
	// MaxInterval bounds Interval: a failed task pauses its entry within
	// about this long.
	MaxInterval = 5 * time.Second
	// DefaultLookback is how far back a starting replica reads the archived
	// sets: archives while no replica ran still pause their entries.
	DefaultLookback = time.Hour
	DefaultPage     = 500
	// DefaultMaxPages bounds the pages one scan reads per queue; the rest
	// waits for the next scan.
	DefaultMaxPages = 20
	// MaxErrorLen caps the task's error in the pause note (bytes).
	MaxErrorLen = 300
	// DefaultMovedScan is how long after a queue move the entry's old
	// queue is still scanned, unless it holds no busy task of the entry
	// sooner.
	DefaultMovedScan = 24 * time.Hour
	// busyCheckEvery spaces the checks for busy tasks of a moved entry in
	// its old queue.
	busyCheckEvery = time.Minute
)

// Store reads the archived sets; *taskstate.Store implements it.
type Store interface {
	ArchivedSince(ctx context.Context, queue string, from time.Time, skip, limit int) ([]taskstate.ArchivedTask, error)
	ArchivedMessages(ctx context.Context, queue string, ids []string) ([]*taskstate.TaskMessage, []error, error)
	HasBusyTask(ctx context.Context, queue, idPrefix string) (bool, error)
}

// Projection is the registered-entry map and its changes;
// *projector.Projector implements it.
type Projection interface {
	Get(id string) (projector.State, bool)
	Subscribe() *projector.Subscription
	CaughtUp() bool
	LastSeq() uint64
}

// Entries writes the pauses and reads an entry's state and history;
// *events.Client implements it.
type Entries interface {
	FailPause(ctx context.Context, id string, rev uint64, note string) (events.Result, error)
	Get(ctx context.Context, id string) (events.Entry, uint64, error)
	History(ctx context.Context, id string) ([]events.Record, error)
}

// Config configures a Watcher. Zero values mean the defaults; Store,
// Projection and Entries are required.
type Config struct {
	Store      Store
	Projection Projection
	Entries    Entries
	Names      events.Names
	// Interval between scans (default DefaultInterval, at most MaxInterval).
	Interval time.Duration
	Lookback time.Duration // default DefaultLookback
	Page     int           // archived set members per read (default DefaultPage)
	MaxPages int           // reads per queue and scan (default DefaultMaxPages)
	// MovedScan is how long a moved entry's old queue is still scanned
	// (default DefaultMovedScan): tasks it left there may be archived
	// later, when their retries run out.
	MovedScan time.Duration
	// Holds says whether this replica scans queue's archived set and
	// publishes its pauses (it holds the queue's duties,
	// ownership.Manager.HoldsQueue); nil: every queue.
	Holds   func(queue string) bool
	Now     func() time.Time
	Logger  *slog.Logger // default slog.Default()
	Metrics *Metrics     // default NewMetrics(nil)
}

// Watcher pauses entries whose tasks were archived: one loop, Start to
// Stop; Scan runs one pass (tests call it directly).
type Watcher struct {
	p Config

	// Owned by the loop (or a test's direct Scan calls).
	// sub follows the projection (made by the first scan); armed indexes
	// the armed entries' queues by entry, and unseen holds the entries
	// with pause_on_failure first seen whose history is still to read
	// for queue moves (readMoves).
	sub     *projector.Subscription
	armed   map[string]string
	unseen  map[string]bool
	cursors map[string]*cursor    // by queue
	pending map[string]candidate  // by entry: pauses to retry
	armedAt map[string]armedSince // by entry: from history, per revision
	// queueOf is the queue each entry with pause_on_failure was last seen
	// in, and moved the old queues still scanned for it (moves seen live,
	// or read from its history at first sight).
	queueOf map[string]string
	moved   map[string]map[string]*oldQueue // by entry, then old queue
	// blocked holds, by entry, why a decided pause cannot be published
	// (reported once per entry and cause), and since when.
	blocked map[string]blockedPause
	life    lifecycle.Lifecycle

	// status is what Ready reports, set by the loop.
	status atomic.Pointer[string]
}

// blockedPause is a decided pause that cannot be published: its cause and
// since when.
type blockedPause struct {
	cause string
	since time.Time
}

// cursor is how far the archived set of one queue has been read: every
// member scored below from, and those scored from whose ids are in seen.
type cursor struct {
	from time.Time
	seen map[string]bool
}

// oldQueue is a queue an entry moved away from, scanned for its tasks
// until no busy task of it is left there, or until the bound.
type oldQueue struct {
	until   time.Time
	checked time.Time // last look for busy tasks
	idle    bool      // that look found none: done after this scan
}

// candidate is an archived task of an armed entry.
type candidate struct {
	entry, queue, task string
	at                 time.Time // archive time (whole seconds)
	errMsg             string
	// failed: a pause of this candidate failed, and may have landed all the
	// same (a publish the NATS client sent after reconnecting).
	failed bool
}

// armedSince is when an entry last became armed, as of revision rev, and
// whether a resume armed it.
type armedSince struct {
	rev     uint64
	at      time.Time
	resumed bool
}

// New returns a Watcher; Start runs it.
func New(p Config) (*Watcher, error) {
	if p.Store == nil || p.Projection == nil || p.Entries == nil {
		return nil, errors.New("failpause: Config.Store, Projection and Entries are required")
	}
	p.Interval = min(cmp.Or(max(p.Interval, 0), DefaultInterval), MaxInterval)
	p.Lookback = cmp.Or(max(p.Lookback, 0), DefaultLookback)
	p.Page = cmp.Or(max(p.Page, 0), DefaultPage)
	p.MaxPages = cmp.Or(max(p.MaxPages, 0), DefaultMaxPages)
	p.MovedScan = cmp.Or(max(p.MovedScan, 0), DefaultMovedScan)
	if p.Now == nil {
		p.Now = time.Now
	}
	if p.Logger == nil {
		p.Logger = slog.Default()
	}
	if p.Metrics == nil {
		p.Metrics = NewMetrics(nil)
	}
	return &Watcher{
		p: p, armed: map[string]string{}, unseen: map[string]bool{},
		cursors: map[string]*cursor{}, pending: map[string]candidate{}, armedAt: map[string]armedSince{},
		queueOf: map[string]string{}, moved: map[string]map[string]*oldQueue{}, blocked: map[string]blockedPause{},
	}, nil
}

// Start runs the scan loop until Stop and returns at once. Start and Stop
// follow the rules of package lifecycle (a second Start returns
// ErrAlreadyStarted, a Start after Stop ErrStopped).
func (w *Watcher) Start(ctx context.Context) error {
	if err := w.life.StartLoop(ctx, w.loop); err != nil {
		return fmt.Errorf("failpause: %w", err)
	}
	return nil
}

// Stop ends the loop, cancelling a scan in flight, and waits for it; it
// closes the subscription the scans made, started or not (a test's direct
// Scan makes one). It never fails.
func (w *Watcher) Stop(context.Context) error {
	w.life.Stop()
	if w.sub != nil {
		w.sub.Close()
	}
	return nil
}

func (w *Watcher) loop(ctx context.Context) {
	t := time.NewTicker(w.p.Interval)
	defer t.Stop()
	for {
		w.Scan(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Scan reads what was archived since the last scan and pauses the armed
// entries it belongs to, then retries pending pauses. It does nothing until
// the projection has caught up with the config stream. It returns the
// entries it paused.
func (w *Watcher) Scan(ctx context.Context) []string {
	if !w.p.Projection.CaughtUp() {
		return nil
	}
	now := w.p.Now()
	w.follow(now)
	armed := map[string]map[string]bool{} // queue -> entries
	add := func(q, entry string) {
		if w.p.Holds != nil && !w.p.Holds(q) {
			// Another replica scans this queue and publishes its pauses;
			// the conditional pause below stays the safety net.
			return
		}
		if armed[q] == nil {
			armed[q] = map[string]bool{}
		}
		armed[q][entry] = true
	}
	for id, q := range w.armed {
		add(q, id)
		for oq := range w.moved[id] {
			add(oq, id)
		}
	}
	w.p.Metrics.Queues.Set(float64(len(armed)))
	w.p.Metrics.Armed.Set(float64(len(w.armed)))
	for q, entries := range armed {
		w.checkMoved(ctx, q, entries, now)
		found, err := w.read(ctx, q, entries)
		if err != nil {
			if ctx.Err() == nil {
				w.p.Metrics.Errors.Inc()
				w.p.Logger.Warn("pause on failure: cannot read the archived tasks; retrying next scan", "queue", q, "err", err)
			}
			continue
		}
		w.doneMoved(q, entries)
		for _, c := range found {
			// The earliest archive of an entry is the one a pause names.
			if _, ok := w.pending[c.entry]; !ok {
				w.pending[c.entry] = c
			}
		}
	}
	var paused []string
	for id, c := range w.pending {
		if ctx.Err() != nil {
			break
		}
		done, ok := w.apply(ctx, &c)
		if done {
			delete(w.pending, id)
		} else {
			w.pending[id] = c
		}
		if ok {
			paused = append(paused, id)
		}
	}
	for id := range w.blocked {
		if _, ok := w.pending[id]; !ok {
			delete(w.blocked, id)
		}
	}
	w.p.Metrics.Pending.Set(float64(len(w.pending)))
	w.report()
	// Last, so a slow or failing read delays no pause; a bounded number a
	// scan, the rest next time.
	reads := 0
	for id := range w.unseen {
		st, ok := w.p.Projection.Get(id)
		if !ok || !st.Entry.PauseOnFailure {
			delete(w.unseen, id)
			continue
		}
		if reads == maxHistoryReads || !w.readMoves(ctx, &st, now) {
			break
		}
		reads++
		delete(w.unseen, id)
	}
	return paused
}

// BlockedAfter is how long a decided pause may stay unpublished before
// Ready reports it.
const BlockedAfter = time.Minute

// report sets what Ready says: the oldest pause that could not be
// published for BlockedAfter, with its cause.
func (w *Watcher) report() {
	var msg string
	var oldest time.Time
	for id, b := range w.blocked {
		if w.p.Now().Sub(b.since) >= BlockedAfter && (msg == "" || b.since.Before(oldest)) {
			msg, oldest = fmt.Sprintf("pause on failure of entry %s blocked since %s: %s", id, b.since.UTC().Format(time.RFC3339), b.cause), b.since
		}
	}
	if len(w.blocked) > 1 && msg != "" {
		msg += fmt.Sprintf(" (%d entries blocked)", len(w.blocked))
	}
	w.status.Store(&msg)
}

// Ready returns an error while a pause on failure decided at least
// BlockedAfter ago cannot be published (the entry keeps firing), saying
// why; nil otherwise. A pause that fails because NATS is unreachable is
// not reported here: readiness says NATS is down.
func (w *Watcher) Ready() error {
	if msg := w.status.Load(); msg != nil && *msg != "" {
		return errors.New(*msg)
	}
	return nil
}

func isArmed(e events.Entry) bool { return e.PauseOnFailure && !e.Paused && !e.Removed }

// read returns the archived tasks of queue's armed entries since the
// queue's cursor, moving it.
func (w *Watcher) read(ctx context.Context, queue string, entries map[string]bool) ([]candidate, error) {
	// The cursor moves only once the tasks read are in hand: a failed
	// read is read again by the next scan.
	cur := &cursor{from: w.p.Now().Add(-w.p.Lookback).Truncate(time.Second), seen: map[string]bool{}}
	if c, ok := w.cursors[queue]; ok {
		cur = &cursor{from: c.from, seen: maps.Clone(c.seen)}
	}
	prefix := w.p.Names.Prefix()
	var found []candidate
	for range w.p.MaxPages {
		// Members scored exactly from were read before; asking for that
		// many more keeps a page of new ones however many share the score.
		want := w.p.Page + len(cur.seen)
		page, err := w.p.Store.ArchivedSince(ctx, queue, cur.from, 0, want)
		if err != nil {
			return nil, err
		}
		fresh := 0
		for _, t := range page {
			if t.At.Equal(cur.from) && cur.seen[t.ID] {
				continue
			}
			fresh++
			if !t.At.Equal(cur.from) {
				cur.from, cur.seen = t.At, map[string]bool{}
			}
			cur.seen[t.ID] = true
			if entry, ok := schedule.TaskEntry(prefix, t.ID); ok && entries[entry] {
				found = append(found, candidate{entry: entry, queue: queue, task: t.ID, at: t.At})
			}
		}
		if fresh == 0 || len(page) < want {
			break
		}
	}
	if len(found) == 0 {
		w.cursors[queue] = cur
		return nil, nil
	}
	ids := make([]string, len(found))
	for i, c := range found {
		ids[i] = c.task
	}
	msgs, errs, err := w.p.Store.ArchivedMessages(ctx, queue, ids)
	if err != nil {
		return nil, err
	}
	for i := range found {
		if msgs[i] != nil {
			found[i].errMsg = msgs[i].ErrorMsg
		} else {
			// The pause still happens; the note says why there is no error.
			found[i].errMsg = fmt.Sprintf("(error unknown: %v)", errs[i])
		}
	}
	w.cursors[queue] = cur
	return found, nil
}

// apply pauses c's entry if it is still armed and was armed before c's
// archive. done says c needs no more attempts; paused that this call
// published the pause.
func (w *Watcher) apply(ctx context.Context, c *candidate) (done, paused bool) {
	st, ok := w.p.Projection.Get(c.entry)
	if !ok || !isArmed(st.Entry) {
		return true, false
	}
	if c.at.Before(st.Time) {
		// The entry changed at or after the archive's second: was that
		// change the one that armed it?
		since, err := w.armedSince(ctx, c.entry, st)
		if err != nil {
			w.fail(ctx, *c, "read the entry's history", err)
			return false, false
		}
		// Archive times are whole seconds: one in the second the entry was
		// armed may be either side of it. After a resume it counts as
		// before (never pause again for what was resumed); after the put
		// that set pause_on_failure, as after.
		if !c.at.Add(time.Second).After(since.at) || (c.at.Before(since.at) && since.resumed) {
			return true, false
		}
	}
	note := Note(c.task, c.at, c.errMsg)
	res, err := w.p.Entries.FailPause(ctx, c.entry, st.Revision, note)
	switch {
	case errors.Is(err, events.ErrNotFound), errors.Is(err, events.ErrNotArmed):
		return true, false
	case errors.Is(err, events.ErrRevisionConflict):
		e, rev, gerr := w.p.Entries.Get(ctx, c.entry)
		if c.failed && gerr == nil && e.Paused && e.Note == note {
			// An attempt that failed landed after all.
			w.paused(c, rev)
			return true, true
		}
		if gerr == nil && !st.FailPause && isArmed(e) && rev > st.Revision {
			if cur, ok := w.p.Projection.Get(c.entry); ok && cur.Revision == st.Revision && w.p.Projection.LastSeq() >= rev {
				// The projection has read the entry's later message and
				// kept the entry at its config event: a request it
				// refused, or a server reply.
				w.block(c, fmt.Sprintf("the config stream holds a message of the entry at sequence %d after its config event at %d (a fail-pause request the readers refused, or a NATS server reply stored there): a request must follow a config event, so the pause waits for the entry's next config change (entry pause, resume or put)", rev, st.Revision))
				return false, false
			}
		}
		// Another replica paused it, or someone changed it: decide again
		// on the state the projection gets next.
		return false, false
	case errors.Is(err, events.ErrSubjectNotCaptured):
		w.block(c, "the config stream does not capture the fail-pause subjects (made before them): run `cronstream streams apply`")
		return false, false
	case err != nil:
		c.failed = true
		w.fail(ctx, *c, "publish the pause", err)
		return false, false
	}
	w.paused(c, res.Revision)
	return true, true
}

// block reports, once per entry and cause, a decided pause that cannot be
// published; it is tried again every scan.
func (w *Watcher) block(c *candidate, cause string) {
	w.p.Metrics.Errors.Inc()
	if b, ok := w.blocked[c.entry]; ok && b.cause == cause {
		return
	}
	w.blocked[c.entry] = blockedPause{cause: cause, since: w.p.Now()}
	w.p.Logger.Error("pause on failure blocked: the entry keeps firing", "entry", c.entry, "task", c.task, "cause", cause)
}

// paused counts and logs the pause of c's entry at revision rev.
func (w *Watcher) paused(c *candidate, rev uint64) {
	delete(w.blocked, c.entry)
	w.p.Metrics.Paused.Inc()
	w.p.Logger.Warn("entry paused on failure: its task was archived", "entry", c.entry, "queue", c.queue,
		"task", c.task, "archived_at", c.at.Format(time.RFC3339), "revision", rev, "error", cleanError(c.errMsg))
}

func (w *Watcher) fail(ctx context.Context, c candidate, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	w.p.Metrics.Errors.Inc()
	w.p.Logger.Warn("pause on failure: cannot "+what+"; retrying next scan", "entry", c.entry, "task", c.task, "err", err)
}

// armedSince is when entry last became armed: the config event that
// starts the run of armed states ending in its current state. A run that
// goes back to the entry's first event counts from that event.
func (w *Watcher) armedSince(ctx context.Context, entry string, st projector.State) (armedSince, error) {
	if a, ok := w.armedAt[entry]; ok && a.rev == st.Revision {
		return a, nil
	}
	recs, err := w.p.Entries.History(ctx, entry)
	if err != nil {
		return armedSince{}, err
	}
	since := armedSince{rev: st.Revision, at: st.Time}
	for i := len(recs) - 1; i >= 0; i-- {
		r := recs[i]
		if r.Seq > st.Revision {
			continue // newer than the projection: decided on its next state
		}
		if r.Entry == nil || !isArmed(*r.Entry) {
			break
		}
		// HasPrefix: a gated form of the type is a resume too.
		since.at, since.resumed = r.Time, r.Event != nil && strings.HasPrefix(r.Event.Type, events.TypeEntryResumed)
	}
	if len(w.armedAt) > 4096 {
		clear(w.armedAt)
	}
	w.armedAt[entry] = since
	return since, nil
}

// NotePrefix starts every pause note of this package, so status can tell
// entries paused on failure from those paused by hand; readers refuse a
// fail-pause request whose note does not start with it.
const NotePrefix = events.FailPauseNotePrefix

// Note is the pause note for a task archived at with error errMsg: it names
// the task and its error, made safe for terminals and capped (the error at
// MaxErrorLen bytes).
func Note(task string, at time.Time, errMsg string) string {
	return fmt.Sprintf(NotePrefix+"task %s archived at %s: %s", clean(task, maxTaskIDLen), at.UTC().Format(time.RFC3339), cleanError(errMsg))
}

// maxTaskIDLen caps the task id in a note; ours are shorter, but the
// archived set is anyone's to write.
const maxTaskIDLen = 300

func cleanError(s string) string {
	if out := clean(s, MaxErrorLen); out != "" {
		return out
	}
	return "(no error message)"
}

// clean makes text from Redis safe to print: control, format and invalid
// characters become spaces, runs of space one, and the text is cut at limit
// bytes.
func clean(s string, limit int) string {
	var b strings.Builder
	space := false
	for i, w := 0, 0; i < len(s); i += w {
		r, size := utf8.DecodeRuneInString(s[i:])
		w = size
		if r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || unicode.IsSpace(r) {
			r = ' '
		}
		if r == ' ' {
			if space {
				continue
			}
			space = true
		} else {
			space = false
		}
		if b.Len()+utf8.RuneLen(r) > limit {
			return strings.TrimSpace(b.String()) + "…"
		}
		b.WriteRune(r)
	}
	return strings.TrimSpace(b.String())
}

// Metrics are the watcher's Prometheus metrics.
type Metrics struct {
	Paused  prometheus.Counter
	Errors  prometheus.Counter
	Pending prometheus.Gauge
	Queues  prometheus.Gauge
	Armed   prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Paused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_failure_pauses_total",
			Help: "Entries with pause_on_failure this replica paused because one of their tasks was archived.",
		}),
		Errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_failure_pause_errors_total",
			Help: "Failed steps of pausing on failure (reading archived sets, an entry's history, publishing the pause); each is retried on the next scan.",
		}),
		Pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_failure_pauses_pending",
			Help: "Pauses on failure decided but not yet published (retried every scan).",
		}),
		Queues: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_failure_pause_queues",
			Help: "Queues whose archived sets this replica scans (it holds their duties: it owns the queue's shard 0) because they hold entries with pause_on_failure, or did before one moved away.",
		}),
		Armed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_failure_pause_armed_entries",
			Help: "Entries armed to pause on failure (pause_on_failure, not paused), in every queue, as this replica's index holds them.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Paused, m.Errors, m.Pending, m.Queues, m.Armed)
	}
	return m
}
