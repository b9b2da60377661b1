package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/schedule"
)

// Restoring a lost watermark (docs/design.md INV-restore). Redis lost an
// entry's watermark (or holds one older than a tick known to be handled).
// The replica that notices first knows the later of its own position
// (r.handled) and the activity stream's last tick, but a fire whose record
// went with Redis before the relay published it is in neither when another
// running replica made it: that replica's position is the only trace. So a
// replica does not seed the watermark from what it knows alone: it
// proposes its seed in the queue's slot (taskstate ProposeRestore, raised
// only) and holds the entry. Beside the loop, every replica reads the
// restore proposals of its queues once per restoreCheck and raises each
// one below its own position for the entry (raiseProposals); its own fires
// of the entry fail meanwhile and hold it too. Once the proposal has
// settled (RestoreSettle after its creation, by Redis TIME) every running
// replica has read it several times, and the first replica to come back
// seeds the watermark from it and clears it. Redis refuses every fire
// meanwhile: the watermark is gone, so no fire's compare-and-set matches
// (but one of a replica that holds no position for the entry and took it
// for one that never fired: a replica started just after the loss).
// A replica that cannot reach Redis for longer than the settle delay may
// raise the proposal too late; that is the bound.
//
// Without the activity stream (NATS down) the proposal is made of the
// replicas' positions alone: a replica with no position of its own (the
// entry's shard moved to it just as Redis lost the data) opens the proposal
// without one (taskstate OpenRestore) for the others to raise. An entry no
// running replica holds a position for waits for the stream, as it cannot
// tell an entry that never fired from one whose fires it cannot read.

// DefaultRestoreSettle is Config.RestoreSettle's default: six of the
// replicas' proposal reads (restoreCheck), and shorter than DefaultGrace,
// so the ticks held meanwhile fire late, not missed.
const DefaultRestoreSettle = 3 * time.Second

// restoreCheck is how often a replica reads its queues' restore proposals
// (raiseProposals).
const restoreCheck = 500 * time.Millisecond

// ErrRestoring is the Outcome.Err of an entry whose watermark Redis lost:
// its fires are held until the restore proposal settles, or, when no
// running replica holds a position for it, until the activity stream can
// be read.
var ErrRestoring = errors.New("watermark lost in Redis: firing held while it is restored")

// restoreSeed is what this replica proposes for r's lost watermark: its
// position or the stream's last tick, whichever is later (from: "cursor",
// "stream"; "" when it knows neither).
type restoreSeed struct {
	tick time.Time
	task string
	from string
}

// restoreStep is where restore left an entry.
type restoreStep uint8

const (
	// restoreNone: there was nothing to seed (the entry never fired):
	// it fires from its floor.
	restoreNone restoreStep = iota
	// restoreSeeded: the watermark was seeded; read it again.
	restoreSeeded
	// restoreHeld: the proposal has not settled, or the stream is
	// needed and unreadable; try again after the wait returned.
	restoreHeld
	// restoreFailed: Redis failed; retried after the load's backoff.
	restoreFailed
	// restoreReread: another replica restored the watermark; read it
	// again.
	restoreReread
)

