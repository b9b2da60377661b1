package scheduler

import (
	"context"
	"sync"
	"time"

	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// fireDue builds the fires of every due entry and sends them per queue in
// batches. Up to Parallel batches are in flight at once while the next ones
// are built, so building (CPU here) and firing (CPU in Redis) overlap; the
// results are applied on the loop goroutine once all are back (applying
// them in between would take CPU from the fires still to go). A batch that
// is back keeps only what apply needs of its fires and their results (of a
// fire that created its task and nothing else, the task id) and hands its
// buffers to the next batch, so a burst of any size holds about Parallel+1
// batches of fires and results. A plan's fires (one entry's ticks) always
// share a batch, so their order holds.
func (s *Scheduler) fireDue(ctx context.Context, due []*entryRun) {
	if len(due) > s.cfg.Batch {
		s.busy.Store(true)
		defer s.busy.Store(false)
	}
	began := s.capacity.begin(s.clock)
	s.firingSince.Store(int64(max(s.clock.Since(s.epoch), 1)))
	defer s.firingSince.Store(0)
	now := s.clock.Now()
	seq := s.cfg.Projection.FenceSeq()
	s.configID = s.cfg.Projection.ConfigMessageID(seq)
	fences := taskstate.Fences{ConfigSeq: seq, ConfigID: s.configID, FreshAsOf: s.cfg.Projection.LastHeard(), MaxStaleness: s.cfg.MaxStaleness}
	size := min(s.cfg.Batch, len(due))
	plans := make([]planned, 0, len(due))
	var scratch []taskstate.Fire
	open := map[string]*passCall{}
	var calls []*passCall
	// Buffers of batches that are back, for the next batches.
	free := make(chan passRoom, s.cfg.Parallel+1)
	var wg sync.WaitGroup
	sem := make(chan struct{}, s.cfg.Parallel)
	send := func(c *passCall) {
		calls = append(calls, c)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s.fireBatch(ctx, fences, c, free)
		}()
	}
	for _, r := range due {
		fires, more := s.plan(r, now, scratch[:0])
		scratch = fires
		if len(fires) == 0 {
			s.schedule(r, now)
			continue
		}
		pi := len(plans)
		plans = append(plans, planned{r, more})
		c := open[r.queue]
		if c != nil && len(c.fires)+len(fires) > s.cfg.Batch {
			send(c)
			c = nil
		}
		if c == nil {
			c = &passCall{owners: make([]int, 0, size)}
			select {
			case c.passRoom = <-free:
			default:
				c.fires = s.fireBuf(size)
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
	wg.Wait()
	close(free)
	for b := range free {
		s.putFireBuf(b.fires)
	}
	s.finishPass(calls, plans, now, began)
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
	c.sent = make([]sentFire, len(c.fires))
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

// planned is one entry's plan in a pass: its fires, and whether more
// missed ticks are to follow.
type planned struct {
	r    *entryRun
	more bool
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

// finishPass applies the results of a pass begun at began (now on the
// corrected clock), on the loop goroutine: each fire's result, each
// entry's next due instant, asynq's enqueue history, and the pass's
// fires and time for Capacity.
func (s *Scheduler) finishPass(calls []*passCall, plans []planned, now time.Time, began clock.Mono) {
	history := make([]taskstate.EnqueueEventRecord, 0, len(plans))
	answered := 0
	for _, c := range calls {
		for i := range c.sent {
			res := c.sent[i].result()
			if res.Err == nil {
				answered++
			}
			if h, ok := s.apply(plans[c.owners[i]].r, c.sent[i], res); ok {
				history = append(history, h)
			}
		}
	}
	s.capacity.add(s.clock.Mono(), answered, s.clock.Since(began))
	for _, p := range plans {
		s.passed(p.r, p.more, now)
	}
	s.missed.report(s)
	s.sendHistory(history)
}
