package schedule

import (
	"strings"
	"time"

	"github.com/cronstream/cronstream/contract"
)

// ParseActivityID reads entry and last tick from a fired or skipped event
// id; ok is false for other ids (triggers, recoveries).
func ParseActivityID(id string) (entry string, tick time.Time, ok bool) {
	// Most records a replica relays in a mass recovery are recoveries':
	// their kind alone says no.
	if kind, _, _ := strings.Cut(id, ":"); contract.EventKind(kind) != contract.EventIDFired && contract.EventKind(kind) != contract.EventIDSkipped {
		return "", time.Time{}, false
	}
	f, ok := contract.ParseEventID(id)
	if !ok || (f.Kind != contract.EventIDFired && f.Kind != contract.EventIDSkipped) || f.IsTrigger() {
		return "", time.Time{}, false // not a tick's record: a trigger's, a recovery's
	}
	return f.Entry, f.Last, true
}
