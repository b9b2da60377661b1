package ownership

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// actions are what one poll does to the leases.
type actions struct {
	acquire []events.Shard
	renew   []events.Shard
	release []events.Shard
	lost    []events.Shard
	changed bool
}

// poll is one turn of the loop: read every lease, decide, act, report.
func (m *Manager) poll(ctx context.Context) {
	now := m.clock.Mono()
	m.refreshView(now)
	prefix := m.cfg.Names.Prefix()
	heard := m.cfg.HeardNATS()
	// A call bounded by a third of the lease: a Redis slower than that
	// cannot keep leases anyway.
	cctx, cancel := context.WithTimeout(ctx, m.cfg.LeaseTTL/3)
	if !heard.IsZero() {
		if err := m.cfg.Store.NoteNATSHeard(cctx, prefix, m.cfg.ReplicaID, heard); err != nil && ctx.Err() == nil {
			m.log.Debug("record when this replica last heard NATS", "err", err)
		}
	}
	view, err := m.cfg.Store.ShardLeases(cctx, prefix, m.queues, true)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			m.readFailed(now, err)
		}
		m.publish(false)
		return
	}
	m.readOK()
	leases := make(map[events.Shard]taskstate.ShardLease, len(view.Leases))
	for _, l := range view.Leases {
		leases[l.Shard] = l
	}
	// Free since this read, not since the poll began: the read may have
	// waited for Redis, and the rank rule counts from what was seen.
	now = m.clock.Mono()
	m.noteFree(now, view, leases)
	a := m.plan(now, view, leases, heard)
	m.execute(ctx, view, a)
	m.observe(now, view, leases)
}

// refreshView recomputes the assignment when the candidates or the queues
// changed; the handover settle counts from then.
func (m *Manager) refreshView(now clock.Mono) {
	cands, queues := m.cfg.Members.Candidates(), m.cfg.Queues()
	if m.viewed && slices.Equal(cands, m.cands) && slices.Equal(queues, m.queues) {
		return
	}
	m.viewed = true
	if !slices.Equal(cands, m.cands) {
		m.log.Info("replicas that may own shards changed", "candidates", len(cands), "was", len(m.cands), "list", strings.Join(firstOf(cands, 16), ","))
	}
	m.cands, m.queues, m.viewAt = cands, queues, now
	m.shards = m.shards[:0]
	for _, q := range queues {
		m.shards = append(m.shards, events.QueueShards(q)...)
	}
	m.assign = assign(cands, m.shards, m.cfg.ReplicaID)
	for s := range m.free {
		if _, ok := m.assign.desired[s]; !ok {
			delete(m.free, s)
			delete(m.released, s)
			delete(m.last, s)
		}
	}
	m.m.Desired.Set(float64(m.assign.mine))
}

// noteFree records since when each readable shard without a lease has been
// free (the rank rule counts from there).
func (m *Manager) noteFree(now clock.Mono, v taskstate.ShardLeaseView, leases map[events.Shard]taskstate.ShardLease) {
	for _, s := range m.shards {
		_, held := leases[s]
		_, unreadable := v.Unreadable[s.Queue]
		switch {
		case held || unreadable:
			delete(m.free, s)
			delete(m.released, s)
		default:
			if _, ok := m.free[s]; !ok {
				m.free[s] = now
				// Released by its holder, or lapsed: a lease seen last
				// poll that is gone before its term was released.
				prev, seen := m.last[s]
				m.released[s] = seen && prev.Expires().After(v.Now)
			}
		}
	}
}

