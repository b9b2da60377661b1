package contract

import (
	"hash/maphash"
	"maps"
	"slices"
	"sync/atomic"
)

// Many entries repeat the same values: a cron spec, a zone, a queue, a
// task type, an owner, a set of labels or headers. Every replica holds
// every entry (the projection), so a decoded entry ends with
// shareRepeated: such values are replaced by one copy held for all. The
// fast path shares strings as it reads them; encoding/json (gated events,
// and whatever the fast path leaves to it) does not, and a map costs a
// few hundred bytes however small, so without this every entry with
// labels or headers would pay for its own maps. Nothing changes a
// decoded entry's maps in place (Clone copies what a writer changes), so
// sharing them is safe. strs says the strings too are to be shared (e was
// decoded by encoding/json, not by the fast path).
func (e *Entry) shareRepeated(strs bool) {
	e.Labels = recurringMap.get(e.Labels)
	e.Task.Headers = recurringMap.get(e.Task.Headers)
	if !strs {
		return
	}
	e.Cron = recurring.str(e.Cron)
	e.Timezone = recurring.str(e.Timezone)
	e.Owner = recurring.str(e.Owner)
	e.Overlap = OverlapPolicy(recurring.str(string(e.Overlap)))
	e.Catchup.Policy = CatchupPolicy(recurring.str(string(e.Catchup.Policy)))
	e.Task.Type = recurring.str(e.Task.Type)
	e.Options.Queue = recurring.str(e.Options.Queue)
	e.Options.Group = recurring.str(e.Options.Group)
	for i, x := range e.Exclude {
		e.Exclude[i] = recurring.str(x)
	}
}

// str is get for a string already made: it returns the copy held when
// there is one, and holds s otherwise.
func (t *recurringStrings) str(s string) string {
	if len(s) == 0 || len(s) > maxRecurringLen {
		return s
	}
	slot := &t.slots[maphash.String(t.seed, s)%recurringSlots]
	if p := slot.Load(); p != nil && *p == s {
		return *p
	}
	slot.Store(&s)
	return s
}

// recurringMapSlots bounds the table of maps; maxRecurringMap keeps larger
// maps (which rarely recur) out of it.
const (
	recurringMapSlots = 1024
	maxRecurringMap   = 8
)

// recurringMaps is recurringStrings for small string maps (labels, task
// headers): a lossy table whose slot holds the last map hashed to it,
// never changed once stored.
type recurringMaps struct {
	seed  maphash.Seed
	slots [recurringMapSlots]atomic.Pointer[map[string]string]
}

var recurringMap = &recurringMaps{seed: maphash.MakeSeed()}

// get returns the map held equal to m, or holds a copy of m (its strings
// shared) and returns it. An empty or larger map is returned as it is.
func (t *recurringMaps) get(m map[string]string) map[string]string {
	if len(m) == 0 || len(m) > maxRecurringMap {
		return m
	}
	var buf [maxRecurringMap]string
	keys := buf[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var h maphash.Hash
	h.SetSeed(t.seed)
	for _, k := range keys {
		h.WriteString(k)
		h.WriteByte(0)
		h.WriteString(m[k])
		h.WriteByte(0)
	}
	slot := &t.slots[h.Sum64()%recurringMapSlots]
	if p := slot.Load(); p != nil && maps.Equal(*p, m) {
		return *p
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[recurring.str(k)] = recurring.str(v)
	}
	slot.Store(&c)
	return c
}