// restore proposes r's seed and seeds the watermark once the proposal has
// settled. It reports the step reached and, when held, how long to wait.
// wm is the watermark found this time (lost, or behind a handled tick):
// the seeding step records the fires it says Redis lost (lost.go).
func (s *Scheduler) restore(ctx context.Context, r *entryRun, wm taskstate.WatermarkInfo) (restoreStep, time.Duration) {
	prefix := s.cfg.Names.Prefix()
	seed := r.loading.seed
	streamUnread := false
	if seed == nil {
		seed = &restoreSeed{}
		if r.hasHandled {
			seed.tick, seed.task, seed.from = r.handled, schedule.TaskID(prefix, r.id, r.handled), "cursor"
		}
		st, sttask, ok, err := s.lastHandled(ctx, r)
		switch {
		case err != nil:
			streamUnread = true
		case ok && (seed.from == "" || st.After(seed.tick)):
			seed.tick, seed.task, seed.from = st, sttask, "stream"
		}
		if !streamUnread || seed.from != "" {
			r.loading.seed = seed // the stream is read once per restore
		}
	}
	var p taskstate.RestoreProposal
	var err error
	if seed.from == "" && streamUnread {
		// No position here and no stream: open the proposal, so the
		// replicas that hold a position (one that fired the entry before
		// its shard moved here) raise it.
		p, err = s.broker.OpenRestore(ctx, prefix, r.queue, r.id, s.cfg.RestoreSettle)
	} else {
		p, err = s.broker.ProposeRestore(ctx, prefix, r.queue, r.id, seed.tick, seed.task, s.cfg.RestoreSettle)
	}
	if err != nil {
		s.countError()
		s.log.Warn("propose the seed of the entry's lost watermark", "entry", r.id, "queue", r.queue, "err", err)
		s.outcome(schedule.Outcome{Entry: r.id, Err: err})
		return restoreFailed, 0
	}
	switch {
	case p.Restored:
		return restoreReread, 0
	case !p.Found:
		return restoreNone, 0
	case !p.Settled:
		s.outcome(schedule.Outcome{Entry: r.id, Err: fmt.Errorf("%w: waiting %s for the other replicas' positions", ErrRestoring, p.Left.Round(time.Millisecond))})
		return restoreHeld, p.Left
	case p.Tick.IsZero() && streamUnread:
		// No position anywhere, and the stream may hold fires.
		s.outcome(schedule.Outcome{Entry: r.id, Err: fmt.Errorf("%w: no running replica holds a position for it and the activity stream cannot be read", ErrRestoring)})
		return restoreHeld, streamReadPause
	case p.Tick.IsZero():
		// Opened while the stream could not be read; it says the entry
		// never fired, and no replica raised the proposal.
		if err := s.broker.ClearRestore(ctx, prefix, r.queue, r.id, time.Time{}); err != nil {
			s.log.Warn("clear the restore proposal no replica raised", "entry", r.id, "queue", r.queue, "err", err)
		}
		return restoreNone, 0
	}
	from := seed.from
	if from == "" || p.Tick.After(seed.tick) {
		from = "replica" // another replica's position
	}
	// At the entry's revision: it never overrides a handover to another
	// queue at a later revision, and passes this configuration's own
	// handover marker (an entry with more than its registration has one).
	lost, lostData, err := s.lostRecord(ctx, r, wm, p.Tick)
	if err != nil {
		s.log.Warn("encode the record of the entry's lost fires; restoring without it", "entry", r.id, "queue", r.queue, "err", err)
	}
	recorded, err := s.broker.RestoreWatermark(ctx, prefix, r.queue, r.id, p.Tick, p.TaskID, r.st.Revision, s.revisionID(r), lost)
	if recorded {
		s.noteLost(lostData)
	}
	if err != nil {
		if errors.Is(err, taskstate.ErrHandoverSuperseded) {
			// A newer configuration moved the entry on: its fires here
			// are refused until the projection catches up.
			s.log.Warn("restore the entry's watermark", "entry", r.id, "queue", r.queue, "tick", p.Tick, "from", from, "err", err)
			return restoreNone, 0
		}
		s.countError()
		s.log.Warn("restore the entry's watermark; not firing it until it is", "entry", r.id, "queue", r.queue, "tick", p.Tick, "from", from, "err", err)
		s.outcome(schedule.Outcome{Entry: r.id, Err: err})
		return restoreFailed, 0
	}
	if err := s.broker.ClearRestore(ctx, prefix, r.queue, r.id, p.Tick); err != nil {
		// Harmless: the next restore drops a proposal no higher than the
		// watermark.
		s.log.Warn("clear the settled restore proposal", "entry", r.id, "queue", r.queue, "err", err)
	}
	s.m.Restored.WithLabelValues(from).Inc()
	s.log.Debug("restored the entry's watermark", "entry", r.id, "queue", r.queue, "tick", p.Tick, "from", from)
	return restoreSeeded, 0
}

// restoreHolds collects the entries one load pass held (restoreHeld).
type restoreHolds struct {
	n     int
	wait  time.Duration // the shortest wait
	fresh []string      // entries held for the first time in their load
}

func (h *restoreHolds) add(r *entryRun, wait time.Duration) {
	h.waiting(wait)
	if !r.loading.held {
		r.loading.held = true
		h.fresh = append(h.fresh, r.id)
	}
}

// waiting counts an entry held in an earlier pass whose proposal is to
// be read again in wait (takeLoadBatch).
func (h *restoreHolds) waiting(wait time.Duration) {
	if h.n == 0 || wait < h.wait {
		h.wait = wait
	}
	h.n++
}

// report logs the entries held for the first time, once per pass.
func (h *restoreHolds) report(s *Scheduler) {
	if len(h.fresh) == 0 {
		return
	}
	s.log.Warn("watermarks lost in Redis: holding these entries' fires until every live replica has added its position to the restore (or, with no position anywhere, until the activity stream can be read)",
		"entries", len(h.fresh), "first", h.fresh[0], "settle", s.cfg.RestoreSettle)
}

// positions holds the tick each entry's watermark was last known at by
// the loop (entryRun.handled), for raiseProposals, which must not depend on
// the loop: a loop waiting on a stream read (up to streamReadTimeout with
// NATS down) could miss the settle delay. A run keeps a pointer to its
// position (entryRun.pos), so the note of every fire updates it in place
// rather than hashing the id into a map of every entry.
type positions struct {
	now func() time.Time // the scheduler's clock (kept positions' times)
	mu  sync.Mutex
	m   map[string]*position
	// slab is where new positions are taken from, a block at a time: the
	// first fire of a burst of many entries notes them all at once.
	slab []position
	// inQueue counts the positions of each queue and kept those with kept
	// set, so that queues and pruneLocked, every restoreCheck, do not walk
	// every entry's position under the lock the loop's notes take.
	inQueue map[string]int
	kept    int
}