// plan decides what this poll does: shards this replica holds are renewed,
// handed over or let go; free shards are taken by the rank rule.
func (m *Manager) plan(now clock.Mono, v taskstate.ShardLeaseView, leases map[events.Shard]taskstate.ShardLease, heard time.Time) actions {
	me := m.cfg.ReplicaID
	ready := m.cfg.Ready()
	may := ready && m.hearsEnough(v, heard)
	// A view this replica has not heard NATS to refresh is no ground for a
	// handover: in a full NATS outage the members age out of it one by
	// one, and a shard handed to one of them would only be taken back by
	// rank, unowned meanwhile. Handovers balance; they wait for NATS.
	current := heard.IsZero() || v.Now.Sub(heard) <= m.cfg.NATSLostAfter
	progress := m.progressed()
	stable := m.clock.Since(m.viewAt) >= m.cfg.HandoverSettle
	var a actions
	release := func(h *holding, s events.Shard, handover bool) {
		h.releasing, h.handover, a.changed = m.version+1, handover, true
	}
	for s, h := range m.held {
		if _, unreadable := v.Unreadable[s.Queue]; unreadable {
			continue // nothing to do but wait: the scheduler keeps to the lease's local term
		}
		l, ok := leases[s]
		switch {
		case h.releasing != 0:
			if m.applied.Load() >= h.releasing {
				a.release = append(a.release, s)
			} else if (!ok || l.Holder != me) && !now.Before(m.validUntil(h)) {
				delete(m.held, s) // lapsed while the scheduler had not let it go
			}
		case ok && l.Holder != me:
			// Its lease lapsed (this replica did not renew it in time) and
			// another replica took it.
			delete(m.held, s)
			a.changed, a.lost = true, append(a.lost, s)
		case !ready:
			release(h, s, false)
		case m.assign.desired[s] != me && stable && current && !(h.takeover && m.clock.Since(h.acquired) < m.cfg.MemberTTL):
			release(h, s, true)
		case !may || !progress:
			// Not renewed: the lease lapses and the shard's next owner
			// takes it.
		case !ok:
			// Lapsed, or lost with Redis's data: taken again if still free.
			a.acquire = append(a.acquire, s)
		case m.clock.Since(h.renewed) >= m.cfg.LeaseTTL/3:
			a.renew = append(a.renew, s)
		}
	}
	if !may {
		return a
	}
	holding := make(map[string]bool, len(m.cands))
	for _, l := range leases {
		holding[l.Holder] = true
	}
	for _, s := range m.shards {
		if m.held[s] != nil {
			continue
		}
		if _, unreadable := v.Unreadable[s.Queue]; unreadable {
			continue
		}
		l, ok := leases[s]
		if ok {
			if l.Holder == me {
				a.acquire = append(a.acquire, s) // held under this id before a restart
			}
			continue
		}
		_, candidate := m.assign.rank[s]
		r := m.assign.liveRank(s, holding)
		if candidate && (r == 0 || m.clock.Since(m.free[s]) >= time.Duration(r)*m.cfg.TakeoverStep) {
			a.acquire = append(a.acquire, s)
		}
	}
	return a
}

// hearsEnough applies the rule for a replica cut off from NATS but not
// from Redis: one that has not heard NATS for NATSLostAfter keeps its
// shards only while no other replica hears it either (a full NATS outage,
// where everyone goes on firing on the last configuration); otherwise it
// stops renewing and takes nothing, and the replicas that hear NATS take
// its shards over. Times are compared on Redis's clock.
func (m *Manager) hearsEnough(v taskstate.ShardLeaseView, heard time.Time) bool {
	if heard.IsZero() || v.Now.Sub(heard) <= m.cfg.NATSLostAfter {
		m.watch.cutOff(m, false, "")
		return true
	}
	for id, at := range v.Heard {
		if id != m.cfg.ReplicaID && v.Now.Sub(at) <= m.cfg.NATSLostAfter {
			m.watch.cutOff(m, true, id)
			return false
		}
	}
	m.watch.cutOff(m, false, "")
	return true
}

// progressed reports whether the scheduler's loop turned within the last
// LeaseTTL less a renewal interval: a hung owner (a Redis call that hangs,
// a loop stuck) stops renewing and loses its shards.
func (m *Manager) progressed() bool {
	since := m.clock.Since(m.epoch) - time.Duration(m.turn.Load())
	ok := since <= m.cfg.LeaseTTL-m.cfg.LeaseTTL/3
	m.watch.stuck(m, !ok, since)
	return ok
}

