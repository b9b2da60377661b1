package scheduler

import (
	"container/heap"
	"slices"
	"sync/atomic"
	"time"
)

// dueHeap orders entries by the instant this replica should next act on
// them. One timer is armed for the top; cost per tick grows with the number
// of due entries, not the number registered. It counts its operations
// (Scheduler.HeapOps): a replica's heap work is its share of the entries, which
// the simulation of many replicas checks.
type dueHeap struct {
	h   entryHeap
	ops atomic.Uint64 // pushes, fixes, removals and pops
}

// entryHeap is the heap.Interface of dueHeap.
type entryHeap []*entryRun

func (h entryHeap) Len() int           { return len(h) }
func (h entryHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h entryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *entryHeap) Push(x any) {
	e := x.(*entryRun)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *entryHeap) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = nil
	e.index = -1
	*h = old[:n-1]
	return e
}

// set places e at due, adding it if it is not in the heap.
func (d *dueHeap) set(e *entryRun, due time.Time) {
	d.ops.Add(1)
	e.due = due
	if e.index >= 0 {
		heap.Fix(&d.h, e.index)
		return
	}
	heap.Push(&d.h, e)
}

// remove takes e out of the heap if it is there.
func (d *dueHeap) remove(e *entryRun) {
	if e.index >= 0 {
		d.ops.Add(1)
		heap.Remove(&d.h, e.index)
	}
}

// popDue removes and returns every entry due at or before now.
func (d *dueHeap) popDue(now time.Time, into []*entryRun) []*entryRun {
	n := len(into)
	for d.h.Len() > 0 && !d.h[0].due.After(now) {
		into = growDoubling(into)
		into = append(into, heap.Pop(&d.h).(*entryRun))
	}
	d.ops.Add(uint64(len(into) - n))
	return into
}

// peek returns when the first entry is due, if any.
func (d *dueHeap) peek() (time.Time, bool) {
	if len(d.h) == 0 {
		return time.Time{}, false
	}
	return d.h[0].due, true
}

// growDoubling makes room for one more run, doubling a full slice: append
// grows a large slice by a quarter, so a burst of a hundred thousand due
// entries would be copied about twenty times, each time into new memory.
func growDoubling(runs []*entryRun) []*entryRun {
	if len(runs) < cap(runs) {
		return runs
	}
	return slices.Grow(runs, max(len(runs), 64))
}
