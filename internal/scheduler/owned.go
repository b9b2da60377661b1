package scheduler

import (
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/projector"
)

// shardOf is the shard of entry id in state st's queue.
func shardOf(id string, st *projector.State) events.Shard {
	return events.ShardOfEntry(st.Entry.Options.QueueName(), id)
}

// runShard is the shard r's run belongs to: its queue's.
func runShard(r *entryRun) events.Shard { return events.ShardOfEntry(r.queue, r.id) }

// followShards takes the shards the owned set gained and drops those it
// lost, between passes (loop goroutine): a shard taken builds its runs as
// at start, from a snapshot of the projection; a shard dropped leaves with
// every run of its entries, nothing recorded.
func (s *Scheduler) followShards() {
	if s.ownsAll() {
		return
	}
	next := s.cfg.Shards.Owned()
	if next.Version == s.owned.Version {
		s.owned.Until = next.Until // renewed terms
		return
	}
	s.placeFarOff() // a run that leaves notes its last fire's position
	var gone map[events.Shard]bool
	for sh := range s.owned.Until {
		if _, kept := next.Until[sh]; !kept {
			if gone == nil {
				gone = map[events.Shard]bool{}
			}
			gone[sh] = true
		}
	}
	var taken map[events.Shard]bool
	for sh := range next.Until {
		if _, had := s.owned.Until[sh]; !had {
			if taken == nil {
				taken = map[events.Shard]bool{}
			}
			taken[sh] = true
		}
	}
	s.owned = next
	if !s.visPending {
		// asynq's tools list the entries under their new owner soon.
		s.visPending, s.visSince = true, s.clock.Mono().Add(-s.cfg.Visibility/2)
	}
	if len(gone) > 0 {
		s.dropShards(gone)
	}
	if len(taken) > 0 {
		s.takeShards(taken)
	}
}

// takeShards builds the runs of the entries of shards taken over, exactly
// as a replica starting does: registered entries load their watermarks
// (floorAtLoad), paused ones load as found paused and removed ones still
// settling as found removed, so the ticks due before a pause or removal
// that no replica handled are recorded (INV-stop-settles) whoever owned
// the shard then. Their changes in the batches the snapshot supersedes
// are ignored (follow).
func (s *Scheduler) takeShards(taken map[events.Shard]bool) {
	registered, removed, mark := s.sub.Snapshot(func(sh events.Shard) bool { return taken[sh] })
	if s.marks == nil {
		s.marks = map[events.Shard]uint64{}
	}
	for sh := range taken {
		s.marks[sh] = mark
	}
	for _, c := range removed {
		if s.liveRun(c.ID) == nil && s.removedRun(c.ID) == nil {
			s.foundRemoved(c)
		}
	}
	for _, c := range registered {
		s.applyChange(c)
	}
	s.log.Debug("shards taken", "shards", len(taken), "entries", len(registered), "removed", len(removed))
}

// dropShards drops the runs of the entries of shards no longer owned.
func (s *Scheduler) dropShards(gone map[events.Shard]bool) {
	n := 0
	for _, r := range s.entries {
		if gone[runShard(r)] {
			if r.state != stateKnown {
				n++
			}
			s.dropRun(r)
		}
	}
	for sh := range gone {
		delete(s.marks, sh)
	}
	s.log.Debug("shards dropped", "shards", len(gone), "entries", n)
}

