package stall

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/lifecycle"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// Projection is what the detector reads of the live projection;
// *projector.Projector implements it.
type Projection interface {
	Subscribe() *projector.Subscription
}

// Config configures a Detector. Zero values mean the defaults.
type Config struct {
	Watermarks Watermarks
	Projection Projection
	Names      events.Names
	// Now is the replica's corrected clock (clock), the one the
	// scheduler decides "due" with.
	Now func() time.Time
	// LateAfter: an entry whose tick is due for longer is late (default
	// DefaultLateAfter).
	LateAfter time.Duration
	// Interval between checks (default LateAfter/3, at most 10 s).
	Interval time.Duration
	// Firing, when set, says how long the scheduler's fire pass in
	// progress has been waiting (scheduler.Firing): a pass that hangs on
	// Redis reports no outcome. SetFiring sets it later.
	Firing func() time.Duration
	// Holding, when set, names a condition that holds back all of this
	// replica's fires (outbox backpressure), or returns "". It is added to
	// the reason of every late entry.
	Holding func() string
	// Shards, when set, are the shards this replica owns: only their
	// entries are tracked and checked (their owner checks the others;
	// ownership reports shards without one), so the detector's work is
	// its replica's share. Nil: every entry. SetShards sets it later.
	Shards  Shards
	Logger  *slog.Logger
	Metrics *Metrics
}

// Shards is the owned set the detector follows; *ownership.Manager
// implements it.
type Shards interface {
	Owned() schedule.OwnedShards
	// Changed is signalled after the owned set changed.
	Changed() <-chan struct{}
}

// Detector checks the entries of the live projection (of the shards its
// replica owns) on a timer, in one loop that owns its view of them. Observe and Outcome feed it from
// other goroutines without blocking.
type Detector struct {
	cfg   Config
	log   *slog.Logger
	m     *Metrics
	epoch time.Time // monotonic base of the durations below

	// Loop-owned. tracks holds the entries of owned shards only; owned
	// is the owned set they follow (its version), and marks, per owned
	// shard, the projection batch its tracks were built after (changes
	// of its entries in batches up to it are older than the tracks).
	tracks       map[string]*track
	owned        map[events.Shard]bool
	ownedVersion uint64
	marks        map[events.Shard]uint64
	sub          *projector.Subscription
	since        time.Time       // corrected instant the detector started
	queues       map[string]bool // queues with a late-entries series
	// reading receives the watermark read in flight (nil: none), begun at
	// readStarted.
	reading     chan readDone
	readStarted time.Time

	mu      sync.Mutex
	seen    map[string]time.Time // observed ticks not yet taken by the loop
	reasons map[string]string    // last failure per entry, cleared by a success
	// behind holds, per entry, this replica's last fire that recorded
	// missed ticks (Outcome.Missed), until it is older than LateAfter.
	behind map[string]behindMark
	late   []Late // the last check's late entries, oldest first
	streak streak
	// readFail is when watermark reads began to fail (since epoch; 0
	// while they work), readErr the last error.
	readFail time.Duration
	readErr  string

	nReasons atomic.Int64
	lastOK   atomic.Int64 // since epoch, of this replica's last successful attempt

	life lifecycle.Lifecycle
}

// streak is a run of failed or fenced fire attempts with no success.
type streak struct {
	start, last time.Duration // since epoch
	what        string
}

