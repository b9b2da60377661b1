// Package projector is the read side of the config stream: the map of
// registered entries, live and as of any moment (docs/architecture.md;
// docs/invariants.md INV-fold).
//
// It owns the one fold from config events to entry states (Fold), the live
// Projector every replica runs, its change notifications, and the
// point-in-time replays AsOfSeq and AsOfTime. It never writes to NATS
// (beyond creating and deleting its own ephemeral consumers), never touches
// Redis and never decides whether an entry fires: a paused entry is in the
// map with Paused set, and the scheduler decides.
//
// # Live projection
//
// Start reads the last message per subject of <p>.config.> and
// <p>.failpause.> (cost grows with the number of entries, not the length of
// history; an entry those messages do not decide is read from its history,
// see resolver) and then follows new events, in stream order, through an
// ephemeral ordered consumer. After a
// NATS restart, a reconnect or a stream leader change (noticed by a missed
// heartbeat, a consumer sequence gap or an error) it makes a new consumer
// that resumes after the last sequence applied, and the fold skips anything
// at or below it, so no event is lost or applied twice. The projection is caught up once it has
// applied the stream's last sequence as of Start.
//
// A new consumer first checks the stream is still the one it read: same
// creation time, not ending below the last sequence applied, the same
// message (events.ConfigMessageID) there. A stream deleted and recreated, or
// restored from an older snapshot, fails this; the projector then logs a
// warning, counts it (Stats.Reloads) and loads the new stream into a fresh
// fold. Until that load has caught up, readers see the old projection; then
// it is replaced and subscribers get the changes from the old map to the
// new, as ordinary changes.
//
// # Bad events fail closed per entry
//
// A message on <p>.config.<id> that does not decode, has a type or enum value
// this version does not know, fails validation, contradicts its type, or
// whose ids do not match the subject is counted, logged once with its stream
// sequence, and quarantines entry <id>: the entry leaves the map (a skipped
// "removed" must never leave an entry firing) until a valid event for it
// arrives. Other entries carry on. A message whose subject names no valid
// entry id is counted, logged and ignored. Nothing in a message stops the
// projection.
//
// # Fail-pause requests and server replies change nothing else
//
// A fail-pause request (<p>.failpause.<id>, events.DecodeFailPause) pauses
// entry <id> when it holds, and is otherwise refused; a NATS server's reply
// stored on an entry's subject (a request that named it as its reply
// subject, events.IsServerWritten) is refused too. A refused message leaves
// the entry as it was and never quarantines it: anyone may make the server
// answer on a config subject, and a replica may publish requests. Each one
// met while following is counted (Stats.RefusedLive) and logged once.
//
// # Change notifications
//
// A Subscription receives changes in stream order without ever blocking the
// projector: each subscription keeps at most one pending change per entry.
// A subscriber that reads slower than changes arrive gets, per entry, one
// change from the state it last saw (Old) to the latest state (New) with the
// latest sequence; a change that cancels out (registered then removed before
// it was read) is dropped. Memory per subscription is bounded by the number
// of entries, never by the rate of events. A new subscription starts from
// nothing: its first changes register every entry already in the map.
//
// # Point in time
//
// AsOfSeq and AsOfTime fold the full history (DeliverAll) up to a bound with
// a fresh Fold, independently of any live projection. The time bound is the
// stream's own timestamp (when JetStream stored the event), which is what
// "the configuration at moment T" means for an audit log: the fold stops at
// the first event stored after T.
package projector

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/lifecycle"
)

// Errors callers branch on.
var (
	// ErrStopped is returned by waits and subscriptions once the projector
	// has stopped (by Stop, or because its connection was closed; Err says
	// which), and by a Start after Stop. It is a lifecycle.ErrStopped.
	ErrStopped = fmt.Errorf("projector %w", lifecycle.ErrStopped)
	// ErrAlreadyStarted is returned by a second Start: it is the one of
	// every component (lifecycle.ErrAlreadyStarted).
	ErrAlreadyStarted = lifecycle.ErrAlreadyStarted
	// ErrClosed is returned by Next on a closed subscription.
	ErrClosed = errors.New("subscription closed")
)

// Config configures a Projector. Zero values mean the defaults.
type Config struct {
	// JS reaches the config stream, which Names names.
	JS    jetstream.JetStream
	Names events.Names
	// Logger logs bad events and consumer resets (default slog.Default()).
	Logger *slog.Logger
	// Heartbeat is the consumer's idle heartbeat (default
	// DefaultHeartbeat, held within 500ms to 15s). It bounds how stale
	// LastHeard can be on a silent stream and how fast a dead consumer is
	// noticed (two missed heartbeats).
	Heartbeat time.Duration
	// Now is the clock LastHeard is stamped with (default time.Now). A
	// replica passes its Redis-corrected clock: LastHeard is presented to
	// Redis as the replica's freshness and compared with other replicas'.
	Now func() time.Time
}