// follow applies one change of the projection, batch number n: all of
// them without ownership; with it, those of entries in owned shards that
// are newer than the shard's snapshot (seen: the shard is owned and the
// batch came after its snapshot). An entry that leaves the owned shards
// (moved to another queue) leaves with its run; one that comes in from a
// shard not owned is taken as found, as at start.
func (s *Scheduler) follow(c projector.Change, n uint64) {
	if s.ownsAll() {
		s.applyChange(c)
		return
	}
	owned := func(st *projector.State) (bool, bool) {
		if st == nil {
			return false, false
		}
		sh := shardOf(c.ID, st)
		_, ok := s.owned.Until[sh]
		return ok, ok && n > s.marks[sh]
	}
	_, oldSeen := owned(c.Old)
	newOwned, newSeen := owned(c.New)
	switch {
	case c.New == nil:
		if oldSeen {
			s.applyChange(c)
		}
	case newSeen:
		if oldSeen || s.liveRun(c.ID) != nil || s.removedRun(c.ID) != nil {
			s.applyChange(c)
			return
		}
		// Its earlier state was never this replica's: found, as at start.
		s.applyChange(projector.Change{ID: c.ID, New: c.New, Seq: c.Seq, Time: c.Time})
	case newOwned:
		// The shard's snapshot is newer than the change and was applied.
	case oldSeen:
		// Moved to a shard of another replica: its run goes there.
		if r := s.entries[c.ID]; r != nil && !r.state.removed() {
			s.dropRun(r)
		}
	}
}

// leaseRecheck is how soon an entry due in a shard whose lease is not
// valid by the local clock is looked at again: its lease is renewed, or
// the shard dropped, within a poll of ownership.
const leaseRecheck = 250 * time.Millisecond

// leased returns, in due's storage, the due entries whose shard's lease is
// valid by this replica's clock; the others wait (a replica frozen past
// its leases' term, or one whose renewals fail, fires nothing of them
// until it has renewed them).
func (s *Scheduler) leased(due []*entryRun) []*entryRun {
	if s.ownsAll() || len(due) == 0 {
		return due
	}
	mono := s.clock.Mono()
	keep := due[:0]
	var later time.Time
	for _, r := range due {
		if until, ok := s.owned.Until[runShard(r)]; ok && mono.Before(until) {
			keep = append(keep, r)
			continue
		}
		if later.IsZero() {
			later = s.clock.Now().Add(leaseRecheck)
		}
		s.heap.set(r, later)
	}
	return keep
}

// firesShard reports whether this replica may act on shard sh now: it
// owns it and its lease is valid by the local clock.
func (s *Scheduler) firesShard(sh events.Shard) bool {
	if s.ownsAll() {
		return true
	}
	until, ok := s.owned.Until[sh]
	return ok && s.clock.Mono().Before(until)
}

// fairShare returns, in due's storage, the entries this pass fires: at
// most Batch × Parallel (what one pass sends at once), taken round-robin
// across queues, oldest due first within a queue, each pass starting at
// the next queue. Entries due beyond that wait in a backlog per queue and
// go first in the next passes, which follow at once, so one queue's flood
// never starves another queue's entries, which would otherwise wait behind
// it in every pass; the flood's own entries come late, where the stall
// detector sees them.
func (s *Scheduler) fairShare(due []*entryRun) []*entryRun {
	budget := s.cfg.Batch * s.cfg.Parallel
	if len(s.backlog) == 0 && len(due) <= budget {
		return due
	}
	if s.backlog == nil {
		s.backlog = map[string]*queueBacklog{}
	}
	for _, b := range s.backlog {
		b.compact()
	}
	var last *queueBacklog // due entries mostly come in runs of one queue
	for _, r := range due {
		if r.backlogged {
			continue // it waits at an earlier place already
		}
		r.backlogged = true
		if last == nil || last.queue != r.queue {
			last = s.backlog[r.queue]
			if last == nil {
				last = &queueBacklog{queue: r.queue}
				s.backlog[r.queue] = last
			}
		}
		last.runs = append(growDoubling(last.runs), r)
	}
	queues := make([]*queueBacklog, 0, len(s.backlog))
	for _, b := range s.backlog {
		queues = append(queues, b)
	}
	slices.SortFunc(queues, func(a, b *queueBacklog) int { return strings.Compare(a.queue, b.queue) })
	start := s.fairNext % len(queues)
	s.fairNext++
	keep := due[:0]
	for left := len(queues); len(keep) < budget && left > 0; {
		left = 0
		for i := 0; i < len(queues) && len(keep) < budget; i++ {
			// Taken from its queue's backlog only when the pass has room:
			// one taken and not kept would be in neither the backlog nor
			// the heap, and never fire again.
			b := queues[(start+i)%len(queues)]
			if b.head == len(b.runs) {
				continue
			}
			if r := s.nextBacklogged(b); r != nil {
				keep = append(keep, r)
			}
			if b.head < len(b.runs) {
				left++
			}
		}
	}
	return keep
}

