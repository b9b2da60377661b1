package scheduler

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/cronstream/cronstream/internal/taskstate"
)

// passesBudget bounds the time one turn spends firing passes back to
// back (firePasses): the turn is the loop's progress, which its shard
// leases are renewed by, and loads and held ticks wait for the next one.
const passesBudget = 500 * time.Millisecond

// firePasses fires due and, while a backlog is left (fairShare) and the
// turn has time, the passes after it, each planned and sent while the one
// before is still in Redis and applied while the next one is: a burst
// larger than one pass keeps Redis busy from one pass to the next instead
// of idle while each pass is applied. No pass is in flight when it
// returns (followShards relies on it).
func (s *Scheduler) firePasses(ctx context.Context, due []*entryRun) {
	if len(due) > s.cfg.Batch {
		s.busy.Store(true) // until the turn ends with no backlog (turn)
	}
	began := s.capacity.begin(s.clock)
	s.firingSince.Store(int64(max(s.clock.Since(s.epoch), 1)))
	defer s.firingSince.Store(0)
	// One limit on the batches in flight for every pass in the turn.
	sem := make(chan struct{}, s.cfg.Parallel)
	p := s.sendPass(ctx, due, sem)
	answered := 0
	for len(s.backlog) > 0 && s.clock.Since(began) < passesBudget {
		// due's storage is free again: sendPass planned from it.
		due = s.fairShare(s.leased(s.heap.popDue(s.clock.Now(), due[:0])))
		if len(due) == 0 {
			break
		}
		next := s.sendPass(ctx, due, sem)
		answered += s.applyPass(p)
		p = next
	}
	answered += s.applyPass(p)
	s.capacity.add(s.clock.Mono(), answered, s.clock.Since(began))
}

// sentPass is a pass whose batches are sent (some may still be in
// flight) and whose results are not applied yet.
type sentPass struct {
	plans []planned
	calls []*passCall
	now   time.Time
	wg    sync.WaitGroup
	// free holds the buffers of batches that are back, for the next
	// batches.
	free chan passRoom
}

// sendPass builds the fires of every entry of due and sends them per queue
// in batches, up to cap(sem) batches in flight at once (with those of the
// pass before) while the next ones are built, so building (CPU here) and
// firing (CPU in Redis) overlap; applyPass applies the results on the loop
// goroutine once all are back (applying them in between would take CPU
// from the fires still to go). A batch that is back keeps only what apply
// needs of its fires and their results (of a fire that created its task
// and nothing else, the task id) and hands its buffers to the next batch,
// so a burst of any size holds about Parallel+1 batches of fires and
// results per pass. A plan's fires (one entry's ticks) always share a
// batch, so their order holds.
func (s *Scheduler) sendPass(ctx context.Context, due []*entryRun, sem chan struct{}) *sentPass {
	p := &sentPass{now: s.clock.Now(), plans: make([]planned, 0, len(due)), free: make(chan passRoom, s.cfg.Parallel+1)}
	seq := s.cfg.Projection.FenceSeq()
	s.configID = s.cfg.Projection.ConfigMessageID(seq)
	fences := taskstate.Fences{ConfigSeq: seq, ConfigID: s.configID, FreshAsOf: s.cfg.Projection.LastHeard(), MaxStaleness: s.cfg.MaxStaleness}
	size := min(s.cfg.Batch, len(due))
	var scratch []taskstate.Fire
	open := map[string]*passCall{}
	send := func(c *passCall) {
		p.calls = append(p.calls, c)
		sem <- struct{}{}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-sem }()
			s.fireBatch(ctx, fences, c, p.free)
		}()
	}
	for _, r := range due {
		fires, more := s.plan(r, p.now, scratch[:0])
		scratch = fires
		if len(fires) == 0 {
			s.schedule(r, p.now)
			continue
		}
		pi := len(p.plans)
		p.plans = append(p.plans, planned{r: r, more: more, farOff: !more && farOff(r, fires[len(fires)-1].Tick, p.now)})
		c := open[r.queue]
		if c != nil && len(c.fires)+len(fires) > s.cfg.Batch {
			send(c)
			c = nil
		}
		if c == nil {
			c = &passCall{owners: make([]int, 0, size), sent: s.takeSent()}
			select {
			case c.passRoom = <-p.free:
			default:
				c.passRoom = s.takeRoom(size)
			}
			open[r.queue] = c
		}
		for i := range fires {
			c.owners = append(c.owners, pi)
			// The plan's fired data is reused by the next plan: the batch
			// keeps a copy until it is back.
			if rec := &fires[i].FiredRecord; len(rec.Data) > 0 {
				from := len(c.fired)
				c.fired = append(c.fired, rec.Data...)
				rec.Data = c.fired[from:len(c.fired):len(c.fired)]
			}
		}
		c.fires = append(c.fires, fires...)
	}
	for _, c := range open {
		send(c)
	}
	return p
}