// New returns a detector; Start runs it.
func New(cfg Config) (*Detector, error) {
	if cfg.Watermarks == nil || cfg.Projection == nil {
		return nil, errors.New("stall: Watermarks and Projection are required")
	}
	// A negative value is taken as unset too, as it always was.
	cfg.LateAfter = cmp.Or(max(cfg.LateAfter, 0), DefaultLateAfter)
	cfg.Interval = cmp.Or(max(cfg.Interval, 0), min(cfg.LateAfter/3, 10*time.Second))
	if cfg.Now == nil { // a func: cmp.Or cannot default it
		cfg.Now = time.Now
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	m := cfg.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Detector{cfg: cfg, log: cfg.Logger, m: m, epoch: time.Now(),
		tracks: map[string]*track{}, owned: map[events.Shard]bool{}, marks: map[events.Shard]uint64{}, queues: map[string]bool{},
		seen: map[string]time.Time{}, reasons: map[string]string{}}, nil
}

// SetFiring sets Config.Firing, for a scheduler built after the detector;
// call it before Start.
func (d *Detector) SetFiring(f func() time.Duration) { d.cfg.Firing = f }

// SetShards sets Config.Shards, for an ownership built after the
// detector; call it before Start.
func (d *Detector) SetShards(s Shards) { d.cfg.Shards = s }

// tracking reports whether the entries of shard s are this replica's to
// track.
func (d *Detector) tracking(s events.Shard) bool { return d.cfg.Shards == nil || d.owned[s] }

// Start runs the checks until Stop and returns at once. Call it once the
// projection is caught up. Start and Stop follow the rules of package
// lifecycle (a second Start returns ErrAlreadyStarted, a Start after Stop
// ErrStopped).
func (d *Detector) Start(ctx context.Context) error {
	err := d.life.Start(ctx, func(context.Context) error {
		d.sub = d.cfg.Projection.Subscribe()
		d.since = d.cfg.Now()
		var moved <-chan struct{}
		if d.cfg.Shards != nil {
			moved = d.cfg.Shards.Changed()
		}
		changes := make(chan projector.Batch)
		d.life.Go(func(ctx context.Context) { d.sub.Pump(ctx, changes) })
		d.life.Go(func(ctx context.Context) { d.loop(ctx, changes, moved) })
		return nil
	})
	if err != nil {
		return fmt.Errorf("stall: %w", err)
	}
	return nil
}

// Stop stops the checks and waits for them; a watermark read in flight is
// cancelled, as there is nothing to drain. It never fails.
func (d *Detector) Stop(context.Context) error {
	d.life.Stop()
	return nil
}

func (d *Detector) loop(ctx context.Context, changes <-chan projector.Batch, moved <-chan struct{}) {
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	d.followShards()
	for {
		select {
		case <-ctx.Done():
			return
		case batch, ok := <-changes:
			if !ok {
				return
			}
			for _, c := range batch.Changes {
				d.apply(c, batch.Mark)
			}
		case <-moved:
			d.followShards()
		case <-t.C:
			d.followShards()
			d.check(ctx)
		}
	}
}

// apply follows one change of the projection, in the batch numbered mark
// (0: a batch that follows every snapshot). Only the entries of owned
// shards are tracked; a change older than the snapshot an owned shard's
// tracks were built from is ignored.
func (d *Detector) apply(c projector.Change, mark uint64) {
	var s events.Shard
	if c.New != nil {
		s = events.ShardOfEntry(c.New.Entry.Options.QueueName(), c.ID)
	}
	switch {
	case c.New == nil || !d.tracking(s):
		// Removed, or not (any more) in an owned shard.
		d.forget(c.ID)
	case mark != 0 && mark <= d.marks[s]:
	case d.tracks[c.ID] != nil:
		d.tracks[c.ID].set(*c.New)
	default:
		d.tracks[c.ID] = newTrack(*c.New)
	}
}

// forget drops entry id's track and the reason seen for it.
func (d *Detector) forget(id string) {
	if _, ok := d.tracks[id]; !ok {
		return
	}
	delete(d.tracks, id)
	d.mu.Lock()
	if _, ok := d.reasons[id]; ok {
		delete(d.reasons, id)
		d.nReasons.Add(-1)
	}
	d.mu.Unlock()
}

// followShards tracks the entries of the shards the owned set gained,
// built from a snapshot of the projection (their watermarks are read at
// the next check), and drops those of the shards it lost.
func (d *Detector) followShards() {
	if d.cfg.Shards == nil {
		return
	}
	next := d.cfg.Shards.Owned()
	if next.Version == d.ownedVersion {
		return
	}
	d.ownedVersion = next.Version
	taken := map[events.Shard]bool{}
	for s := range next.Until {
		if !d.owned[s] {
			taken[s] = true
		}
	}
	for s := range d.owned {
		if _, kept := next.Until[s]; !kept {
			delete(d.owned, s)
			delete(d.marks, s)
		}
	}
	for id, t := range d.tracks {
		if !d.owned[events.Shard{Queue: t.queue, Index: t.shard}] {
			d.forget(id)
		}
	}
	if len(taken) == 0 || d.sub == nil {
		maps.Copy(d.owned, taken)
		return
	}
	registered, _, mark := d.sub.Snapshot(func(s events.Shard) bool { return taken[s] })
	for s := range taken {
		d.owned[s], d.marks[s] = true, mark
	}
	for _, c := range registered {
		d.tracks[c.ID] = newTrack(*c.New)
	}
}

// Observe records that entry's tick was fired or skipped (an activity event
// this replica saw). It never blocks for long: one map write.
func (d *Detector) Observe(entry string, tick time.Time) {
	d.mu.Lock()
	if tick.After(d.seen[entry]) {
		d.seen[entry] = tick
	}
	d.mu.Unlock()
}

// ObservePublished is Observe for each fired or skipped event among the
// events the relay published (relay.Config.OnPublished).
func (d *Detector) ObservePublished(eventIDs []string) {
	for _, id := range eventIDs {
		if entry, tick, ok := schedule.ParseActivityID(id); ok {
			d.Observe(entry, tick)
		}
	}
}

// Outcome records what became of one of this replica's fire attempts
// (scheduler.Config.OnOutcome). Watermark mismatches say nothing: they are
// how a replica learns another fired first (across a handover, or beside
// replicas of an earlier build).
func (d *Detector) Outcome(o schedule.Outcome) {
	switch {
	case o.Err != nil:
		d.failed(o, o.Err.Error())
	case o.Status == schedule.StatusWatermarkMismatch:
	case o.Status.Refused():
		d.failed(o, "refused: "+o.Status.String())
	default:
		d.lastOK.Store(int64(time.Since(d.epoch)))
		if o.Missed {
			d.missed(o)
		}
		if d.nReasons.Load() > 0 {
			d.mu.Lock()
			if _, ok := d.reasons[o.Entry]; ok {
				delete(d.reasons, o.Entry)
				d.nReasons.Add(-1)
			}
			d.mu.Unlock()
		}
	}
}

// behindMark is this replica's last fire of an entry that recorded
// missed ticks: the tick it fired, how late, when (since epoch), and how
// many such fires came each within LateAfter of the one before.
type behindMark struct {
	tick  time.Time
	lag   time.Duration
	at    time.Duration
	count int
}

// missed records a fire that skipped missed ticks. An entry that keeps
// missing its ticks (a replica offered more than it can fire) fires its
// latest tick on time enough never to be overdue, yet shows as late while
// its fires skip (behindLate); one such fire alone (the first after a
// start, a takeover or an outage healed: catch-up) does not.
func (d *Detector) missed(o schedule.Outcome) {
	at := time.Since(d.epoch)
	d.mu.Lock()
	if d.behind == nil {
		d.behind = map[string]behindMark{}
	}
	m := d.behind[o.Entry]
	if m.count == 0 || at-m.at > d.cfg.LateAfter {
		m.count = 0
	}
	d.behind[o.Entry] = behindMark{tick: o.Tick, lag: d.cfg.Now().Sub(o.Tick), at: at, count: m.count + 1}
	d.mu.Unlock()
}

// behindLate adds to late the tracked entries not late already whose fires
// skipped missed ticks again and again, the last within LateAfter, and
// forgets older marks.
func (d *Detector) behindLate(late []Late, byQueue map[string]int) []Late {
	at := time.Since(d.epoch)
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.behind) == 0 {
		return late
	}
	already := make(map[string]bool, len(late))
	for _, l := range late {
		already[l.Entry] = true
	}
	for id, m := range d.behind {
		if at-m.at > d.cfg.LateAfter {
			delete(d.behind, id)
			continue
		}
		t := d.tracks[id]
		if t == nil || already[id] || m.count < 2 {
			continue
		}
		late = append(late, Late{Entry: id, Queue: t.queue, Tick: m.tick, Due: m.tick, OverdueSeconds: int64(m.lag / time.Second),
			Reason: fmt.Sprintf("ticks skipped as missed: this replica fires behind the schedule (its last fire %s late)", m.lag.Round(100*time.Millisecond))})
		byQueue[t.queue]++
	}
	return late
}

