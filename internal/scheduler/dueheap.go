package scheduler

import (
	"container/heap"
	"time"
)

// dueHeap orders entries by the instant this replica should next act on
// them. One timer is armed for the top; cost per tick grows with the number
// of due entries, not the number registered.
type dueHeap []*entryRun

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *dueHeap) Push(x any) {
	e := x.(*entryRun)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *dueHeap) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = nil
	e.index = -1
	*h = old[:n-1]
	return e
}

// set places e at due, adding it if it is not in the heap.
func (h *dueHeap) set(e *entryRun, due time.Time) {
	e.due = due
	if e.index >= 0 {
		heap.Fix(h, e.index)
		return
	}
	heap.Push(h, e)
}

// remove takes e out of the heap if it is there.
func (h *dueHeap) remove(e *entryRun) {
	if e.index >= 0 {
		heap.Remove(h, e.index)
	}
}

// popDue removes and returns every entry due at or before now.
func (h *dueHeap) popDue(now time.Time, into []*entryRun) []*entryRun {
	for h.Len() > 0 && !(*h)[0].due.After(now) {
		into = append(into, heap.Pop(h).(*entryRun))
	}
	return into
}

// peek returns when the first entry is due, if any.
func (h dueHeap) peek() (time.Time, bool) {
	if len(h) == 0 {
		return time.Time{}, false
	}
	return h[0].due, true
}
