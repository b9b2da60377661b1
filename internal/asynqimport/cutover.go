package asynqimport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cronstream/cronstream/internal/taskstate"
)

// Defaults of a Cutover.
const (
	// DefaultSettle is how long the cutover keeps capturing after the
	// last scheduler stopped: asynq's Shutdown records the enqueues in
	// flight after it cleared its list, within milliseconds unless Redis
	// is struggling.
	DefaultSettle = 10 * time.Second
	// DefaultPoll is how often the schedulers' lists are read.
	DefaultPoll = 200 * time.Millisecond
	// MaxCutoverEntries bounds the asynq entries of one cutover: each
	// holds a Redis connection while it runs.
	MaxCutoverEntries = 1000
)

// Cutover watches the asynq schedulers Read found stop, capturing every
// enqueue they record until then, and gives each entry the start that
// follows the last tick asynq enqueued of it.
type Cutover struct {
	Store *taskstate.Store
	// Settle, Poll: DefaultSettle, DefaultPoll when zero.
	Settle time.Duration
	Poll   time.Duration
	// Say receives what the operator must know as it happens (stop the
	// schedulers now; which stopped).
	Say func(msg string)
}

// Handover is one entry's start in cronstream.
type Handover struct {
	Entry
	// LastEnqueue is the latest enqueue asynq recorded of the entry, by
	// any of its schedulers (zero when none).
	LastEnqueue time.Time
	// StartAt is the entry's start_at: the whole second after
	// LastEnqueue, or, for an entry asynq never enqueued, the next run
	// its scheduler last listed, a tick asynq did not fire.
	StartAt time.Time
	// Basis says which of the two StartAt came from.
	Basis string
	// Risks are what the cutover could not vouch for (a scheduler that
	// was killed rather than shut down).
	Risks []string
}

// Bases of a StartAt.
const (
	BasisHistory = "last enqueue"
	BasisNextRun = "next run asynq listed"
)

// ErrCutoverAborted: the cutover stopped before every scheduler did; it
// put the enqueue history it had taken back, and hands over nothing.
var ErrCutoverAborted = errors.New("cutover aborted")

// watched is one scheduler the cutover waits for.
type watched struct {
	stopped bool
	cleared bool // it removed itself from asynq:schedulers (a shutdown)
	// next is each of its entries' next run as it last listed them.
	next map[string]time.Time
}

// Run captures the enqueue history of every entry of r, tells the operator
// (Say) to stop the schedulers, waits until every one has stopped and
// Settle has passed, and returns each entry's handover. Warnings about
// schedulers that did not shut down cleanly are added to their entries.
// When ctx ends, a capture fails or a scheduler appears that was not read,
// it aborts (ErrCutoverAborted), putting the history it took back.
func (c Cutover) Run(ctx context.Context, r Result) ([]Handover, error) {
	c.Settle, c.Poll = cmp.Or(c.Settle, DefaultSettle), cmp.Or(c.Poll, DefaultPoll)
	if c.Say == nil {
		c.Say = func(string) {}
	}
	if err := CheckCutover(r); err != nil {
		return nil, err
	}
	var ids []string
	w := map[string]*watched{}
	for _, e := range r.Entries {
		for _, s := range e.Sources {
			ids = append(ids, s.EntryID)
			if w[s.Scheduler] == nil {
				w[s.Scheduler] = &watched{next: map[string]time.Time{}}
			}
			w[s.Scheduler].next[s.EntryID] = s.Next
		}
	}
	capture, err := c.Store.CaptureHistory(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("capture the enqueue history: %w", err)
	}
	watchErr := c.watch(ctx, w, capture)
	stopErr := capture.Stop(context.WithoutCancel(ctx))
	if watchErr != nil || stopErr != nil {
		// Nothing is handed over: what was taken goes back, also of the
		// schedulers that stopped (their history would have been deleted,
		// but a second cutover attempt needs nothing of it).
		rerr := c.Store.Restore(context.WithoutCancel(ctx), capture, ids)
		return nil, fmt.Errorf("%w: %w", ErrCutoverAborted, errors.Join(watchErr, stopErr, rerr))
	}
	// A scheduler that did not shut down (killed; its list expired) left
	// its history, as asynq leaves it: put it back.
	var keep []string
	for _, e := range r.Entries {
		for _, s := range e.Sources {
			if !w[s.Scheduler].cleared {
				keep = append(keep, s.EntryID)
			}
		}
	}
	if err := c.Store.Restore(context.WithoutCancel(ctx), capture, keep); err != nil {
		c.Say(fmt.Sprintf("warning: could not put back the enqueue history of stopped schedulers: %v", err))
	}
	return handovers(r, w, capture), nil
}

// CheckCutover refuses what a cutover of r cannot hand over exactly: an
// entry whose time zone does not fit the next run asynq listed (its
// ticks would be other instants), or more asynq entries than
// MaxCutoverEntries.
func CheckCutover(r Result) error {
	n := 0
	for _, e := range r.Entries {
		if e.ZoneMismatch {
			return fmt.Errorf("entry %s: its time zone does not fit the next run asynq listed (see its warning): pass --timezone", e.Entry.ID)
		}
		n += len(e.Sources)
	}
	if n > MaxCutoverEntries {
		return fmt.Errorf("%d asynq entries: a cutover takes at most %d (each holds a Redis connection while it runs)", n, MaxCutoverEntries)
	}
	return nil
}