func (d *Detector) failed(o schedule.Outcome, text string) {
	now := time.Since(d.epoch)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.reasons[o.Entry]; !ok {
		d.nReasons.Add(1)
	}
	d.reasons[o.Entry] = text
	if d.streak.start == 0 || time.Duration(d.lastOK.Load()) >= d.streak.start || now-d.streak.last >= d.cfg.LateAfter+retryGap {
		d.streak.start = now
	}
	d.streak.last = now
	what := "entry " + o.Entry
	if !o.Tick.IsZero() {
		what += " tick " + o.Tick.UTC().Format(time.RFC3339)
	}
	d.streak.what = what + ": " + text
}

// Ready returns why the replica should not be ready, or nil: its own fire
// attempts have all failed or been fenced for longer than LateAfter, or the
// detector could not read Redis for that long.
func (d *Detector) Ready() error {
	now := time.Since(d.epoch)
	bound := d.cfg.LateAfter
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	s := d.streak
	if s.start != 0 && time.Duration(d.lastOK.Load()) < s.start && now-s.start > bound && now-s.last < bound+retryGap {
		errs = append(errs, fmt.Errorf("every fire attempt failed or was refused for %s (longer than --late-after %s); last: %s",
			(now-s.start).Round(time.Second), bound, s.what))
	}
	if f := d.firing(); f > bound {
		errs = append(errs, fmt.Errorf("fire attempts have waited for Redis for %s (longer than --late-after %s)", f.Round(time.Second), bound))
	}
	if d.readFail != 0 && now-d.readFail > bound {
		errs = append(errs, fmt.Errorf("stall detector cannot read watermarks for %s: %s", (now-d.readFail).Round(time.Second), d.readErr))
	}
	return errors.Join(errs...)
}

