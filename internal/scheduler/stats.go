package scheduler

// Stats are counters for status and tests.
type Stats struct {
	Fired, AlreadyExisted, SkippedMissed, SkippedOverlap, SkippedUnique uint64
	SkippedExcluded                                                     uint64
	// SkippedPaused counts steps that recorded ticks due before a pause
	// that no replica had fired (each may cover many ticks).
	SkippedPaused uint64
	// SkippedRemoved counts the same for ticks due before a removal.
	SkippedRemoved uint64
	// Completed counts fires refused because their entry's max fires were
	// reached (the entry then waits for a new limit).
	Completed uint64
	// FireCountUnknown counts limited entries made completed because
	// their fires count could not be rebuilt after Redis lost data.
	FireCountUnknown uint64
	Refused          map[string]uint64
	Errors           uint64
	Entries          int
	// Loading counts entries not firing yet because their watermark is
	// still to be read (after a start, a queue change or a re-register).
	Loading int
	// Restoring counts entries whose fires are held while their lost
	// watermark is restored (ErrRestoring).
	Restoring int
	// Implausible counts fires read back from the activity stream for a
	// tick far ahead of the clock (forged, or from a publisher with a
	// broken clock); they are ignored.
	Implausible uint64
	// Epochs counts fences and markers of an earlier config stream this
	// replica cleared (new stream epochs).
	Epochs uint64
	// Held counts ticks held by overlap buffer-one; Released those of
	// them this replica fired, DroppedHeld those it dropped.
	Held, Released, DroppedHeld uint64
	// CancelsSent counts cancellations of running tasks this replica
	// published for overlap cancel-previous; CancelDeleted the replaced
	// tasks it deleted (waiting, or back in retry once cancelled).
	CancelsSent, CancelDeleted uint64
	// LostFires counts the ticks this replica's restores recorded as lost
	// (cronstream.task.lost); LostUnknown the lost records that could not
	// say which.
	LostFires, LostUnknown uint64
	// HeapOps counts the operations on the heap of due entries (pushes,
	// moves, removals, pops): work proportional to this replica's share.
	HeapOps uint64
}

// Stats returns a copy of the counters.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.stats
	c.HeapOps = s.heap.ops.Load()
	c.Refused = make(map[string]uint64, len(s.stats.Refused))
	for k, v := range s.stats.Refused {
		c.Refused[k] = v
	}
	return c
}

func (s *Scheduler) setEntriesGauge() {
	n, restoring := len(s.entries)+s.pausedOnly, s.restoringEntries()
	s.mu.Lock()
	s.stats.Entries, s.stats.Loading, s.stats.Restoring = n, len(s.load), restoring
	s.mu.Unlock()
	s.m.Entries.Set(float64(n))
	s.m.Restoring.Set(float64(restoring))
}

func (s *Scheduler) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

func (s *Scheduler) countError() {
	s.count(func(st *Stats) { st.Errors++ })
	s.m.Errors.Inc()
}

func (s *Scheduler) countRefused(status string) {
	s.count(func(st *Stats) { st.Refused[status]++ })
	s.m.Refused.WithLabelValues(status).Inc()
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
