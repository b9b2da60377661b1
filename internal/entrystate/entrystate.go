// Package entrystate says which state an entry is in (active, paused,
// ended or completed) and counts entries by it: the one reading that
// `cronstream status` and the console's overview both show, so their
// figures cannot disagree.
package entrystate

import (
	"context"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

// State is an entry's state as shown.
type State string

// Entry states. An entry is in exactly one: ended comes before paused (an
// ended entry fires nothing whether paused or not), completed applies to
// an entry that would otherwise be active.
const (
	Active State = "active"
	Paused State = "paused"
	// Ended: past its end_at; it stays registered and fires nothing.
	Ended State = "ended"
	// Completed: a limited entry that fired its max_fires ticks; it stays
	// registered and fires nothing until the limit changes.
	Completed State = "completed"
)

// Of is the state an entry's configuration alone gives at now: ended,
// paused or active. Whether an active limited entry is completed is read
// from Redis (FiresLeft, Current).
func Of(e events.Entry, now time.Time) State {
	switch {
	case e.Ended(now):
		return Ended
	case e.Paused:
		return Paused
	}
	return Active
}

// Left is how many scheduled fires a limited entry has left.
type Left struct {
	Left int
	// Unknown: Redis lost the entry's count and it could not be rebuilt,
	// so the entry counts as completed until its limit changes.
	Unknown bool
}

// FiresLeft reads the fires left of each limited entry among states from
// its fires counter in Redis, in one pipeline; entries without a limit are
// not in the map. A counter of an earlier limit (another revision) counts
// as no fires.
func FiresLeft(ctx context.Context, store *taskstate.Store, prefix string, states []*projector.State) (map[string]Left, error) {
	var refs []taskstate.FireCountRef
	var limited []*projector.State
	for _, st := range states {
		if st.Entry.Limited() {
			refs = append(refs, taskstate.FireCountRef{Queue: st.Entry.Options.QueueName(), Entry: st.Entry.ID})
			limited = append(limited, st)
		}
	}
	counts, ok, err := store.FireCounts(ctx, prefix, refs)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Left, len(limited))
	for i, st := range limited {
		fired, unknown := 0, false
		if ok[i] && counts[i].Since == st.MaxFiresSince {
			fired, unknown = counts[i].Count, counts[i].Unknown()
		}
		out[st.Entry.ID] = Left{Left: max(st.Entry.MaxFires-fired, 0), Unknown: unknown}
	}
	return out, nil
}

// Current is st's state at now with its fires left (from FiresLeft; nil
// when Redis could not be read, and then no entry is completed).
func Current(st *projector.State, left map[string]Left, now time.Time) State {
	s := Of(st.Entry, now)
	if l, ok := left[st.Entry.ID]; s == Active && ok && l.Left == 0 {
		return Completed
	}
	return s
}

// Counts are the entries in each state.
type Counts struct {
	Active    int `json:"active"`
	Paused    int `json:"paused"`
	Ended     int `json:"ended"`     // past their end_at
	Completed int `json:"completed"` // fired their max_fires (read from Redis)
}

// Add counts one entry in state s.
func (c *Counts) Add(s State) {
	switch s {
	case Active:
		c.Active++
	case Paused:
		c.Paused++
	case Ended:
		c.Ended++
	case Completed:
		c.Completed++
	}
}

// Count counts states by Current.
func Count(states []*projector.State, left map[string]Left, now time.Time) Counts {
	var c Counts
	for _, st := range states {
		c.Add(Current(st, left, now))
	}
	return c
}