// retryGap is how long after its last failure a streak of failures still
// counts: the scheduler retries a refused or failed tick with a backoff of
// up to 5 s, and an attempt blocked in Redis takes up to the client's read
// timeout. A streak with no attempt for longer has ended (nothing more to
// fire, or someone else fired it).
const retryGap = 10 * time.Second

func (d *Detector) firing() time.Duration {
	if d.cfg.Firing == nil {
		return 0
	}
	return d.cfg.Firing()
}

// Late returns the late entries of the last check, oldest tick first, at
// most max of them (max ≤ 0: all), with the reasons seen for them.
func (d *Detector) Late(max int) []Late {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := len(d.late)
	if max > 0 {
		n = min(n, max)
	}
	return append([]Late(nil), d.late[:n]...)
}

// check runs one check: fresh watermarks for every entry that is late or
// looks late by what is known (watermarks only move on, so an entry that
// does not look late is not), then the late set, metrics and warnings.
func (d *Detector) check(ctx context.Context) {
	d.takeSeen()
	if !d.readWatermarks(ctx, d.stale(d.cfg.Now())) {
		return // stopped
	}
	now := d.cfg.Now()
	late, byQueue, oldest := d.lateSet(now)
	d.setLate(late)
	d.report(late, byQueue, oldest, now)
}

