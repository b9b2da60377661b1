package scheduler

import (
	"context"
	"fmt"
	"time"
)

// observation is a fire heard from elsewhere (Observe), on its way to the
// loop.
type observation struct {
	entry string
	tick  time.Time
}

// Observe tells the scheduler another replica handled (fired or skipped)
// entry's tick, so its attempt at that tick reads the watermark before it
// fires (see applyObservation). It never blocks: when the buffer is full
// the observation is dropped and the fire attempt's compare-and-set sorts
// it out.
func (s *Scheduler) Observe(entry string, tick time.Time) {
	select {
	case s.observed <- observation{entry, tick}:
	default:
	}
}

// ObserveActivity is Observe for a message heard on the fire subjects of
// the activity stream, by its subject and Nats-Msg-Id. Whoever may publish
// there can send one, so it is a hint and nothing more; an id naming
// another entry than its subject does is ignored.
func (s *Scheduler) ObserveActivity(subject, msgID string) {
	if entry, tick, ok := ParseActivityID(msgID); ok && subject == s.cfg.Names.FireSubject(entry) {
		s.Observe(entry, tick)
	}
}

// ObservePublished is Observe for an event this replica's relay has
// published (relay.Config.OnPublished), by its event id; ids of other
// events than fired and skipped ones are ignored.
func (s *Scheduler) ObservePublished(eventID string) {
	if entry, tick, ok := ParseActivityID(eventID); ok {
		s.Observe(entry, tick)
	}
}

// applyObservation takes a fire heard from elsewhere as a hint that never
// moves the entry's cursor: anyone allowed to publish on the activity
// subjects could otherwise make every replica skip ticks. Heard for the
// tick the entry is to fire next, it makes this replica's attempt at that
// tick read the watermark first (confirmHeard); any other tick is ignored,
// and one far ahead of the clock is counted and logged as implausible.
func (s *Scheduler) applyObservation(o observation) {
	r := s.entries[o.entry]
	if r == nil {
		// A removed entry's run settling the ticks due before its removal
		// takes the hint too: a fire heard for its first such tick is read
		// instead of refused.
		r = s.removing[o.entry]
	}
	if r == nil {
		return
	}
	if ahead := o.tick.Sub(s.clock.Now()); ahead > implausibleAhead {
		s.count(func(st *Stats) { st.Implausible++ })
		s.m.Implausible.Inc()
		if s.clock.Since(s.implausibleLogged) >= time.Minute {
			s.implausibleLogged = s.clock.Mono()
			s.log.Warn("ignoring a fire heard for a tick far ahead of the clock: forged, or published by a replica with a wrong clock (logged once a minute, counted in cronstream_scheduler_implausible_observations_total)",
				"entry", r.id, "tick", o.tick.UTC().Format(time.RFC3339), "ahead", ahead.Round(time.Second))
		}
		return
	}
	if r.phase == phaseReady && o.tick.Equal(r.next()) {
		r.heard = o.tick
	}
}

// implausibleAhead is how far ahead of the scheduler's clock a heard tick
// is taken as implausible: no replica fires a tick before it is due, and
// the replicas' clocks are corrected to Redis's.
const implausibleAhead = time.Minute

// confirmHeard reads, per queue in one round trip, the watermark of the
// due entries whose due tick was heard fired, instead of firing them. A
// watermark at or past that tick (only the fire script writes it) becomes
// the cursor and the entry waits for its next tick; every other entry is
// returned, in due's storage, to be fired now, so a heard fire costs a
// non-primary one read and never a tick.
func (s *Scheduler) confirmHeard(ctx context.Context, due []*entryRun) []*entryRun {
	var heard map[string][]*entryRun
	keep := due[:0]
	for _, r := range due {
		if !r.heard.IsZero() && r.heard.Equal(r.next()) {
			if heard == nil {
				heard = map[string][]*entryRun{}
			}
			heard[r.queue] = append(heard[r.queue], r)
			continue
		}
		r.heard = time.Time{}
		keep = append(keep, r)
	}
	now := s.clock.Now()
	for q, runs := range heard {
		ids := make([]string, len(runs))
		for i, r := range runs {
			ids[i] = r.id
		}
		wms, err := s.broker.Watermarks(ctx, s.cfg.Names.Prefix(), q, ids)
		if err == nil && len(wms) != len(ids) {
			err = fmt.Errorf("%d watermarks for %d entries", len(wms), len(ids))
		}
		for i, r := range runs {
			tick := r.heard
			r.heard = time.Time{}
			if err != nil || !wms[i].OK || wms[i].Tick.Before(tick) {
				keep = append(keep, r) // the fire's compare-and-set decides
				continue
			}
			r.cursor, r.hasCursor, r.lastTask, r.tries = wms[i].Tick, true, wms[i].TaskID, 0
			// Read from Redis: a handled tick, kept to restore the
			// watermark if Redis loses it. Without it a replica that only
			// confirmed others' fires would take a vanished watermark
			// for an entry that never fired and fire it anew.
			r.handled, r.hasHandled = wms[i].Tick, true
			s.schedule(r, now)
		}
	}
	return keep
}
