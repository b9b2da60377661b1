// Package contract is cronstream's event contract: what publishers, audit
// readers and every replica agree on, with no connection to anything.
//
// It owns the CloudEvents 1.0 envelope, every event type and its data (the
// JSON field names are the contract with publishers and audit readers), the
// Entry state with its validation, cron parsing (robfig/cron and
// cronstream's own calendar forms), labels and selectors, the subject and
// stream names derived from a prefix, the ids of events and tasks, the
// shard of an entry, the task headers tick_headers adds, and the decoding
// and check of a fail-pause request.
//
// It imports neither NATS nor Redis, nor any other cronstream package
// (TestLayers), so the Redis side of a replica and the views can use it
// without a NATS client. Readers are tolerant: unknown fields and unknown
// event types are not errors, and malformed input is an error value, never
// a panic. Programs may import it directly, or use the same names through
// package events.
package contract