// takeSeen moves the ticks Observe recorded into the tracks.
func (d *Detector) takeSeen() {
	d.mu.Lock()
	seen := d.seen
	d.seen = make(map[string]time.Time, len(seen))
	d.mu.Unlock()
	for id, tick := range seen {
		if t := d.tracks[id]; t != nil && tick.After(t.seen) {
			t.seen = tick
		}
	}
}

// stale returns the tracks whose watermarks must be read: those never read
// that are due, and those late by what is known.
func (d *Detector) stale(now time.Time) []*track {
	var stale []*track
	for _, t := range d.tracks {
		if !t.known {
			if _, _, ok := t.due(); ok {
				stale = append(stale, t)
			}
			continue
		}
		if _, over, ok := t.lateness(now, d.since); ok && over > d.cfg.LateAfter {
			stale = append(stale, t)
		}
	}
	return stale
}

// readWatermarks reads the watermarks of stale in a goroutine and waits a
// moment for them; it returns false once ctx has ended. A read from an
// earlier check still out (Redis slow or stalled) is taken if it is back:
// the check never waits for Redis longer than a moment, and goes on from
// the last known watermarks.
func (d *Detector) readWatermarks(ctx context.Context, stale []*track) bool {
	bound := d.cfg.LateAfter
	if d.reading != nil {
		select {
		case r := <-d.reading:
			d.finishRead(r)
		default:
			if out := time.Since(d.readStarted); out > bound {
				d.readResult(fmt.Errorf("no answer from Redis for %s", out.Round(time.Second)))
			}
		}
	}
	if len(stale) > 0 && d.reading == nil {
		reqs := readRequests(stale)
		done := make(chan readDone, 1)
		d.reading, d.readStarted = done, time.Now()
		d.life.Go(func(context.Context) {
			rctx, cancel := context.WithTimeout(ctx, max(bound, 2*time.Second))
			defer cancel()
			done <- readDone{reqs, fetch(rctx, d.cfg.Watermarks, d.cfg.Names, reqs)}
		})
		// A healthy Redis answers well within the wait, and this check
		// then uses what it read.
		wait := time.NewTimer(min(d.cfg.Interval/2, time.Second))
		select {
		case r := <-done:
			d.finishRead(r)
		case <-wait.C:
		case <-ctx.Done():
		}
		wait.Stop()
		if ctx.Err() != nil {
			return false
		}
	}
	if len(stale) == 0 && d.reading == nil {
		// Nothing needs reading: an earlier failure is over.
		d.mu.Lock()
		d.readFail, d.readErr = 0, ""
		d.mu.Unlock()
	}
	return true
}

// lateSet returns the entries late at now, how many per queue, and the
// oldest late tick.
func (d *Detector) lateSet(now time.Time) (late []Late, byQueue map[string]int, oldest time.Time) {
	byQueue = map[string]int{}
	for _, t := range d.tracks {
		l, over, ok := t.lateness(now, d.since)
		if !ok || over <= d.cfg.LateAfter {
			continue
		}
		late = append(late, l)
		byQueue[l.Queue]++
		if oldest.IsZero() || l.Tick.Before(oldest) {
			oldest = l.Tick
		}
	}
	late = d.behindLate(late, byQueue)
	sortLate(late)
	return late, byQueue, oldest
}

