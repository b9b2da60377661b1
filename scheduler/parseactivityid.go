package scheduler

import (
	"strings"
	"time"

	"github.com/cronstream/cronstream/events"
)

// ParseActivityID reads entry and last tick from a fired or skipped event
// id; ok is false for other ids (triggers, recoveries).
func ParseActivityID(id string) (entry string, tick time.Time, ok bool) {
	// Most records a replica relays in a mass recovery are recoveries':
	// their kind alone says no.
	if kind, _, _ := strings.Cut(id, ":"); events.EventKind(kind) != events.EventIDFired && events.EventKind(kind) != events.EventIDSkipped {
		return "", time.Time{}, false
	}
	f, ok := events.ParseEventID(id)
	if !ok || (f.Kind != events.EventIDFired && f.Kind != events.EventIDSkipped) || f.IsTrigger() {
		return "", time.Time{}, false // not a tick's record: a trigger's, a recovery's
	}
	return f.Entry, f.Last, true
}