// Projector holds the live registered-entry map of one config stream. Its
// methods are safe for concurrent use.
type Projector struct {
	js    jetstream.JetStream
	names events.Names
	log   *slog.Logger
	hb    time.Duration
	now   func() time.Time

	mu       sync.RWMutex
	fold     *Fold
	subs     map[*Subscription]struct{}
	target   uint64        // stream's last sequence at Start
	caughtUp bool          // guarded by mu; also signalled by ready
	advanced chan struct{} // made by a waiter, closed when LastSeq moves
	err      error         // why the projection ended by itself

	life      lifecycle.Lifecycle
	ready     chan struct{} // closed once caught up
	stopped   chan struct{} // closed when the run goroutine has ended, or at Stop if it never ran
	stopOnce  sync.Once
	lastHeard atomic.Int64 // unix nanoseconds
	resets    atomic.Uint64
	reloads   atomic.Uint64
	// refusedLive counts the messages refused while following the stream.
	refusedLive atomic.Uint64
	// reload is the projection of a recreated or restored stream being
	// loaded; the applier owns it. Until it has caught up, readers and
	// subscribers keep the old projection.
	reload *Fold
	// reloading is set (under mu) while reload is loading: sequences of the
	// new stream say nothing about the old projection, so WaitFor waits.
	reloading bool
}

// New validates cfg and returns a projector of the config stream. It does
// nothing until Start.
func New(cfg Config) (*Projector, error) {
	if cfg.JS == nil {
		return nil, errors.New("projector: Config.JS is required")
	}
	hb := DefaultHeartbeat
	if cfg.Heartbeat != 0 {
		hb = min(max(cfg.Heartbeat, 500*time.Millisecond), 15*time.Second)
	}
	now := cfg.Now
	if now == nil { // a func: cmp.Or cannot default it
		now = time.Now
	}
	return &Projector{
		js:      cfg.JS,
		names:   cfg.Names,
		log:     cmp.Or(cfg.Logger, slog.Default()),
		hb:      hb,
		now:     now,
		fold:    NewFold(cfg.Names),
		subs:    make(map[*Subscription]struct{}),
		ready:   make(chan struct{}),
		stopped: make(chan struct{}),
	}, nil
}

// Start looks up the config stream and creates the consumer, then loads and
// follows the stream in a goroutine owned by the projector until Stop. It
// returns once the consumer exists, before the initial load is applied: use
// WaitCaughtUp or CaughtUp. ctx bounds only this setup. An error (the stream
// does not exist, NATS is unreachable) leaves the projector unstarted, and
// Start may be called again. Start and Stop follow the rules of package
// lifecycle: a second Start returns ErrAlreadyStarted, a Start after Stop
// ErrStopped.
func (p *Projector) Start(ctx context.Context) error {
	err := p.life.Start(ctx, func(ctx context.Context) error {
		r, target, err := p.open(ctx)
		if err != nil {
			return err
		}
		p.mu.Lock()
		p.target = target
		p.heard(p.now())
		if target == 0 {
			p.markCaughtUpLocked()
		}
		p.mu.Unlock()
		p.life.Go(func(ctx context.Context) { p.run(ctx, r) })
		return nil
	})
	switch {
	case errors.Is(err, lifecycle.ErrStopped):
		return ErrStopped
	case errors.Is(err, lifecycle.ErrAlreadyStarted):
		return fmt.Errorf("projector: %w", err)
	}
	return err
}

func (p *Projector) open(ctx context.Context) (*orderedReader, uint64, error) {
	name := p.names.ConfigStream()
	stream, err := p.js.Stream(ctx, name)
	if err != nil {
		return nil, 0, fmt.Errorf("projector: look up stream %s: %w", name, err)
	}
	// The last sequence is read before the consumer is created, so every
	// event up to it is in what the consumer delivers or superseded there.
	target := stream.CachedInfo().State.LastSeq
	r := &orderedReader{
		js:      p.js,
		stream:  name,
		filters: p.names.ConfigStreamSubjects(),
		policy:  jetstream.DeliverLastPerSubjectPolicy,
		hb:      p.hb,
		log:     p.log,
	}
	if err := r.open(ctx, maxCreateTimeout); err != nil {
		return nil, 0, fmt.Errorf("projector: %w", err)
	}
	return r, target, nil
}