// execute sends the poll's acquisitions, renewals and releases and
// publishes the owned set.
func (m *Manager) execute(ctx context.Context, v taskstate.ShardLeaseView, a actions) {
	prefix, me, ttl := m.cfg.Names.Prefix(), m.cfg.ReplicaID, m.cfg.LeaseTTL
	var took, handedIn, taken []events.Shard
	var fromIn, fromTaken []string
	if len(a.acquire) > 0 {
		start := m.clock.Mono()
		res := m.call(ctx, "acquire", a.acquire, func(c context.Context) ([]taskstate.LeaseResult, error) {
			return m.cfg.Store.AcquireShardLeases(c, prefix, me, ttl, a.acquire)
		})
		for i, s := range a.acquire {
			h := m.held[s]
			switch r := res[i]; {
			case r.Err != nil:
			case !r.Held && h != nil:
				delete(m.held, s)
				a.changed, a.lost = true, append(a.lost, s)
			case !r.Held:
			case h != nil:
				h.renewed = start
			default:
				rank := m.assign.rank[s]
				m.held[s] = &holding{acquired: start, renewed: start, takeover: rank > 0}
				a.changed = true
				switch prev, seen := m.last[s]; {
				case !seen || prev.Holder == me:
					took = append(took, s)
				case m.released[s]:
					handedIn, fromIn = append(handedIn, s), append(fromIn, prev.Holder)
				default:
					taken, fromTaken = append(taken, s), append(fromTaken, prev.Holder)
				}
			}
		}
	}
	if len(a.renew) > 0 {
		start := m.clock.Mono()
		res := m.call(ctx, "renew", a.renew, func(c context.Context) ([]taskstate.LeaseResult, error) {
			return m.cfg.Store.RenewShardLeases(c, prefix, me, ttl, a.renew)
		})
		for i, s := range a.renew {
			switch r := res[i]; {
			case r.Err != nil:
			case r.Held:
				m.held[s].renewed = start
			default:
				delete(m.held, s)
				a.changed, a.lost = true, append(a.lost, s)
			}
		}
	}
	var out, let []events.Shard
	if len(a.release) > 0 {
		res := m.call(ctx, "release", a.release, func(c context.Context) ([]taskstate.LeaseResult, error) {
			return m.cfg.Store.ReleaseShardLeases(c, prefix, me, a.release)
		})
		for i, s := range a.release {
			if res[i].Err != nil {
				continue // released at the next poll, or lapses
			}
			handover := m.held[s].handover
			delete(m.held, s)
			if handover {
				out = append(out, s)
			} else {
				let = append(let, s)
			}
		}
	}
	m.publish(a.changed)
	m.logMoves(took, handedIn, taken, fromIn, fromTaken, out, let, a.lost)
}

// call runs one lease call bounded by a third of the lease term; on an
// error every shard's result carries it.
func (m *Manager) call(ctx context.Context, what string, shards []events.Shard, f func(context.Context) ([]taskstate.LeaseResult, error)) []taskstate.LeaseResult {
	cctx, cancel := context.WithTimeout(ctx, m.cfg.LeaseTTL/3)
	defer cancel()
	res, err := f(cctx)
	if len(res) != len(shards) {
		res = make([]taskstate.LeaseResult, len(shards))
		for i := range res {
			res[i].Err = err
		}
	}
	for _, r := range res {
		if r.Err != nil {
			m.m.Errors.Inc()
			if ctx.Err() == nil {
				m.log.Warn("shard leases: "+what+" failed", "shards", len(shards), "err", r.Err)
			}
			break
		}
	}
	return res
}

// logMoves logs each kind of move of one poll in one line, and counts
// them.
func (m *Manager) logMoves(took, handedIn, taken []events.Shard, fromIn, fromTaken []string, out, let, lost []events.Shard) {
	if len(took) > 0 {
		m.log.Info("shards acquired", "shards", len(took), "list", shardList(took))
	}
	if len(handedIn) > 0 {
		m.m.Handovers.WithLabelValues("in").Add(float64(len(handedIn)))
		m.handedIn.Add(uint64(len(handedIn)))
		m.log.Info("shards handed over to this replica", "shards", len(handedIn), "list", shardList(handedIn), "from", strings.Join(firstOf(uniq(fromIn), 8), ","))
	}
	if len(taken) > 0 {
		m.m.Takeovers.Add(float64(len(taken)))
		m.tookOver.Add(uint64(len(taken)))
		m.log.Warn("shards taken over: their owner's lease lapsed", "shards", len(taken), "list", shardList(taken), "from", strings.Join(firstOf(uniq(fromTaken), 8), ","))
	}
	if len(out) > 0 {
		m.m.Handovers.WithLabelValues("out").Add(float64(len(out)))
		m.handedOut.Add(uint64(len(out)))
		m.log.Info("shards handed over to their desired owners", "shards", len(out), "list", shardList(out))
	}
	if len(let) > 0 {
		m.log.Warn("shards released: this replica is not ready (projection not caught up)", "shards", len(let), "list", shardList(let))
	}
	if len(lost) > 0 {
		m.m.Lost.Add(float64(len(lost)))
		m.log.Warn("shard leases lost: not renewed in time, another replica holds them", "shards", len(lost), "list", shardList(lost))
	}
}

// shardList names the first few of shards, for a log line.
func shardList(shards []events.Shard) string {
	names := make([]string, 0, min(len(shards), 8))
	for _, s := range firstOf(shards, 8) {
		names = append(names, s.String())
	}
	if len(shards) > 8 {
		names = append(names, "…")
	}
	return strings.Join(names, " ")
}

func firstOf[T any](s []T, n int) []T { return s[:min(len(s), n)] }

func uniq(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}
