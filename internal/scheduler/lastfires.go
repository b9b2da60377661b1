package scheduler

import (
	"context"
	"time"

	"github.com/cronstream/cronstream/internal/clock"
)

// lastFiresCache holds the activity stream's last fire of every entry
// (History.LastHandledAll), read off the firing loop. The read goes over
// every entry's fire subject; on a replica short of CPU, or with many
// entries, it takes seconds, and a loop that waited for it stopped firing
// what it owned and stopped renewing its shard leases (the progress bound)
// right after taking shards over. Loop goroutine only, except the read's
// own fields, which its goroutine sets before it closes done.
type lastFiresCache struct {
	last map[string]time.Time // nil: not read, or the read failed
	at   clock.Mono           // when the read in last was taken in
	read bool                 // last holds a read's outcome
	// reading is the read in flight (nil: none).
	reading *lastFiresRead
}

// lastFiresRead is one LastHandledAll run in a goroutine of its own.
type lastFiresRead struct {
	began  clock.Mono
	done   chan struct{}
	last   map[string]time.Time
	err    error
	cancel context.CancelFunc
	// gaveUp: an entry stopped waiting for it (logged once).
	gaveUp bool
}

// lastFires returns every entry's last fire in the activity stream, as read
// within historyRefresh (nil when that read failed: nothing to check
// against). read is false while a read runs: it is started here when none
// does, and it wakes the loop when it ends.
func (s *Scheduler) lastFires(ctx context.Context) (last map[string]time.Time, read bool) {
	c := &s.hist.fires
	if r := c.reading; r != nil {
		select {
		case <-r.done:
			c.reading = nil
			c.last, c.at, c.read = r.last, s.clock.Mono(), true
			if err := s.bounded.end(ctx, r.cancel, r.err); err != nil {
				s.log.Warn("read the entries' last ticks from the stream; not checking watermarks against it", "err", err)
			}
		default:
			return nil, false
		}
	}
	if c.read && s.clock.Since(c.at) < historyRefresh {
		return c.last, true
	}
	rctx, cancel, err := s.bounded.begin(ctx)
	if err != nil {
		// Stream reads paused after a failure: nothing to wait for.
		c.last, c.at, c.read = nil, s.clock.Mono(), true
		return nil, true
	}
	r := &lastFiresRead{began: s.clock.Mono(), done: make(chan struct{}), cancel: cancel}
	c.reading, c.read = r, false
	s.life.Go(func(context.Context) {
		defer close(r.done)
		r.last, r.err = s.bounded.h.LastHandledAll(rctx)
		select {
		case s.wake <- struct{}{}:
		default:
		}
	})
	return nil, false
}

// ended reports whether a read is in and not yet taken in: the entries
// waiting for it load at once.
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

// gaveUpLastFires notes that r stopped waiting for the last fires in
// flight: its oldest due tick would otherwise pass the grace. Its watermark
// is taken as Redis holds it, as when the read fails.
func (s *Scheduler) gaveUpLastFires(r *entryRun) {
	read := s.hist.fires.reading
	if read == nil || read.gaveUp {
		return
	}
	read.gaveUp = true
	s.log.Warn("the stream's last fires are not read yet and due ticks are near the end of the grace: loading watermarks as Redis holds them, unchecked",
		"entry", r.id, "reading_for", s.clock.Since(read.began).Round(time.Millisecond))
}