// Stop ends the projection and waits for its goroutine, which has
// nothing to drain (ctx is for the shape all components share). The map
// stays readable; waits and subscriptions return ErrStopped. It never
// fails.
func (p *Projector) Stop(context.Context) error {
	p.life.Stop()
	// Never ran: nothing closed it.
	p.stopOnce.Do(func() { close(p.stopped) })
	return nil
}

// maxBatch bounds how many messages are decoded together and applied under
// one lock; batchQueue is how many read batches may wait for the applier.
const (
	maxBatch   = 512
	batchQueue = 2
)

// batch is messages read in stream order, handed from the reading loop to
// the applier.
type batch struct {
	msgs []message
	// pending is the consumer's count of messages after the last one.
	pending uint64
	// reload says the stream was replaced: the messages (from the new
	// stream) start a new projection.
	reload bool
}

// run reads the stream and hands batches to an applier goroutine it owns, so
// reading the next messages overlaps with decoding the previous ones (on a
// cold start both take about as long).
func (p *Projector) run(ctx context.Context, r *orderedReader) {
	defer p.stopOnce.Do(func() { close(p.stopped) })
	batches := make(chan batch, batchQueue)
	applied := make(chan struct{})
	go func() {
		defer close(applied)
		for b := range batches {
			p.apply(b)
		}
	}()
	err := p.read(ctx, r, batches)
	close(batches)
	<-applied
	r.close()
	p.mu.Lock()
	if ctx.Err() == nil {
		p.err = fmt.Errorf("projector: %w", err)
		p.log.Error("projector: stopped following the config stream", "stream", p.names.ConfigStream(), "after_seq", r.last, "err", err)
	}
	p.wakeLocked()
	p.mu.Unlock()
}

// read follows the stream until ctx ends or a terminal error, sending what
// it reads to batches.
func (p *Projector) read(ctx context.Context, r *orderedReader, batches chan<- batch) error {
	// A wait just over two heartbeats: if it passes without the iterator
	// reporting a missed heartbeat, one arrived within the last two.
	wait := 2*p.hb + p.hb/4
	cur := batch{msgs: make([]message, 0, maxBatch)}
	var behind bool    // the consumer said more messages were waiting
	var reloading bool // a reload has not yet been sent its last batch
	res := newResolver(p.js, p.names, p.log)
	for {
		// Behind the stream the next message is due at once; only at its
		// head is a wait needed (and its timer worth paying for).
		w := wait
		if behind {
			w = 0
		}
		msg, meta, err := r.next(ctx, w)
		if errors.Is(err, errStreamReplaced) {
			// Stale messages of the old stream are already sent; what the
			// reader reads next is the new stream, from the start.
			p.reloads.Add(1)
			p.log.Warn("projector: config stream was recreated or restored: reloading the projection", "stream", p.names.ConfigStream(), "after_seq", r.last, "err", err)
			r.restart()
			res = newResolver(p.js, p.names, p.log)
			reloading = true
			batches <- batch{reload: true, pending: 1}
			continue
		}
		behind = err == nil && meta.NumPending > 0
		p.resets.Store(r.resets)
		if err == nil {
			m := message{subject: msg.Subject(), seq: meta.Sequence.Stream, at: meta.Timestamp, header: msg.Headers(), data: msg.Data()}
			if m.resolve, err = res.history(ctx, m, meta.NumPending); err != nil {
				return err // ctx ended
			}
			cur.msgs = append(cur.msgs, m)
			cur.pending = meta.NumPending
			// More messages are already waiting (a cold start, a burst):
			// gather them so they are decoded in parallel. The last one
			// goes at once, so a live event is never held back. The
			// clock is read once per batch: a batch is gathered from
			// messages already waiting, so it takes a moment.
			if cur.pending > 0 && len(cur.msgs) < maxBatch {
				continue
			}
			p.heard(p.now())
		}
		if len(cur.msgs) > 0 || (reloading && errors.Is(err, errIdle)) {
			// The applier always drains the channel, so this send
			// cannot block forever. A reload of an empty stream ends
			// with an empty batch.
			if cur.pending == 0 {
				reloading = false
			}
			batches <- cur
			cur = batch{msgs: make([]message, 0, maxBatch)}
		}
		switch {
		case err == nil:
		case errors.Is(err, errIdle):
			res.done()
			p.heard(p.now().Add(-2 * p.hb))
		default:
			return err
		}
	}
}