// applyPass waits for pass p's batches and applies their results
// (finishPass); it returns how many fires got an answer.
func (s *Scheduler) applyPass(p *sentPass) int {
	p.wg.Wait()
	close(p.free)
	for b := range p.free {
		s.putRoom(b)
	}
	return s.finishPass(p.calls, p.plans, p.now)
}

// fireBatch sends one batch of a pass (on a goroutine of its own) and
// hands its buffers to the next batch through free.
func (s *Scheduler) fireBatch(ctx context.Context, fences taskstate.Fences, c *passCall, free chan<- passRoom) {
	results, err := s.broker.FireBatchInto(ctx, fences, c.fires, c.results)
	if err != nil && len(results) != len(c.fires) {
		results = make([]taskstate.FireResult, len(c.fires))
		for i := range results {
			results[i].Err = err
		}
	}
	c.sent = slices.Grow(c.sent[:0], len(c.fires))[:len(c.fires)]
	for i := range c.fires {
		c.sent[i] = sentOf(&c.fires[i], &results[i])
		if m := c.fires[i].Msg; m != nil { // made by buildFire
			*m = taskstate.TaskMessage{}
			fireMessages.Put(m)
		}
	}
	clear(c.fires)
	clear(results)
	select {
	case free <- passRoom{fires: c.fires[:0], results: results[:0], fired: c.fired[:0]}:
	default:
	}
	c.passRoom = passRoom{}
	if s.cfg.OnFire != nil {
		s.cfg.OnFire()
	}
}

// planned is one entry's plan in a pass: its fires, whether more missed
// ticks are to follow, and whether its next tick is far off (farOff).
type planned struct {
	r      *entryRun
	more   bool
	farOff bool
}

// farOffAhead is how far after a pass's now an entry's next tick must lie
// for its placement in the heap to wait for the end of the burst: far
// more than a burst's turns last.
const farOffAhead = 10 * time.Second

// farOff reports whether r's next tick after tick, the last one a pass
// planned at now fires, is at least farOffAhead away. It reads the
// schedule's bound alone (schedule.MinGap), while the plan has the
// schedule at hand: computing the tick itself is most of what placing
// costs.
func farOff(r *entryRun, tick, now time.Time) bool {
	return !r.settling() && !tick.Add(r.sched.MinGap()).Before(now.Add(farOffAhead))
}