// setLate gives the late entries their reasons, and what holds back all
// of this replica's fires, and keeps them for Late.
func (d *Detector) setLate(late []Late) {
	hung := ""
	if f := d.firing(); f > d.cfg.LateAfter {
		hung = fmt.Sprintf("fire attempts waiting for Redis for %s", f.Round(time.Second))
	}
	if d.cfg.Holding != nil {
		if h := d.cfg.Holding(); h != "" {
			hung = strings.TrimPrefix(hung+"; "+h, "; ")
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range late {
		if r, ok := d.reasons[late[i].Entry]; ok {
			late[i].Reason = r
		}
		if hung != "" {
			late[i].Reason = strings.TrimPrefix(late[i].Reason+"; "+hung, "; ")
		}
	}
	d.late = late
}

// report sets the metrics of the late set and warns of late entries.
func (d *Detector) report(late []Late, byQueue map[string]int, oldest, now time.Time) {
	d.m.Late.Set(float64(len(late)))
	d.m.Tracked.Set(float64(len(d.tracks)))
	for q := range d.queues {
		if byQueue[q] == 0 {
			d.m.LateByQueue.DeleteLabelValues(q)
			delete(d.queues, q)
		}
	}
	for q, n := range byQueue {
		d.m.LateByQueue.WithLabelValues(q).Set(float64(n))
		d.queues[q] = true
	}
	age := 0.0
	if !oldest.IsZero() {
		age = now.Sub(oldest).Seconds()
	}
	d.m.OldestAge.Set(age)
	d.warn(late)
}

// maxWarnings bounds the warnings of one check; the rest are counted in
// one more line.
const maxWarnings = 100

// warn logs each late entry at most once a minute.
func (d *Detector) warn(late []Late) {
	mono := time.Now()
	logged, more := 0, 0
	for _, l := range late {
		t := d.tracks[l.Entry]
		if !t.lateLogged.IsZero() && mono.Sub(t.lateLogged) < time.Minute {
			continue
		}
		if logged == maxWarnings {
			more++
			continue
		}
		t.lateLogged = mono
		logged++
		reason := l.Reason
		if reason == "" {
			reason = "no failed fire attempt seen by this replica"
		}
		d.log.Warn("entry is late: its tick did not fire", "entry", l.Entry, "queue", l.Queue,
			"tick", l.Tick.UTC().Format(time.RFC3339), "overdue", (time.Duration(l.OverdueSeconds) * time.Second).String(), "reason", reason)
	}
	if more > 0 {
		d.log.Warn("more entries are late (not logged one by one)", "entries", more, "late", len(late))
	}
}

// readDone is a finished watermark read.
type readDone struct {
	reqs []readQueue
	err  error
}

func (d *Detector) finishRead(r readDone) {
	d.reading = nil
	record(func(id string) *track { return d.tracks[id] }, r.reqs)
	d.readResult(r.err)
}

func (d *Detector) readResult(err error) {
	now := time.Since(d.epoch)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		if d.readFail != 0 {
			d.log.Info("stall detector reads watermarks again")
		}
		d.readFail, d.readErr = 0, ""
		return
	}
	d.m.ReadErrors.Inc()
	if d.readFail == 0 {
		d.readFail = now
		d.log.Warn("stall detector cannot read watermarks; checking with the last known ones", "err", err)
	}
	d.readErr = err.Error()
}

// Metrics are the detector's Prometheus metrics.
type Metrics struct {
	Late        prometheus.Gauge
	LateByQueue *prometheus.GaugeVec
	OldestAge   prometheus.Gauge
	ReadErrors  prometheus.Counter
	Tracked     prometheus.Gauge
}

// NewMetrics creates the detector's metrics and registers them with reg
// (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Late: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_late_entries", Help: "Entries whose due tick has not fired or been skipped for longer than --late-after.",
		}),
		LateByQueue: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cronstream_late_entries_by_queue", Help: "Late entries per queue (see cronstream_late_entries).",
		}, []string{"queue"}),
		OldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_late_oldest_tick_age_seconds", Help: "Age of the oldest overdue tick of a late entry (0: none late).",
		}),
		ReadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_stall_check_errors_total", Help: "Stall checks that could not read watermarks from Redis (late entries are then computed from the last known ones).",
		}),
		Tracked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_stall_tracked_entries", Help: "Entries the stall detector checks: those of the shards this replica owns.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Late, m.LateByQueue, m.OldestAge, m.ReadErrors, m.Tracked)
	}
	return m
}