// queueBacklog is one queue's due entries that wait for a pass, oldest
// first from head.
type queueBacklog struct {
	queue string
	runs  []*entryRun
	head  int
}

// nextBacklogged takes the first entry of b that is still due here: still
// this replica's, ready, and not scheduled again since (a change applied
// meanwhile placed it in the heap, or sent it loading). A run that fires
// is the one s.entries holds for its entry (enter drops any other to
// stateNone), so its state says all. An emptied backlog leaves s.backlog.
func (s *Scheduler) nextBacklogged(b *queueBacklog) *entryRun {
	for b.head < len(b.runs) {
		r := b.runs[b.head]
		b.runs[b.head] = nil
		b.head++
		if !r.backlogged {
			continue
		}
		r.backlogged = false
		if r.index >= 0 || !r.state.fires() {
			continue
		}
		if b.head == len(b.runs) {
			delete(s.backlog, b.queue)
		}
		return r
	}
	delete(s.backlog, b.queue)
	return nil
}

// compact moves b's waiting entries to the front of its storage, once
// those taken are half of it: a backlog that never drains (an overloaded
// replica) would otherwise grow its slice forever.
func (b *queueBacklog) compact() {
	if b.head == 0 || b.head < len(b.runs)/2 {
		return
	}
	n := copy(b.runs, b.runs[b.head:])
	clear(b.runs[n:])
	b.runs, b.head = b.runs[:n], 0
}

// requeueBacklog puts the backlog's entries back in the heap at at
// (firing paused by backpressure).
func (s *Scheduler) requeueBacklog(at time.Time) {
	for _, b := range s.backlog {
		for r := s.nextBacklogged(b); r != nil; r = s.nextBacklogged(b) {
			s.heap.set(r, at)
		}
	}
}

// fenced follows a run of fire attempts refused by the revision or
// staleness fence: this replica fires from a configuration older than
// the one the slots have seen, or lost the config stream. It owns its
// shards for nothing while that lasts, so the replica counts itself not
// ready (Fenced), and its shards go to replicas that fire them.
type fenced struct {
	since atomic.Int64  // monotonic since the scheduler's epoch; 0: not fenced
	seq   atomic.Uint64 // the highest revision fence that refused it
	heard atomic.Int64  // the projection's LastHeard (unix ns) at a stale refusal
}

// noteFenced records a refusal by the revision fence at seq, or (seq 0)
// by the staleness fence.
func (s *Scheduler) noteFenced(seq uint64) {
	f := &s.fenced
	if f.since.Load() == 0 {
		f.since.Store(int64(max(s.clock.Since(s.epoch), 1)))
	}
	if seq == 0 {
		f.heard.Store(s.cfg.Projection.LastHeard().UnixNano())
		return
	}
	if seq > f.seq.Load() {
		f.seq.Store(seq)
	}
}

// clearFenced ends a run of refusals: a fire of this replica went through
// (or met another's tick).
func (s *Scheduler) clearFenced() {
	if s.fenced.since.Load() != 0 {
		s.fenced.since.Store(0)
		s.fenced.seq.Store(0)
		s.fenced.heard.Store(0)
	}
}

// Fenced returns how long every fire attempt of this replica has been
// refused by the revision or staleness fence (0: not), and not since
// outgrown: the projection reached the fence's sequence, or heard the
// config stream again after a stale refusal. Safe from any goroutine.
func (s *Scheduler) Fenced() time.Duration {
	f := &s.fenced
	since := f.since.Load()
	if since == 0 {
		return 0
	}
	seq, heard := f.seq.Load(), f.heard.Load()
	caughtUp := seq == 0 || s.cfg.Projection.FenceSeq() >= seq
	fresh := heard == 0 || s.cfg.Projection.LastHeard().UnixNano() > heard
	if caughtUp && fresh {
		s.clearFenced()
		return 0
	}
	return max(s.clock.Since(s.epoch)-time.Duration(since), 0)
}
