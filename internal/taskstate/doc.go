// Package taskstate owns cronstream's asynq-compatible task state in Redis: the
// key schema, the asynq protobuf codecs (TaskMessage, SchedulerEntry,
// SchedulerEnqueueEvent), and the atomic Lua scripts that create, recover and
// reclaim tasks together with the outbox records that describe those changes.
//
// It is the only package of cronstream that speaks Redis. Every byte it writes
// is what github.com/hibiken/asynq v0.26.0 writes (see
// docs/asynq-compat.md), so real asynq workers, its Inspector and its
// CLI read cronstream's state as their own.
//
// Rules the package keeps:
//
//   - Every script touches the keys of exactly one queue, all carrying the
//     queue's hash tag {<queue>}, so each script runs in one Redis Cluster slot.
//     Global keys (asynq:queues, asynq:schedulers, …) are only ever used with
//     plain commands beside a script.
//   - A state change and the outbox record describing it are written by the
//     same script, so they are one fact.
//   - Bad input from Redis (an undecodable message, a missing hash, invalid
//     UTF-8) is reported and skipped, never fatal and never a panic.
//
// It never talks to NATS, never decides policy (retry delays, archive versus
// retry, catch-up) and never starts goroutines of its own: callers decide, this
// package applies the decision atomically.
package taskstate
