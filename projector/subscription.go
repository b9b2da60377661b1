package projector

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/cronstream/cronstream/events"
)

// Subscription receives the projector's changes in stream order, coalesced
// per entry: a subscriber that reads less often than changes come gets,
// for each entry, one change from the state it last saw to the current
// one. Only a removal or quarantine of an entry the subscriber saw is not
// merged into a registration that follows it: the subscriber gets both,
// so it sees the entry stop (a scheduler must not take the time it was
// gone for an update's). Next and Close may be called from different
// goroutines.
type Subscription struct {
	p *Projector
	// removed: the removals of the map the subscription started from.
	removed []Change

	mu      sync.Mutex
	pending map[string]*Change
	// stopped holds an entry's pending removal or quarantine once a
	// registration followed it (pending then holds that registration).
	stopped map[string]*Change
	closed  bool
	signal  chan struct{} // one token: pending or stopped is non-empty, or closed
	// batches counts the batches Next has returned (NextMarked, Snapshot).
	batches uint64
}

// Subscribe returns a subscription whose first changes register every entry
// now in the map (Old nil), followed by every change after that. Close it
// when done.
func (p *Projector) Subscribe() *Subscription {
	s := &Subscription{p: p, pending: make(map[string]*Change), stopped: make(map[string]*Change), signal: make(chan struct{}, 1)}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.fold.snapshot() {
		s.push(c)
	}
	s.removed = p.fold.removals()
	p.subs[s] = struct{}{}
	return s
}

// Removed returns the entries removed before the subscription began and
// not registered since, each as its removal (New nil) from the last state
// the removal event carried, kept for its schedule and queue (the task's
// payload and headers, labels and note are not kept); Seq and Time are
// the removal's. A subscriber
// that must account for what was due before a removal it did not see live
// reads them once: its changes never name these entries until they are
// registered again.
func (s *Subscription) Removed() []Change { return s.removed }

// push records a change for the subscriber without blocking: a change to an
// entry that already has one pending is merged into it.
func (s *Subscription) push(c Change) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	prev, ok := s.pending[c.ID]
	switch {
	case ok && prev.Old != nil && prev.New == nil && c.New != nil:
		// Registered again after a removal or quarantine of an entry the
		// subscriber saw: both are delivered. An earlier stop kept for the
		// entry stays (it is the one the subscriber saw the entry stop by).
		if _, kept := s.stopped[c.ID]; !kept {
			s.stopped[c.ID] = prev
		}
		s.pending[c.ID] = &c
	case ok:
		prev.New, prev.Seq, prev.Time, prev.Quarantined = c.New, c.Seq, c.Time, c.Quarantined
		if prev.Old == nil && prev.New == nil {
			// The subscriber never saw the entry and it is gone again.
			delete(s.pending, c.ID)
		}
	default:
		s.pending[c.ID] = &c
	}
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// Next returns the pending changes sorted by sequence, waiting until there is
// at least one. It returns ErrClosed after Close, ErrStopped once the
// projector has stopped and every pending change has been returned, or ctx's
// error.
func (s *Subscription) Next(ctx context.Context) ([]Change, error) {
	out, _, err := s.NextMarked(ctx)
	return out, err
}

// NextMarked is Next, also returning the batch's number (1, 2, ...), which
// a Snapshot's mark is compared with.
func (s *Subscription) NextMarked(ctx context.Context) ([]Change, uint64, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, 0, ErrClosed
		}
		if len(s.pending) > 0 || len(s.stopped) > 0 {
			out := make([]Change, 0, len(s.pending)+len(s.stopped))
			for _, c := range s.stopped {
				out = append(out, *c)
			}
			for _, c := range s.pending {
				out = append(out, *c)
			}
			clear(s.stopped)
			clear(s.pending)
			s.batches++
			n := s.batches
			s.mu.Unlock()
			slices.SortFunc(out, func(a, b Change) int { return cmp.Compare(a.Seq, b.Seq) })
			return out, n, nil
		}
		s.mu.Unlock()
		select {
		case <-s.signal:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-s.p.stopped:
			// Changes pushed before the stop are still delivered.
			s.mu.Lock()
			empty := len(s.pending) == 0 && len(s.stopped) == 0 && !s.closed
			s.mu.Unlock()
			if empty {
				return nil, 0, ErrStopped
			}
		}
	}
}

// Batch is one batch of changes, with its number (NextMarked), as Pump
// sends it.
type Batch struct {
	Changes []Change
	Mark    uint64
}

// Pump sends the subscription's batches to out, in order, until ctx ends or
// the subscription ends (Close, or the projector stopped and every change
// was sent); then it closes the subscription and out. A component runs it
// in a goroutine of its own, so that its loop waits on the changes beside
// its timers.
func (s *Subscription) Pump(ctx context.Context, out chan<- Batch) {
	defer close(out)
	defer s.Close()
	for {
		changes, mark, err := s.NextMarked(ctx)
		if err != nil {
			return
		}
		select {
		case out <- Batch{Changes: changes, Mark: mark}:
		case <-ctx.Done():
			return
		}
	}
}

// Snapshot returns, as of one moment, the registered entries whose shard
// (events.ShardOfEntry of its queue and id) in says yes to, each as a
// change from nothing like Subscribe's first changes, and the removals of
// removed entries whose last queue's shard it says yes to, like Removed;
// both in stream order. mark is the number of the last batch Next returned
// before it: a subscriber that takes shards over mid-stream (ownership)
// builds them from the snapshot and ignores their entries' changes in
// batches up to mark, which it may still be holding and which may be older
// than the snapshot. A later batch brings each entry to its current state
// (a change pending at the snapshot to the state the snapshot holds).
func (s *Subscription) Snapshot(in func(events.Shard) bool) (registered, removed []Change, mark uint64) {
	s.p.mu.RLock()
	defer s.p.mu.RUnlock()
	s.mu.Lock()
	mark = s.batches
	s.mu.Unlock()
	f := s.p.fold
	for id, st := range f.entries {
		if in(events.ShardOfEntry(st.Entry.Options.QueueName(), id)) {
			registered = append(registered, Change{ID: id, New: st, Seq: st.Revision, Time: st.Time})
		}
	}
	for id, st := range f.removed {
		if in(events.ShardOfEntry(st.Entry.Options.QueueName(), id)) {
			removed = append(removed, Change{ID: id, Old: st, Seq: st.Revision, Time: st.Time})
		}
	}
	bySeq := func(a, b Change) int { return cmp.Compare(a.Seq, b.Seq) }
	slices.SortFunc(registered, bySeq)
	slices.SortFunc(removed, bySeq)
	return registered, removed, mark
}

// Close ends the subscription; pending changes are dropped.
func (s *Subscription) Close() {
	s.p.mu.Lock()
	delete(s.p.subs, s)
	s.p.mu.Unlock()
	s.mu.Lock()
	s.closed = true
	clear(s.pending)
	clear(s.stopped)
	s.mu.Unlock()
	select {
	case s.signal <- struct{}{}:
	default:
	}
}
