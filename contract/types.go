package contract

import (
	"slices"
	"strings"
)

// TypeInfo describes one event type.
type TypeInfo struct {
	Type   string // full CloudEvents type, e.g. cronstream.entry.fired
	Stream string // "config" or "activity"
	Doc    string // what the event records, in a few words
}

// Types lists every event type cronstream writes. Tools that name types
// (audit's short names, its help) read this list, so a new type is added
// here beside its constant.
var Types = []TypeInfo{
	{TypeEntryRegistered, "config", "entry created (data: its full state)"},
	{TypeEntryUpdated, "config", "entry changed (data: its full state)"},
	{TypeEntryPaused, "config", "entry paused, with the note"},
	{TypeEntryResumed, "config", "entry resumed"},
	{TypeEntryRemoved, "config", "entry removed (data: its last state)"},
	{TypeEntryFired, "activity", "a tick became an asynq task (Fired)"},
	{TypeEntrySkipped, "activity", "ticks skipped: missed, overlap, unique or excluded (Skipped)"},
	{TypeTaskRetried, "activity", "a task whose worker died was retried (TaskRecovered)"},
	{TypeTaskArchived, "activity", "a task whose worker died was archived (TaskRecovered)"},
	{TypeAggregationReclaimed, "activity", "a stale aggregation set went back to its group"},
	{TypeTaskCancelled, "activity", "overlap cancel-previous deleted or cancelled an entry's previous task (TaskCancelled)"},
	{TypeTaskLost, "activity", "Redis lost the tasks of fires the stream records, found when their watermark was restored (TasksLost)"},
}

// DisplayType is the name people read for an event type: without the
// "cronstream." of the types this package defines, and a gated config type
// (GatedType) as its plain type, so "entry.paused" is what a pause
// shows as whichever version carried it. The version stays in the event
// (JSON output keeps the type as stored); other types show as they are.
func DisplayType(t string) string {
	if known := ConfigKind(t); slices.ContainsFunc(Types, func(ti TypeInfo) bool { return ti.Type == known }) {
		if rest, ok := strings.CutPrefix(known, "cronstream."); ok {
			return rest
		}
	}
	return t
}

// ShortType is a type's last dot-separated part ("fired" for
// cronstream.entry.fired); each is unique among Types. A gated config type
// has its plain type's short name.
func ShortType(t string) string {
	t = ConfigKind(t)
	return t[strings.LastIndex(t, ".")+1:]
}
