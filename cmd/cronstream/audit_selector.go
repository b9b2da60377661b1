package main

import "github.com/cronstream/cronstream/events"

// selected reports whether m concerns an entry whose labels match
// --selector: a config event when the entry matched before or after it (so
// the change that takes an entry out of the selector shows), a fired or
// skipped event when its entry matches as of the config events read so
// far. Recoveries name a queue, not an entry, and are left out. It keeps
// labelsOf up to date, so it must see every message in order.
func (f *auditFilter) selected(m auditMsg) bool {
	if m.config {
		id, ok := f.names.EntryFromConfigSubject(m.subject)
		if !ok {
			return false
		}
		prev, had := f.labelsOf[id]
		_, e, err := events.DecodeConfigEvent(m.data)
		if err != nil || e == nil {
			return had && f.sel.Matches(prev)
		}
		if e.Removed {
			delete(f.labelsOf, id)
		} else {
			f.labelsOf[id] = e.Labels
		}
		return f.sel.Matches(e.Labels) || had && f.sel.Matches(prev)
	}
	id, ok := f.names.EntryFromFireSubject(m.subject)
	if !ok {
		return false
	}
	labels, known := f.labelsOf[id]
	return known && f.sel.Matches(labels)
}