// apply commits a batch of messages in stream order.
func (p *Projector) apply(b batch) {
	if b.reload {
		p.reload = NewFold(p.names)
		p.mu.Lock()
		p.reloading = true
		p.mu.Unlock()
		return
	}
	if p.reload != nil {
		p.applyReload(b)
		return
	}
	decoded := decodeBatch(p.names, b.msgs)
	var bad []*BadEventError
	var refused []*RefusedError
	p.mu.Lock()
	for _, d := range decoded {
		for _, ch := range commitResolved(p.fold, d, &bad, &refused) {
			for s := range p.subs {
				s.push(ch)
			}
		}
	}
	// Logged before the waiters wake: whoever waited for this batch's
	// sequence (an operator's sync, a test) finds its bad events in the log.
	logBad(p.log, bad)
	p.logRefused(refused)
	if !p.caughtUp && (p.fold.LastSeq() >= p.target || b.pending == 0) {
		p.markCaughtUpLocked()
	}
	p.wakeLocked()
	p.mu.Unlock()
}

// commitResolved commits d to fold, rebuilding d's entry from its history
// first when the initial load found its last messages undecisive (see
// resolver), and returns the changes; bad events and refused messages are
// added to bad and refused.
func commitResolved(fold *Fold, d decoded, bad *[]*BadEventError, refused *[]*RefusedError) []Change {
	var out []Change
	if d.resolve != nil {
		if ch, changed := fold.resolve(d.id, d.resolve); changed {
			out = append(out, ch)
		}
	}
	ch, changed, err := fold.commit(d)
	if changed {
		out = append(out, ch)
	}
	var re *RefusedError
	switch {
	case errors.As(err, &re):
		*refused = append(*refused, re)
	case err != nil:
		*bad = append(*bad, d.bad)
	}
	return out
}

// logRefused logs the messages refused while following the stream, one
// line each, and counts them (Stats.RefusedLive); those of the initial
// load were met by the replicas running when they were stored.
func (p *Projector) logRefused(refused []*RefusedError) {
	for _, r := range refused {
		if r.Seq <= p.target {
			continue
		}
		p.refusedLive.Add(1)
		p.log.Warn("projector: config stream message refused: the entry keeps its state", "seq", r.Seq, "subject", r.Subject, "entry", r.Entry, "reason", r.Reason)
	}
}

// applyReload folds a batch of the new stream into p.reload; once the
// consumer has nothing more, the new projection replaces the old one and
// subscribers get the changes from the old map to the new.
func (p *Projector) applyReload(b batch) {
	var bad []*BadEventError
	var refused []*RefusedError
	for _, d := range decodeBatch(p.names, b.msgs) {
		commitResolved(p.reload, d, &bad, &refused)
	}
	logBad(p.log, bad)
	if b.pending > 0 {
		return
	}
	next := p.reload
	p.reload = nil
	p.mu.Lock()
	defer p.mu.Unlock()
	changes := diff(p.fold, next)
	p.fold, p.reloading = next, false
	for _, ch := range changes {
		for s := range p.subs {
			s.push(ch)
		}
	}
	p.markCaughtUpLocked()
	p.wakeLocked()
}

// diff returns the changes that turn from's registered entries into to's:
// removals (or quarantines) of entries gone, registrations and updates of
// new or changed ones, in to's stream order.
func diff(from, to *Fold) []Change {
	var out []Change
	for id, old := range from.entries {
		if _, ok := to.entries[id]; !ok {
			_, q := to.quarantined[id]
			c := Change{ID: id, Old: old, Seq: to.LastSeq(), Quarantined: q}
			if rm := to.removed[id]; rm != nil {
				c.Seq, c.Time = rm.Revision, rm.Time // its removal event's
			}
			out = append(out, c)
		}
	}
	for id, s := range to.entries {
		old := from.entries[id]
		if old != nil && reflect.DeepEqual(*old, *s) {
			continue
		}
		out = append(out, Change{ID: id, Old: old, New: s, Seq: s.Revision, Time: s.Time})
	}
	slices.SortFunc(out, func(a, b Change) int { return cmp.Or(cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.ID, b.ID)) })
	return out
}

// logBad logs each bad event once (the fold skips duplicates without an
// error).
func logBad(log *slog.Logger, bad []*BadEventError) {
	for _, b := range bad {
		if b.Entry != "" {
			log.Warn("projector: bad config event, entry quarantined", "seq", b.Seq, "subject", b.Subject, "entry", b.Entry, "reason", b.Reason)
		} else {
			log.Warn("projector: config event on a subject without an entry id, ignored", "seq", b.Seq, "subject", b.Subject, "reason", b.Reason)
		}
	}
}

func (p *Projector) markCaughtUpLocked() {
	if !p.caughtUp {
		p.caughtUp = true
		close(p.ready)
	}
}

