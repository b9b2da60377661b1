package scheduler

import (
	"context"
	"slices"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
)

// Stream epochs (docs/design.md INV-revision-fence). The revision fence and
// the handover markers in Redis hold config stream sequences. A config stream
// deleted and recreated, or restored from an older snapshot, starts again
// below them, and every fire would be refused for ever. A replica refused by
// a fence, or by a "moved out" marker its configuration cannot explain,
// checks the sequence against the stream; when the stream has no message
// there, or another message than Redis recorded (the message id stored
// beside the fence or marker, events.ConfigMessageID; for a marker also a
// message of another entry), the sequence belongs to an earlier stream: the
// replica starts a new epoch (warning, metric) by clearing that value in
// Redis, compared first, and fires again. A fence or marker stored without
// an id (an earlier build's) is checked by its sequence (and a marker by
// its entry) only.
//
// A healthy fence is never cleared: every fence value was presented by a
// replica that read the message at that sequence from the stream (its id is
// that message's), and the config stream refuses deletes and purges, so the
// message stays. A fence a replica is refused by while the stream holds it
// means the replica lags; it catches up. Likewise a healthy marker's
// revision is the sequence of a config event of its own entry.

// epochRecheck is how long a sequence found in the stream is not checked
// again: a lagging replica is refused by the same fence on every attempt.
const epochRecheck = 10 * time.Second

// epochSuspect is a sequence Redis refused a fire with: the queue's fence
// (entry "") or entry's handover marker in queue, and the id of the config
// message Redis holds for it ("" unknown).
type epochSuspect struct {
	queue, entry string
	seq          uint64
	id           string
}

// suspectEpoch notes a refusal by a sequence the projection does not
// explain, to be checked against the stream after the pass (loop goroutine).
func (s *Scheduler) suspectEpoch(queue, entry string, seq uint64, id string) {
	if s.cfg.History == nil {
		return
	}
	k := epochSuspect{queue, entry, seq, id}
	if at, ok := s.epochChecked[k]; ok && s.clock.Since(at) < epochRecheck {
		return
	}
	if s.epochSuspects == nil {
		s.epochSuspects = map[epochSuspect]bool{}
	}
	s.epochSuspects[k] = true
}

// checkEpochs checks each suspect sequence against the config stream and
// clears those the stream does not hold.
func (s *Scheduler) checkEpochs(ctx context.Context) {
	if len(s.epochSuspects) == 0 {
		return
	}
	if s.epochChecked == nil {
		s.epochChecked = map[epochSuspect]clock.Mono{}
	}
	for k, at := range s.epochChecked {
		if s.clock.Since(at) >= epochRecheck {
			delete(s.epochChecked, k)
		}
	}
	prefix := s.cfg.Names.Prefix()
	cleared := map[string]bool{} // queues with a cleared fence or marker
	for k := range s.epochSuspects {
		delete(s.epochSuspects, k)
		storedID := k.id
		if k.entry != "" && storedID == "" {
			// A marker's id is not in the fire's reply: it is read
			// when the marker is checked.
			var err error
			if storedID, err = s.broker.HandoverID(ctx, prefix, k.queue, k.entry, k.seq); err != nil {
				s.countError()
				s.log.Warn("read the config message id of a refusing handover marker", "queue", k.queue, "entry", k.entry, "seq", k.seq, "err", err)
				continue
			}
		}
		subject, id, found, err := s.cfg.History.ConfigMessageAt(ctx, k.seq)
		if err != nil {
			s.countError()
			s.log.Warn("check a refusing config sequence against the config stream", "queue", k.queue, "entry", k.entry, "seq", k.seq, "err", err)
			s.epochChecked[k] = s.clock.Mono() // again after epochRecheck, not every pass
			continue
		}
		var what string
		switch {
		case !found:
			what = "the config stream has no message at that sequence"
		case storedID != "" && storedID != id:
			what = "the config stream holds another message at that sequence"
		case k.entry != "" && !slices.Contains(s.cfg.Names.EntrySubjects(k.entry), subject):
			what = "the config stream holds another entry's message at that sequence"
		default:
			s.epochChecked[k] = s.clock.Mono()
			continue
		}
		var ok bool
		if k.entry == "" {
			ok, err = s.broker.ClearFence(ctx, prefix, k.queue, k.seq)
		} else {
			ok, err = s.broker.ClearHandover(ctx, prefix, k.queue, k.entry, k.seq)
		}
		if err != nil {
			s.countError()
			s.log.Warn("clear a config sequence of an earlier config stream", "queue", k.queue, "entry", k.entry, "seq", k.seq, "err", err)
			continue
		}
		if !ok {
			continue // another replica cleared it, or raised it from this stream
		}
		cleared[k.queue] = true
		s.m.Epochs.Inc()
		held := "revision fence"
		if k.entry != "" {
			held = "handover marker of entry " + k.entry
		}
		s.log.Warn("new stream epoch: the "+held+" in Redis holds a sequence of an earlier config stream (recreated or restored?); cleared, firing resumes",
			"queue", k.queue, "seq", k.seq, "reason", what)
	}
	// Entries refused there fire again now instead of after their backoff.
	now := s.clock.Now()
	for _, r := range s.entries {
		if r.state == stateReady && cleared[r.queue] && r.tries > 0 && r.index >= 0 {
			r.tries = 0
			s.schedule(r, now)
		}
	}
}

// revisionID is the id of the config message of r's current revision
// (events.ConfigMessageID), stored beside the handover markers written at
// that revision; "" when the projection does not know when it was stored.
func (s *Scheduler) revisionID(r *entryRun) string {
	if r.st.Time.IsZero() {
		return ""
	}
	// A fail-pause request sets a revision too, on the entry's fail-pause
	// subject.
	return events.ConfigMessageID(r.st.RevisionSubject(s.cfg.Names), r.st.Time)
}
