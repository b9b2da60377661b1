package relay

import (
	"context"
	"time"
)

// mayRelay says whether this relay publishes queue's outbox this pass:
// mine when its replica holds the queue's duties or it is stopping (then
// the lease decides: it publishes what it holds and what no relay holds,
// since that outbox's last holder may have just stopped too, and the last
// replica out would otherwise leave its own final fires behind); orphan
// when it does not but the outbox's oldest record has waited longer than
// OrphanAfter (the lease then decides whether nobody else relays it). An
// outbox it holds and owns no more is released for its owner.
func (r *Relay) mayRelay(ctx context.Context, queue string) (mine, orphan bool, err error) {
	if r.cfg.Owns == nil || r.cfg.Owns(queue) {
		return true, false, nil
	}
	now := time.Now()
	r.mu.Lock()
	_, held := r.owned[queue]
	due := now.Sub(r.orphanChecked[queue]) >= r.cfg.OrphanAfter/4
	if due && !held {
		r.orphanChecked[queue] = now
	}
	r.mu.Unlock()
	switch {
	case r.stopping.Load():
		return true, false, nil
	case held:
		r.letGo(ctx, queue)
		return false, false, nil
	case !due:
		return false, false, nil
	}
	recs, err := r.cfg.Outbox.ReadOutbox(ctx, r.cfg.Names.Prefix(), queue, "", 1)
	if err != nil || len(recs) == 0 {
		return false, false, err
	}
	at, ok := recordTime(recs[0].StreamID)
	return false, ok && r.cfg.Now().Sub(at) > r.cfg.OrphanAfter, nil
}

// takeOutbox takes or renews queue's outbox lease when this relay
// publishes it this pass: not while its NATS connection is down (it
// yields the outbox) or while it keeps off it after a yield, and only for
// a queue it owns or an orphaned outbox (mayRelay). It returns the stream
// id it resumes after, whether it holds the lease, and whether it took
// the outbox as an orphan, for this pass only.
func (r *Relay) takeOutbox(ctx context.Context, queue string) (after string, ok, orphan bool, err error) {
	if nc := r.cfg.JS.Conn(); nc != nil && !nc.IsConnected() {
		// Publishing now would only fill the client's reconnect buffer
		// (and hang the pass on acks that cannot come): count, and let a
		// replica that reaches NATS take the outbox.
		r.yield(ctx, queue)
		return "", false, false, errDisconnected
	}
	r.mu.Lock()
	until, yielding := r.yielded[queue]
	if yielding && time.Now().After(until) {
		delete(r.yielded, queue)
		yielding = false
	}
	r.mu.Unlock()
	// A stopping relay is past keeping off for another replica's sake:
	// the lease says whether one took the outbox, and if none did, this
	// is the outbox's last chance before a replica starts again.
	if yielding && !r.stopping.Load() {
		return "", false, false, nil
	}
	mine, orphan, err := r.mayRelay(ctx, queue)
	if !mine && !orphan {
		return "", false, false, err
	}
	ok, err = r.cfg.Outbox.AcquireOutbox(ctx, r.cfg.Names.Prefix(), queue, r.cfg.Owner, r.cfg.LeaseTTL)
	if err != nil {
		return "", false, false, err
	}
	r.mu.Lock()
	after, had := r.owned[queue]
	if !ok {
		delete(r.owned, queue)
	} else if !had {
		// A new owner resumes from the first record still in the outbox.
		after = ""
		r.owned[queue] = after
	}
	r.mu.Unlock()
	if ok && orphan {
		r.log.Info("relaying the outbox of a queue this replica does not own: nobody relayed it", "queue", queue, "waited_more_than", r.cfg.OrphanAfter)
		if m := r.cfg.Metrics; m != nil {
			m.Orphans.Inc()
		}
	}
	return after, ok, ok && orphan, nil
}

// letGo releases queue's outbox lease, for the queue's owner to take.
func (r *Relay) letGo(ctx context.Context, queue string) {
	r.mu.Lock()
	delete(r.owned, queue)
	r.mu.Unlock()
	if err := r.cfg.Outbox.ReleaseOutbox(ctx, r.cfg.Names.Prefix(), queue, r.cfg.Owner); err != nil {
		r.log.Debug("release outbox", "queue", queue, "err", err)
	}
}

// watchNATS logs once when the NATS connection goes down and once when it
// is back, instead of a line per pass or per record. Coming back, it also
// forgets the outboxes it yielded for being cut off, so a relay that lost
// NATS with every other replica resumes at once.
func (r *Relay) watchNATS() {
	nc := r.cfg.JS.Conn()
	if nc == nil {
		return
	}
	down := !nc.IsConnected()
	if down == r.natsDown {
		return
	}
	r.natsDown = down
	if down {
		r.log.Warn("NATS unreachable: outbox records wait in Redis until it is back", "backlog", r.Backlog(), "backlog_bytes", r.BacklogBytes())
		return
	}
	r.mu.Lock()
	clear(r.yielded)
	clear(r.yields)
	r.mu.Unlock()
	r.log.Info("NATS reachable again: relaying the outbox backlog", "backlog", r.Backlog(), "backlog_bytes", r.BacklogBytes())
}

// firstYield is how long a relay keeps off an outbox after its first pass
// in a row that published nothing: long enough for the other replicas'
// passes to take the released lease, short enough that a lone replica
// whose stream missed one acknowledgement under load is back at once.
const firstYield = time.Second

// yield gives up queue's outbox if this relay owns it and keeps off it for
// a while: firstYield, doubled by each further yield in a row, at most a
// lease period. Records are never lost by this: the next owner resumes
// from the first record left, and duplicates are dropped by the stream.
func (r *Relay) yield(ctx context.Context, queue string) {
	r.mu.Lock()
	_, owned := r.owned[queue]
	delete(r.owned, queue)
	n := min(r.yields[queue], 8)
	r.yields[queue]++
	r.yielded[queue] = time.Now().Add(min(firstYield<<n, r.cfg.LeaseTTL))
	r.mu.Unlock()
	if owned {
		if err := r.cfg.Outbox.ReleaseOutbox(ctx, r.cfg.Names.Prefix(), queue, r.cfg.Owner); err != nil {
			r.log.Debug("release outbox", "queue", queue, "err", err)
		}
	}
}

// keepLease renews queue's outbox lease every third of LeaseTTL until the
// returned stop is called, for a pass that holds it: a batch whose
// acknowledgements take longer than the lease (a loaded host, a stream
// slow to answer) would otherwise lose the outbox mid-pass to another
// relay, which publishes the same records again while this one's ack is
// refused, and under lasting load the two go on trading it without
// deleting anything. A relay that dies stops renewing, so its outbox is
// free a lease period later, as before. stop returns once the renewals
// have.
func (r *Relay) keepLease(ctx context.Context, queue string) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(r.cfg.LeaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			// Renew only: a lease this relay gave up during the pass (a
			// yield) stays given up.
			ok, err := r.cfg.Outbox.RenewOutbox(ctx, r.cfg.Names.Prefix(), queue, r.cfg.Owner, r.cfg.LeaseTTL)
			if err != nil || !ok {
				// Another relay holds it (or Redis failed): the pass's ack
				// finds out and ends it.
				return
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}
