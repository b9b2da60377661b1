package contract

import (
	"fmt"
	"maps"
	"strings"
)

// The headers an entry with tick_headers (Entry.TickHeaders) adds to each
// task it fires, so that a handler reads the entry and the tick from
// task.Headers() instead of parsing the task id. Their names are part of
// the contract, like the ids in ids.go; docs/asynq-compat.md lists them.
const (
	// ReservedHeaderPrefix starts every header cronstream writes. On an
	// entry with tick_headers the task's own headers may not start with
	// it, in any case.
	ReservedHeaderPrefix = "cronstream-"
	// HeaderEntry holds the entry id.
	HeaderEntry = ReservedHeaderPrefix + "entry"
	// HeaderScheduledAt holds the tick, as the task id writes it (RFC 3339,
	// UTC, whole seconds): the scheduled or backfilled tick, the held tick
	// of a buffer-one or cancel-previous release, a trigger's moment.
	HeaderScheduledAt = ReservedHeaderPrefix + "scheduled-at"
	// HeaderTrigger holds a manual trigger's request id (triggers only).
	HeaderTrigger = ReservedHeaderPrefix + "trigger"
	// HeaderBackfill is "true" on a backfilled tick's task (backfills only).
	HeaderBackfill = ReservedHeaderPrefix + "backfill"
)

// TaskHeaders returns the headers of the task entry e fires for a tick
// (tickText as FormatTaskTick writes it): without TickHeaders the entry's
// own task headers, the map itself, not a copy; with it a new map of
// those, HeaderEntry and HeaderScheduledAt, and HeaderTrigger for a
// trigger (its request id, non-empty) or HeaderBackfill for a backfill.
func TaskHeaders(e Entry, tickText, trigger string, backfill bool) map[string]string {
	if !e.TickHeaders {
		return e.Task.Headers
	}
	h := make(map[string]string, len(e.Task.Headers)+3)
	maps.Copy(h, e.Task.Headers)
	h[HeaderEntry] = e.ID
	h[HeaderScheduledAt] = tickText
	switch {
	case trigger != "":
		h[HeaderTrigger] = trigger
	case backfill:
		h[HeaderBackfill] = "true"
	}
	return h
}

// validateTickHeaders refuses, on an entry with tick_headers, task headers
// whose names the added ones could collide with. Entries without the
// option keep any header name, as they always could: an entry written by
// an earlier build stays valid.
func (n Entry) validateTickHeaders() []error {
	if !n.TickHeaders {
		return nil
	}
	var errs []error
	for k := range n.Task.Headers {
		if len(k) >= len(ReservedHeaderPrefix) && strings.EqualFold(k[:len(ReservedHeaderPrefix)], ReservedHeaderPrefix) {
			errs = append(errs, &FieldError{Field: "task.headers", Value: shorten(k),
				Reason: fmt.Sprintf("header names starting with %q are reserved for the headers tick_headers adds (%s, %s, %s, %s)",
					ReservedHeaderPrefix, HeaderEntry, HeaderScheduledAt, HeaderTrigger, HeaderBackfill)})
		}
	}
	return errs
}
