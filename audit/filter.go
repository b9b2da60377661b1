package audit

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/cronstream/cronstream/events"
)

// ErrUnknownType is wrapped by CheckType's error for a pattern that matches
// none of cronstream's event types.
var ErrUnknownType = errors.New("matches no event type")

// MatchType reports whether an event type matches pattern (path.Match
// syntax) by its full name ("cronstream.entry.fired"), its name without
// "cronstream." ("entry.fired") or its short name ("fired").
func MatchType(pattern, typ string) bool {
	kind := events.ConfigKind(typ) // a gated config event matches its kind
	for _, name := range []string{typ, strings.TrimPrefix(typ, "cronstream."), events.ShortType(typ), kind, strings.TrimPrefix(kind, "cronstream.")} {
		if ok, _ := path.Match(pattern, name); ok {
			return true
		}
	}
	return false
}

// CheckType checks a type pattern before a read: path.ErrBadPattern when it
// is not a pattern, ErrUnknownType when it matches none of events.Types, so
// a typo is an error rather than an empty result. A pattern in another
// namespace ("com.example.*": events this version does not know) is
// accepted.
func CheckType(pattern string) error {
	if _, err := path.Match(pattern, ""); err != nil {
		return err
	}
	ours := map[string]bool{"cronstream": true}
	for _, ti := range events.Types {
		if MatchType(pattern, ti.Type) {
			return nil
		}
		ours[strings.Split(ti.Type, ".")[1]] = true
	}
	if first, _, dotted := strings.Cut(pattern, "."); dotted && !ours[first] {
		return nil
	}
	return fmt.Errorf("%q %w", pattern, ErrUnknownType)
}

// filter decides which messages a Reader returns.
type filter struct {
	names        events.Names
	entry, queue string
	types        []string // patterns; empty: every type
	since, until time.Time
	// queueOf follows each entry's queue through the config events, so
	// skipped events (which carry no queue) can be matched to the queue.
	queueOf map[string]string
	// sel is the label selector; labelsOf follows each entry's labels the
	// same way (see selected).
	sel      events.Selector
	labelsOf map[string]map[string]string
}

// keep reports whether rec is returned. It must see every message of both
// streams in order: it keeps queueOf up to date.
func (f *filter) keep(rec Record) bool {
	inQueue := f.queue == ""
	if f.queue != "" {
		inQueue = f.concernsQueue(rec)
	}
	if !f.sel.Empty() && !f.selected(rec) {
		return false
	}
	if !f.since.IsZero() && rec.Time.Before(f.since) {
		return false
	}
	if !f.until.IsZero() && rec.Time.After(f.until) {
		return false
	}
	if !inQueue {
		return false
	}
	if len(f.types) > 0 && (rec.Event == nil || !f.typeMatches(rec.Event.Type)) {
		return false
	}
	return true
}

func (f *filter) typeMatches(typ string) bool {
	for _, p := range f.types {
		if MatchType(p, typ) {
			return true
		}
	}
	return false
}

// concernsQueue reports whether rec concerns f.queue: a recovery in it, a
// fire into it, a skip or a config event of an entry in it (or that just
// left it).
func (f *filter) concernsQueue(rec Record) bool {
	if rec.Config {
		id, _, ok := f.names.EntryFromHistorySubject(rec.Subject)
		if !ok {
			return false
		}
		prev := f.queueOf[id]
		if rec.FailPause || rec.Refused != nil {
			// A pause on failure changes no queue (a refused one nothing).
			return prev == f.queue
		}
		_, e, err := events.DecodeConfigEvent(rec.Data)
		if err != nil || e == nil {
			return prev == f.queue
		}
		q := e.Options.QueueName()
		if e.Removed {
			delete(f.queueOf, id)
		} else {
			f.queueOf[id] = q
		}
		return q == f.queue || prev == f.queue
	}
	if q, ok := f.names.QueueFromRecoverySubject(rec.Subject); ok {
		return q == f.queue
	}
	id, ok := f.names.EntryFromFireSubject(rec.Subject)
	if !ok {
		return false
	}
	if ev := rec.Event; ev != nil && ev.Type == events.TypeEntryFired {
		var fd events.Fired
		if ev.DecodeData(&fd) == nil && fd.Queue != "" {
			return fd.Queue == f.queue
		}
	}
	return f.queueOf[id] == f.queue
}

// selected reports whether rec concerns an entry whose labels match f.sel:
// a config event when the entry matched before or after it, a fired or
// skipped event when its entry matches as of the config events read so
// far. Recoveries name a queue, not an entry, and are left out. It keeps
// labelsOf up to date, so it must see every message in order.
func (f *filter) selected(rec Record) bool {
	if rec.Config {
		id, _, ok := f.names.EntryFromHistorySubject(rec.Subject)
		if !ok {
			return false
		}
		prev, had := f.labelsOf[id]
		if rec.FailPause || rec.Refused != nil {
			return had && f.sel.Matches(prev)
		}
		_, e, err := events.DecodeConfigEvent(rec.Data)
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
	id, ok := f.names.EntryFromFireSubject(rec.Subject)
	if !ok {
		return false
	}
	labels, known := f.labelsOf[id]
	return known && f.sel.Matches(labels)
}