// positionSlab is how many positions one allocation makes room for.
const positionSlab = 256

type position struct {
	queue string
	tick  time.Time
	// kept, when set, is until when the position of an entry whose shard
	// this replica no longer owns is still raised: a watermark Redis lost
	// around a handover is restored no lower than the ticks this replica
	// fired before it let the entry go.
	kept time.Time
	// dropped: no longer in the map (forgotten, kept past its time, or
	// replaced by another run's); a run holding it notes afresh.
	dropped bool
}

// keptPosition is how long a position outlives its entry's run here
// (positions.keep): many times the restore settle.
const keptPosition = time.Minute

// note records r's position (loop goroutine); entries is how many
// entries the scheduler runs, what the map is first sized for.
func (p *positions) note(r *entryRun, entries int) {
	if !r.hasHandled {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if pos := r.pos; pos != nil && !pos.dropped {
		if pos.queue != r.queue {
			p.count(pos.queue, -1)
			p.count(r.queue, 1)
		}
		if !pos.kept.IsZero() {
			p.kept--
		}
		pos.queue, pos.tick, pos.kept = r.queue, r.handled, time.Time{}
		return
	}
	if p.m == nil {
		p.m = make(map[string]*position, entries)
		p.inQueue = map[string]int{}
	}
	p.dropLocked(r.id)
	if len(p.slab) == cap(p.slab) {
		p.slab = make([]position, 0, positionSlab)
	}
	p.slab = append(p.slab, position{queue: r.queue, tick: r.handled})
	r.pos = &p.slab[len(p.slab)-1]
	p.m[r.id] = r.pos
	p.count(r.queue, 1)
}

// count adds d to queue q's count of positions.
func (p *positions) count(q string, d int) {
	if n := p.inQueue[q] + d; n > 0 {
		p.inQueue[q] = n
	} else {
		delete(p.inQueue, q)
	}
}

// dropLocked removes id's position from the map.
func (p *positions) dropLocked(id string) {
	if pos := p.m[id]; pos != nil {
		pos.dropped = true
		delete(p.m, id)
		p.count(pos.queue, -1)
		if !pos.kept.IsZero() {
			p.kept--
		}
	}
}

func (p *positions) forget(id string) {
	p.mu.Lock()
	p.dropLocked(id)
	p.mu.Unlock()
}

// keep keeps id's position for keptPosition after its run left this
// replica (its shard went to another owner).
func (p *positions) keep(id string) {
	p.mu.Lock()
	if pos := p.m[id]; pos != nil {
		if pos.kept.IsZero() {
			p.kept++
		}
		pos.kept = p.now().Add(keptPosition)
	}
	p.mu.Unlock()
}

// pruneLocked drops the kept positions whose time is over.
func (p *positions) pruneLocked() {
	if p.kept == 0 {
		return
	}
	now := p.now()
	for id, pos := range p.m {
		if !pos.kept.IsZero() && now.After(pos.kept) {
			p.dropLocked(id)
		}
	}
}

// queues returns the queues of the entries with a position.
func (p *positions) queues() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pruneLocked()
	out := make([]string, 0, len(p.inQueue))
	for q := range p.inQueue {
		out = append(out, q)
	}
	return out
}

func (p *positions) get(id string) (position, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pos := p.m[id]
	if pos == nil {
		return position{}, false
	}
	return *pos, true
}

// raiseProposals reads the restore proposals of the queues this replica
// holds positions in every restoreCheck, and raises each one below the
// position this replica holds for its entry. It runs beside the loop,
// until ctx ends.
func (s *Scheduler) raiseProposals(ctx context.Context) {
	t := s.clock.NewTicker(restoreCheck)
	defer t.Stop()
	prefix := s.cfg.Names.Prefix()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		proposals, err := s.broker.RestoreProposals(ctx, prefix, s.pos.queues())
		if err != nil {
			// Redis is failing: so do the fires, which report it.
			s.log.Debug("read restore proposals", "err", err)
			continue
		}
		raised := 0
		for q, byEntry := range proposals {
			for id, tick := range byEntry {
				pos, ok := s.pos.get(id)
				if !ok || pos.queue != q || !pos.tick.After(tick) {
					continue
				}
				if _, err := s.broker.ProposeRestore(ctx, prefix, q, id, pos.tick, schedule.TaskID(prefix, id, pos.tick), s.cfg.RestoreSettle); err != nil {
					s.log.Warn("raise a restore proposal with this replica's position", "entry", id, "queue", q, "err", err)
					continue
				}
				raised++
			}
		}
		if raised > 0 {
			s.log.Info("raised restore proposals of lost watermarks with this replica's positions", "entries", raised)
		}
	}
}

// restoringEntries counts the entries held by a restore.
func (s *Scheduler) restoringEntries() int {
	n := 0
	for _, r := range s.loading {
		if r.loading.held {
			n++
		}
	}
	return n
}
