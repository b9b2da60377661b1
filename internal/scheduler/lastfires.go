package scheduler

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/cronstream/cronstream/internal/clock"
)

// lastFiresCache holds the activity stream's last fires of entries, read
// off the firing loop to check loaded watermarks against (behind): in one
// pass over every entry's fire subject, or one entry at a time, whichever
// reads less for the load (scanHistory). Either read can take seconds on a
// replica short of CPU or with NATS busy, and a loop that waited for it
// stopped firing what it owned and stopped renewing its shard leases (the
// progress bound) right after taking shards over.
//
// An entry's check is answered only by a read that began after the entry
// asked for it: a read from before would miss the fires a Redis rolled
// back at a failover had just published, and the entry would fire those
// ticks again. Loop goroutine only, except a read's own fields, which its
// goroutine sets before it closes done.
type lastFiresCache struct {
	// all is every entry's last fire from the last pass, which began at
	// allBegan (allRead: a pass ended; allFailed: it failed).
	all       map[string]time.Time
	allBegan  clock.Mono
	allRead   bool
	allFailed bool
	// one holds the entries read one at a time; wantOne those waiting
	// for such a read, wantAll that a load waits for a pass.
	one     map[string]lastFire
	wantOne map[string]bool
	wantAll bool
	// reading is the read in flight (nil: none).
	reading *lastFiresRead
	// gaveUp counts the entries that stopped waiting for a read at their
	// deadline (checkDeadline) since the last load pass said so.
	gaveUp int
}

// lastFire is one entry's last fire as read (ok false: none) by a read
// that began at began and was taken in at at; unchecked: the read failed,
// nothing is known.
type lastFire struct {
	tick      time.Time
	ok        bool
	unchecked bool
	began, at clock.Mono
}

// lastFiresRead is one read run in a goroutine of its own: a pass (ids
// nil) or ids one at a time.
type lastFiresRead struct {
	began  clock.Mono
	ids    []string
	done   chan struct{}
	last   map[string]time.Time
	got    map[string]bool // ids read (one at a time)
	err    error
	cancel context.CancelFunc
}

// lastFireOf returns entry id's last fire in the activity stream, from a
// read that began at or after asked, when the entry first asked. read is
// false while the read it needs runs: it is started here when none runs
// (after the one in flight, when that began too early), and it wakes the
// loop when it ends. scan asks for a pass over every entry rather than a
// read of id alone.
func (s *Scheduler) lastFireOf(ctx context.Context, id string, scan bool, asked clock.Mono) (last lastFire, read bool) {
	s.takeInLastFires(ctx)
	c := &s.hist.fires
	if last, ok := c.cached(id, asked); ok {
		return last, true
	}
	if scan {
		c.wantAll = true
	} else {
		if c.wantOne == nil {
			c.wantOne = map[string]bool{}
		}
		c.wantOne[id] = true
	}
	s.startLastFires(ctx)
	if c.reading == nil {
		// Refused at once (stream reads paused after a failure, or NATS
		// down): the entry is cached unchecked, and waits for nothing.
		return c.cached(id, asked)
	}
	return lastFire{}, false
}

// cached returns entry id's last fire from a read that began at or after
// asked: a pass, or a read of id.
func (c *lastFiresCache) cached(id string, asked clock.Mono) (lastFire, bool) {
	if c.allRead && !c.allBegan.Before(asked) {
		tick, ok := c.all[id]
		return lastFire{tick: tick, ok: ok, unchecked: c.allFailed, began: c.allBegan}, true
	}
	if f, found := c.one[id]; found && !f.began.Before(asked) {
		return f, true
	}
	return lastFire{}, false
}

// startLastFires starts the read the loads wait for, unless one runs: a
// pass when one waits for it, else the entries waiting one at a time.
func (s *Scheduler) startLastFires(ctx context.Context) {
	c := &s.hist.fires
	if c.reading != nil || (!c.wantAll && len(c.wantOne) == 0) {
		return
	}
	var ids []string
	if !c.wantAll {
		ids = slices.Sorted(maps.Keys(c.wantOne))
	}
	c.wantAll, c.wantOne = false, nil
	began := s.clock.Mono()
	rctx, cancel, err := s.bounded.begin(ctx)
	if err != nil {
		// Stream reads paused after a failure: nothing to wait for.
		s.keepLastFires(&lastFiresRead{began: began, ids: ids, err: err})
		return
	}
	r := &lastFiresRead{began: began, ids: ids, done: make(chan struct{}), cancel: cancel}
	c.reading = r
	h := s.bounded.h
	s.life.Go(func(context.Context) {
		if ids == nil {
			r.last, r.err = h.LastHandledAll(rctx)
		} else {
			r.last, r.got = map[string]time.Time{}, map[string]bool{}
			for _, id := range ids {
				tick, _, ok, err := h.LastHandled(rctx, id)
				if err != nil {
					r.err = err
					break
				}
				if r.got[id] = true; ok {
					r.last[id] = tick
				}
			}
		}
		// Ended before the wake: the loop it wakes takes the read in.
		close(r.done)
		select {
		case s.wake <- struct{}{}:
		default:
		}
	})
}

// takeInLastFires takes the read in flight in once it has ended.
func (s *Scheduler) takeInLastFires(ctx context.Context) {
	c := &s.hist.fires
	if !c.ended() {
		return
	}
	r := c.reading
	c.reading = nil
	err := s.bounded.end(ctx, r.cancel, r.err)
	if err != nil && ctx.Err() == nil {
		what := "read the entries' last ticks from the stream; not checking watermarks against it"
		if r.ids != nil {
			what = "read entries' last ticks from the stream; not checking the watermarks of those not read"
		}
		s.log.Warn(what, "entries", len(r.ids), "read", len(r.got), "err", err)
	}
	s.keepLastFires(r)
	s.startLastFires(ctx) // the loads that asked meanwhile
}

// keepLastFires caches what read r found. An entry it did not read (the
// read failed) is cached unchecked: its watermark is taken as Redis holds
// it, as whenever the stream cannot be read.
func (s *Scheduler) keepLastFires(r *lastFiresRead) {
	c := &s.hist.fires
	now := s.clock.Mono()
	if r.ids == nil {
		c.all, c.allBegan, c.allRead, c.allFailed = r.last, r.began, true, r.err != nil
		return
	}
	if c.one == nil {
		c.one = map[string]lastFire{}
	}
	for id, f := range c.one {
		if s.clock.Since(f.at) >= historyRefresh {
			delete(c.one, id)
		}
	}
	for _, id := range r.ids {
		tick, ok := r.last[id]
		c.one[id] = lastFire{tick: tick, ok: ok, unchecked: !r.got[id], began: r.began, at: now}
	}
}

// ended reports whether a read has ended and is not taken in yet: the
// entries waiting for it load at once.
func (c *lastFiresCache) ended() bool {
	if c.reading == nil {
		return false
	}
	select {
	case <-c.reading.done:
		return true
	default:
		return false
	}
}