// wakeLocked wakes every WaitFor and Subscription.Next waiting for progress.
func (p *Projector) wakeLocked() {
	if p.advanced != nil {
		close(p.advanced)
		p.advanced = nil
	}
}

func (p *Projector) heard(t time.Time) {
	n := t.UnixNano()
	for {
		old := p.lastHeard.Load()
		if n <= old || p.lastHeard.CompareAndSwap(old, n) {
			return
		}
	}
}

// Get returns the registered entry id. Removed and quarantined entries are
// absent; a paused entry is present with Entry.Paused set.
func (p *Projector) Get(id string) (State, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.fold.Get(id)
}

// Entries returns every registered entry, sorted by id.
func (p *Projector) Entries() []State {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.fold.Entries()
}

// States returns the registered entries in no order, without copying
// them: a state is never changed once stored (a new event stores a new
// one), so callers may keep and read them but must not modify them.
func (p *Projector) States() []*State {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.fold.States()
}

// Queues returns, sorted, the queues of the registered entries and the
// queues removed entries were last in (Subscription.Removed): the queues
// whose shards replicas own (docs/design.md "Ownership"). Replicas with
// the same projection list the same queues.
func (p *Projector) Queues() []string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.fold.Queues()
}

// Len returns the number of registered entries.
func (p *Projector) Len() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.fold.Len()
}

// LastSeq returns the highest stream sequence applied (good or bad). It is
// the projection's revision fence: every event up to it is reflected.
func (p *Projector) LastSeq() uint64 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.fold.LastSeq()
}

// FenceSeq is Fold.FenceSeq of the projection: what the scheduler
// presents to the revision fence.
func (p *Projector) FenceSeq() uint64 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.fold.FenceSeq()
}

// ConfigMessageID returns events.ConfigMessageID of the config message at
// seq when seq is the highest sequence applied or FenceSeq, else "" (not
// known here).
func (p *Projector) ConfigMessageID(seq uint64) string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	switch {
	case seq == 0:
		return ""
	case seq == p.fold.LastSeq():
		return p.fold.LastMessageID()
	case seq == p.fold.fenceSeq:
		return events.ConfigMessageID(p.fold.fenceSubject, p.fold.fenceAt)
	}
	return ""
}

// Quarantined returns the entries held back by a bad event, sorted by id.
func (p *Projector) Quarantined() []Quarantine {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.fold.Quarantined()
}

// Stats returns the projection's counters.
func (p *Projector) Stats() Stats {
	p.mu.RLock()
	s := p.fold.Stats()
	p.mu.RUnlock()
	s.Resets = p.resets.Load()
	s.Reloads = p.reloads.Load()
	s.RefusedLive = p.refusedLive.Load()
	return s
}

// CaughtUp reports whether the projection has applied the stream's last
// sequence as of Start. It stays true afterwards.
func (p *Projector) CaughtUp() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.caughtUp
}

// WaitCaughtUp returns once CaughtUp is true, or with ctx's error, or
// ErrStopped.
func (p *Projector) WaitCaughtUp(ctx context.Context) error {
	select {
	case <-p.ready:
		return nil
	default:
	}
	select {
	case <-p.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.stopped:
		return ErrStopped
	}
}

// LastHeard returns when the projection last heard from the stream: a
// message, or a consumer heartbeat proving the stream alive but silent. It
// lags by up to about four heartbeats (8.5 s by default) on an idle stream,
// where only heartbeats prove the stream alive, and stops moving
// while NATS is unreachable (docs/invariants.md INV-staleness-fence).
func (p *Projector) LastHeard() time.Time {
	n := p.lastHeard.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Err returns why the projection stopped by itself (its connection was
// closed), or nil while it runs or after Stop.
func (p *Projector) Err() error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.err
}

// WaitFor returns once the projection has applied at least stream sequence
// seq (a writer that just published can read its own write), or with ctx's
// error, or ErrStopped. While a recreated stream is being reloaded it waits for
// the reload.
func (p *Projector) WaitFor(ctx context.Context, seq uint64) error {
	for {
		p.mu.Lock()
		if !p.reloading && p.fold.LastSeq() >= seq {
			p.mu.Unlock()
			return nil
		}
		ch := p.progressLocked()
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-p.stopped:
			p.mu.RLock()
			done := !p.reloading && p.fold.LastSeq() >= seq
			p.mu.RUnlock()
			if done {
				return nil
			}
			return ErrStopped
		}
	}
}

// progressLocked returns a channel closed at the next progress.
func (p *Projector) progressLocked() <-chan struct{} {
	if p.advanced == nil {
		p.advanced = make(chan struct{})
	}
	return p.advanced
}