// placeFarOff applies the results of the fires of a burst's far-off plans
// (planned.farOff), which its passes left in s.farOff, and places their
// entries in the heap. A burst of daily entries then goes to Redis as
// fast as Redis takes it: between its passes the loop only plans and
// sends, as applying a result, computing the next tick and noting the
// position would take the CPU that the passes still to go are built
// with. Until then nothing can find those entries due, and they wait no
// longer than the burst. Whatever else reads or changes runs before the
// burst ends (a change, a shard move, a held tick's release, a status
// read, a snapshot of asynq's entries, the loop's end) places them
// first, so nothing meets a run whose fire is not applied yet.
func (s *Scheduler) placeFarOff() {
	if len(s.farOff) == 0 {
		return
	}
	n := 0
	for _, p := range s.farOff {
		n += len(p.plans)
	}
	s.reserveHistory(n)
	for _, p := range s.farOff {
		for _, c := range p.calls {
			for i := range c.sent {
				if pl := p.plans[c.owners[i]]; pl.farOff {
					s.applySent(pl.r, &c.sent[i], p.applied)
				}
			}
			s.putSent(c.sent)
			c.sent = nil
		}
	}
	now := s.clock.Now()
	for _, p := range s.farOff {
		for _, pl := range p.plans {
			if pl.farOff {
				s.passed(pl.r, false, now, now)
			}
		}
	}
	clear(s.farOff)
	s.farOff = s.farOff[:0]
	s.missed.report(s)
}

// farOffPass is a pass whose far-off plans wait for placeFarOff.
type farOffPass struct {
	calls   []*passCall
	plans   []planned
	applied time.Time // when the rest of the pass was applied
}

// passRoom is a batch's buffers, handed to a later batch once it is back.
type passRoom struct {
	fires   []taskstate.Fire
	results []taskstate.FireResult
	fired   []byte // the data of the fires' fired records
}

// passCall is one batch of a pass.
type passCall struct {
	passRoom
	owners []int      // plan index of each fire
	sent   []sentFire // each fire with its result, once back
}

// finishPass applies the results of a pass planned at now (on the
// corrected clock), on the loop goroutine: each fire's result and each
// entry's next due instant, but those of far-off plans, which it leaves
// to placeFarOff; it keeps the records for asynq's enqueue history
// (flushHistory). It returns how many fires got an answer, for Capacity.
func (s *Scheduler) finishPass(calls []*passCall, plans []planned, now time.Time) int {
	if n := nearNow(plans); n > 0 {
		s.reserveHistory(n)
	}
	applied := s.clock.Now()
	answered, left := 0, false
	for _, c := range calls {
		keep := false
		for i := range c.sent {
			if f := &c.sent[i]; f.res == nil || f.res.Err == nil {
				answered++
			}
			if pl := plans[c.owners[i]]; pl.farOff {
				keep = true
			} else {
				s.applySent(pl.r, &c.sent[i], applied)
			}
		}
		if keep {
			left = true
		} else {
			s.putSent(c.sent)
			c.sent = nil
		}
	}
	for _, p := range plans {
		if !p.farOff {
			s.passed(p.r, p.more, now, applied)
		}
	}
	if left {
		s.farOff = append(s.farOff, farOffPass{calls: calls, plans: plans, applied: applied})
	}
	s.missed.report(s)
	return answered
}

// nearNow counts the plans finishPass applies (those not far off).
func nearNow(plans []planned) int {
	n := 0
	for _, p := range plans {
		if !p.farOff {
			n++
		}
	}
	return n
}

// applySent applies fire f of r (apply), answered before applied, and
// keeps the asynq history record of a created task.
func (s *Scheduler) applySent(r *entryRun, f *sentFire, applied time.Time) {
	h, ok := s.apply(r, *f, f.result(), applied)
	if !ok {
		return
	}
	if len(s.historyHeld) == 0 {
		s.historyHeldSince = s.clock.Mono()
	}
	s.historyHeld = append(s.historyHeld, h)
}

// reserveHistory makes room in historyHeld for a pass of n fires and, when
// it must grow, for the backlog's too: a burst's records are then copied
// once, not at every doubling of a slice of a hundred thousand.
func (s *Scheduler) reserveHistory(n int) {
	if len(s.historyHeld)+n <= cap(s.historyHeld) {
		return
	}
	for _, b := range s.backlog {
		n += len(b.runs) - b.head
	}
	grown := make([]taskstate.EnqueueEventRecord, len(s.historyHeld), len(s.historyHeld)+n)
	copy(grown, s.historyHeld)
	s.historyHeld = grown
}
