package firetest

import (
	"context"
	"iter"
	"sync"
	"sync/atomic"
	"time"
)

// Runs records what a worker did with the tasks of one entry: when each
// task ran, how many times, and how often one started while another ran.
// A test's asynq handler calls Work for each task it is given; the zero
// value is ready to use.
type Runs struct {
	running atomic.Int32
	overlap atomic.Int32

	mu    sync.Mutex
	runs  map[string]*Run
	ended int
}

// Run is what Runs knows of one task: when its last run started and ended
// (End zero while it runs), and how many times it ran.
type Run struct {
	Start, End time.Time
	Times      int
}

// Work records a run of task id that takes work, or ends with ctx (the
// worker stopping).
func (r *Runs) Work(ctx context.Context, id string, work time.Duration) {
	if r.running.Add(1) > 1 {
		r.overlap.Add(1)
	}
	defer r.running.Add(-1)
	r.mu.Lock()
	if r.runs == nil {
		r.runs = map[string]*Run{}
	}
	run := r.runs[id]
	if run == nil {
		run = &Run{}
		r.runs[id] = run
	}
	run.Start, run.End = time.Now(), time.Time{}
	run.Times++
	r.mu.Unlock()
	select {
	case <-time.After(work):
	case <-ctx.Done():
	}
	r.mu.Lock()
	run.End = time.Now()
	r.ended++
	r.mu.Unlock()
}

// Overlaps is how many times a task started while another was running.
func (r *Runs) Overlaps() int { return int(r.overlap.Load()) }

// Ended is how many runs have ended.
func (r *Runs) Ended() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}

// Finished reports whether every task in ids has run to its end.
func (r *Runs) Finished(ids iter.Seq[string]) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range ids {
		if run := r.runs[id]; run == nil || run.End.IsZero() {
			return false
		}
	}
	return true
}

// All returns the runs by task id, as they are now.
func (r *Runs) All() map[string]Run {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]Run, len(r.runs))
	for id, run := range r.runs {
		out[id] = *run
	}
	return out
}
