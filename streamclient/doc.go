// Package streamclient is cronstream's client of its JetStream streams:
// creating and reconciling the config and activity streams (EnsureStreams,
// SyncStreams, the write routes of a stream, the activity stream's max
// age) and the config client (NewClient) that publishes configuration
// changes with per-entry optimistic concurrency, reads entries and their
// history back, and publishes and checks fail-pause requests.
//
// It speaks NATS and never Redis; the events it writes and reads are those
// of package contract. Programs may import it directly, or use the same
// names through package events.
package streamclient