// watch waits until every scheduler in w has stopped, then for Settle.
func (c Cutover) watch(ctx context.Context, w map[string]*watched, capture *taskstate.HistoryCapture) error {
	// Every scheduler must still run now that the capture blocks on its
	// keys: one that stopped before may have recorded and deleted an
	// enqueue the capture did not see.
	if err := c.look(ctx, w, true); err != nil {
		return err
	}
	c.Say(fmt.Sprintf("watching %d asynq scheduler(s): stop them now (SIGTERM, or however you stop them normally); the cutover goes on once every one has stopped", len(w)))
	var settleFrom time.Time
	t := time.NewTicker(c.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted: %w", ctx.Err())
		case <-t.C:
		}
		if err := capture.Err(); err != nil {
			return err
		}
		if err := c.look(ctx, w, false); err != nil {
			return err
		}
		if !allStopped(w) {
			continue
		}
		if settleFrom.IsZero() {
			settleFrom = time.Now()
			c.Say(fmt.Sprintf("every scheduler has stopped; capturing enqueues in flight for %s", c.Settle))
		}
		if time.Since(settleFrom) >= c.Settle {
			return nil
		}
	}
}

// look reads the schedulers' lists once: it updates each one's next runs,
// marks the stopped ones, and fails on a running scheduler it does not
// watch (or, when first, on one that already stopped).
func (c Cutover) look(ctx context.Context, w map[string]*watched, first bool) error {
	lists, err := c.Store.ListSchedulers(ctx)
	if err != nil {
		return err
	}
	running := map[string]taskstate.ListedScheduler{}
	listed := map[string]bool{}
	for _, l := range lists {
		listed[l.ID] = true
		// A list that exists is a live scheduler's: its TTL is Redis's.
		if l.Exists && !taskstate.IsOwnSchedulerID(l.ID) {
			running[l.ID] = l
		}
	}
	for id := range running {
		if w[id] == nil {
			return fmt.Errorf("asynq scheduler %s started during the cutover: stop every asynq scheduler (and whatever restarts them) before cutting over", id)
		}
	}
	for id, s := range w {
		l, ok := running[id]
		switch {
		case ok && !s.stopped:
			for _, e := range l.Entries {
				if _, mine := s.next[e.ID]; mine {
					s.next[e.ID] = e.Next
				}
			}
		case ok:
			return fmt.Errorf("asynq scheduler %s is running again", id)
		case first:
			return fmt.Errorf("asynq scheduler %s stopped before the cutover watched it: start the cutover while the schedulers run", id)
		case !s.stopped:
			s.stopped, s.cleared = true, !listed[id]
			how := "shut down"
			if !s.cleared {
				how = "gone without shutting down (its list expired): taken as dead, so make sure its process is; an enqueue in flight when it died has no record, and may be enqueued again"
			}
			c.Say(fmt.Sprintf("asynq scheduler %s %s", id, how))
		}
	}
	return nil
}

func allStopped(w map[string]*watched) bool {
	for _, s := range w {
		if !s.stopped {
			return false
		}
	}
	return true
}

// handovers gives each entry its start from what was captured.
func handovers(r Result, w map[string]*watched, capture *taskstate.HistoryCapture) []Handover {
	evs := capture.Events()
	out := make([]Handover, 0, len(r.Entries))
	for _, e := range r.Entries {
		h := Handover{Entry: e}
		var next time.Time
		for _, s := range e.Sources {
			for _, ev := range evs[s.EntryID] {
				if ev.EnqueueTime.After(h.LastEnqueue) {
					h.LastEnqueue = ev.EnqueueTime
				}
			}
			if n := w[s.Scheduler].next[s.EntryID]; !n.IsZero() && (next.IsZero() || n.Before(next)) {
				next = n
			}
			if !w[s.Scheduler].cleared {
				h.Risks = append(h.Risks, fmt.Sprintf("scheduler %s did not shut down: if it was killed while enqueueing this entry, that tick may be enqueued twice", s.Scheduler))
			}
		}
		h.StartAt, h.Basis = StartAt(h.LastEnqueue, next)
		out = append(out, h)
	}
	return out
}

// StartAt is the start_at that hands an entry over after asynq's last
// enqueue of it: the whole second after lastEnqueue. asynq records an
// enqueue after its task is created, at or after its tick, and the next
// tick of a cron spec is a minute or more later, so the start lies after
// the last tick asynq enqueued and at or before the first it did not.
// Ticks are instants of the schedule, not of anyone's clock: asynq's
// clock labelled its enqueues, and the replicas fire the ticks from the
// start on, so a skewed clock moves neither. Without any enqueue it is
// the next run asynq last listed (a tick it did not fire: it recorded no
// enqueue), at whole seconds. Zero when there is neither.
func StartAt(lastEnqueue, nextRun time.Time) (time.Time, string) {
	switch {
	case !lastEnqueue.IsZero():
		return lastEnqueue.UTC().Truncate(time.Second).Add(time.Second), BasisHistory
	case !nextRun.IsZero():
		return nextRun.UTC().Truncate(time.Second), BasisNextRun
	}
	return time.Time{}, ""
}
