// Package events is cronstream's event vocabulary and the write side of the
// configuration stream.
//
// It owns the CloudEvents 1.0 envelope, every event type and its data (the
// JSON field names are the contract with publishers and audit readers), the
// Entry state with its validation, the subject and stream names derived from
// a prefix, and the client that publishes configuration changes with
// per-entry optimistic concurrency.
//
// It never talks to Redis and imports no other cronstream package. Readers
// are tolerant: unknown fields and unknown event types are not errors, and
// malformed input is an error value, never a panic.
package events
